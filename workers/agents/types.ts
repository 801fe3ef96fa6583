// The contract between the agent runtime and an agent: the built-in demo agent, an agent module
// named by AGENT_MODULE, or the remote A2A bridge all implement AgentHandler.
import type { Message, MessagePart, Task } from '../../domain/shapes/task.ts';
import type { InvokeResult } from '../../domain/shapes/bridge.ts';
import type { Logger } from '../../domain/logger.ts';
import type { Artifact } from './agent-output.ts';

/** Text, parts, or parts with the message's metadata. */
export type Reply = string | MessagePart[] | { parts: MessagePart[]; metadata?: Record<string, unknown> };

/** Internal to the built-in agents: which take of the run's job this is (the task's run_attempt while it holds the task). */
export const RUN_TAKE: unique symbol = Symbol('taskbridge run take');

export interface AgentContext {
  /** @internal */
  readonly [RUN_TAKE]?: number;
  task: Task;
  /** Messages of the task, oldest first, including `message`. */
  history: Message[];
  /** The user message this run answers. */
  message: Message;
  /** Fires when the task is canceled or the worker shuts down. */
  signal: AbortSignal;
  /** Adds an agent message to the task now (progress while working). Parts in the task API's shape (`type: 'text-part'`, ...). */
  reply(reply: Reply): Promise<Message>;
  /** Records progress: the task stays working, with an optional progress message. Other states are the run's return value. */
  setStatus(status: 'working', message?: Reply): Promise<void>;
  /** Stores an artifact on the task (A2A Artifact shape: parts with `kind`); the same artifactId replaces, or with `append` extends, an earlier one. Resolves to its artifactId (minted when not given); refused (413) past TASK_ARTIFACTS_MAX_BYTES for the task. */
  emitArtifact(artifact: Artifact): Promise<string>;
  /** Decrypts a stored secret by key. */
  readSecret(key: string): Promise<string>;
  /**
   * Invokes a function enabled on a bridge provider instance, as POST .../invoke does: resolves to
   * `{type: 'success', ...output}` or `{type: 'error', message}` (the provider refused); throws for
   * bad params, a function not enabled, an instance not active or an unreachable provider.
   * `idempotencyKey`: sent to providers that honour one (Stripe), so that a retried run does not act
   * twice; without one, the call's key is `taskbridge-run:<task id>:<message.id>:<n>` for the run's
   * nth call, the same on every try of the run.
   */
  invokeFunction(providerInstanceId: string, functionTypeId: string, params: Record<string, unknown>, options?: { idempotencyKey?: string }): Promise<InvokeResult>;
  /** A logger tagged with the task id (pino). */
  log: Logger;
}

export interface AgentResult {
  /** Final state of this run; defaults to completed. */
  status?: 'completed' | 'input-required' | 'auth-required' | 'failed' | 'rejected' | 'canceled';
  /** Message stored with the final status. */
  message?: Reply;
}

export type AgentHandler = (ctx: AgentContext) => Promise<AgentResult | void>;

/** A housekeeping pass: `stopping` is aborted once the worker stops; a pass that loops returns at its next boundary. */
export type HousekeepingPass = (stopping: AbortSignal) => Promise<unknown>;

/** What a worker runs: the handler, and passes of its own for the worker's housekeeping (by name). */
export interface Agent {
  handler: AgentHandler;
  housekeeping?: Record<string, HousekeepingPass>;
  /** Of those, the ones a worker runs soon after a task ends with no run of it in the worker. */
  afterCancel?: string[];
}

export function textOf(message: Message): string {
  return message.parts.map((p) => (p.type === 'text-part' ? p.text : '')).filter(Boolean).join('\n');
}

// Whether the sender of `message` takes a reply of media type `type` (as `text/plain`): its
// `accepted_output_modes` name it, a wildcard (`text/*`, `*/*`) or its bare top-level type (`text`,
// as some A2A clients write it), parameters aside. A sender that named none takes any.
export function acceptsOutput(message: Message, type: string): boolean {
  const modes = message.accepted_output_modes;
  if (!modes?.length) return true;
  const wanted = type.toLowerCase();
  const top = wanted.split('/')[0];
  return modes.some((m) => {
    const mode = m.split(';')[0].trim().toLowerCase();
    return mode === wanted || mode === '*/*' || mode === `${top}/*` || mode === top;
  });
}

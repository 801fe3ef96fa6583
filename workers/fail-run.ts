// A run's task failed when the run cannot go on: by the run after its last attempt, or for a run
// whose job ended without that (workers/main.ts on a job stalled too often, recover-agent-runs.ts).
import type { Services } from '../domain/services.ts';
import { changeStatusIf, TASK_CANCELED } from '../domain/tasks.ts';
import { runEndsFrom } from '../domain/task-states.ts';
import { inStatement, type UnitOfWork } from '../domain/unit-of-work.ts';
import type { StatusChange } from '../db/tasks.ts';
import { agentMessage } from './agents/agent-output.ts';
import { storableText } from '../domain/storable-json.ts';
import { publicReason } from '../domain/errors.ts';

// Why a run failed often carries an agent's error message: one with a NUL character made the write
// fail (the task stayed working), one of megabytes went whole into a task's status message.
const FAILURE_REASON_MAX_CHARS = 1000;
/** `why` cut to FAILURE_REASON_MAX_CHARS, an ellipsis marking the cut; secrets are masked before, as a cut may split one. */
export const cutReason = (why: string): string => (why.length > FAILURE_REASON_MAX_CHARS ? `${why.slice(0, FAILURE_REASON_MAX_CHARS)}…` : why);
const storableWhy = (why: string) => storableText(cutReason(why));

// What a failed run says went wrong: the error's message, or what the agent threw when that was no
// Error (a string as it is; null, an object: as JSON, not "[object Object]"); an Error with no message
// by its name.
export function failureReason(err: unknown): string {
  if (typeof err === 'string') return err;
  if (typeof (err as { message?: unknown })?.message === 'string') {
    return publicReason(err) || `the agent threw ${(err as Error).name || 'an error'} with no message`;
  }
  return `the agent threw ${thrownValue(err)}`;
}

/** A thrown value that is no Error, in words: as JSON where JSON can show it. */
export function thrownValue(thrown: unknown): string {
  if (typeof thrown === 'bigint') return `the BigInt ${thrown}`;
  if (typeof thrown === 'symbol') return `a symbol (${thrown.description ?? 'no description'})`;
  if (typeof thrown === 'function') return 'a function';
  if (thrown === undefined) return 'undefined';
  try {
    // A toJSON giving undefined writes nothing.
    return JSON.stringify(thrown) ?? 'an object JSON shows as nothing';
  } catch {
    return 'an object JSON cannot show (a cycle or a BigInt in it)';
  }
}

/** Fails the task, if it has not ended (nor been taken from the run, as `run` asks), with an agent status message saying why; null when it had. */
export const failRun = (uow: UnitOfWork, taskId: string, why: string, run?: Pick<StatusChange, 'run' | 'runAttempt' | 'lostRun'>) =>
  changeStatusIf(uow, taskId, 'failed', runEndsFrom('failed'), agentMessage(storableWhy(why), 'message'), run);

/** Fails the task of a run (its message) whose job ended without the run's own final handling; false when the task had ended already or another run has it. */
export async function failLostRun(services: Services, taskId: string, messageId: string, why: string): Promise<boolean> {
  return inStatement(services, async (uow) => {
    const failed = await failRun(uow, taskId, `The agent run was lost: ${why}`, { lostRun: messageId });
    // A job failed for stalling may still be running on a worker whose event loop was blocked: its run stops as on a cancel.
    if (failed) uow.publish(TASK_CANCELED, { task_id: taskId });
    return failed !== null;
  });
}

// The A2A v0.3 methods over our task domain. Params arrive validated (params.ts); everything a
// client can name is checked here before it reaches SQL, so no input can become a 500.
import { randomUUID } from 'node:crypto';
import { stepper } from '../let-go.ts';
import type { AgentCard, Message as A2AMessage, Task as A2ATask, TaskPushNotificationConfig } from '@a2a-js/sdk';
import type { Services } from '../services.ts';
import * as tasksRepo from '../../db/tasks.ts';
import { lastTimelineSeq } from '../../db/timeline-views.ts';
import { addMessageIn, checkFirstMessage, createTask, createTaskIn, openedTaskState, TaskBusy, TaskEnded, updateStatus, type Retried } from '../tasks.ts';
import { inTransaction } from '../unit-of-work.ts';
import { Conflict } from '../errors.ts';
import { isInterrupted, isTerminal, type TaskState } from '../task-states.ts';
import type { TaskFollow, TaskWaiter } from '../task-waiter.ts';
import * as push from '../push-config.ts';
import { agentCard } from './agent-card.ts';
import { A2AError, JSONRPC, TaskNotCancelableError, TaskNotFoundError, invalidParams, invalidRequest } from './errors.ts';
import { followTimeline, isFinalState, statusEvent, type StreamEvent } from './events.ts';
import { fromA2AMessage, toA2ATask } from './mapping.ts';
import { loadA2ATask } from './task-view.ts';
import type { DeletePushConfigParams, GetPushConfigParams, MessageSendParams, SetPushConfigParams, TaskIdParams, TaskQueryParams } from './params.ts';
import { inSnapshot } from '../../db/snapshot.ts';

export interface A2ACall {
  services: Services;
  waiter: TaskWaiter;
  /** Aborts when the client goes away: waiting stops, the task carries on. */
  signal: AbortSignal;
}

export type TaskStream = AsyncGenerator<A2ATask | StreamEvent>;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// Our task ids are UUIDs: any other id names no task (and must not reach a uuid column).
function taskIdOf(id: string): string {
  if (!UUID.test(id)) throw new TaskNotFoundError(id);
  return id.toLowerCase();
}

async function requireTaskRow(call: A2ACall, id: string): Promise<tasksRepo.TaskRow> {
  const row = await tasksRepo.getTask(call.services.db, taskIdOf(id));
  if (!row) throw new TaskNotFoundError(id);
  return row;
}

function requirePushSupport(call: A2ACall): void {
  if (!call.services.cfg.A2A_PUSH_NOTIFICATIONS) throw new A2AError(JSONRPC.PUSH_NOT_SUPPORTED, 'Push notifications are not supported by this agent');
}

export function requireStreaming(call: A2ACall, method: string): void {
  if (!call.services.cfg.A2A_STREAMING) throw new A2AError(JSONRPC.UNSUPPORTED_OPERATION, `Unsupported operation: ${method} needs streaming, which this agent does not offer`);
}

// Stores the message (new task, or continuation of `message.taskId`) and reports the task, the
// timeline seq a follower continues after (0 for a new task unless `needSeq`: one statement less)
// and the task's view as of that seq: always for a new task (built from the rows it wrote), for a
// continued one only with `snapshot` (one more read).
interface Accepted {
  id: string;
  contextId: string;
  seq: number;
  snapshot?: A2ATask;
  /** A retried send (domain/tasks.ts): nothing was stored; seq is the task's newest. */
  retried?: Retried;
}

interface AcceptOptions { newId: string; needSeq: boolean; snapshot?: boolean }
async function accept(call: A2ACall, params: MessageSendParams, opts: AcceptOptions & { snapshot: true }): Promise<Accepted & { snapshot: A2ATask }>;
async function accept(call: A2ACall, params: MessageSendParams, opts: AcceptOptions): Promise<Accepted>;
async function accept(call: A2ACall, params: MessageSendParams, opts: AcceptOptions): Promise<Accepted> {
  const { services } = call;
  // validated: exactly one of bytes or uri. The modes the client accepts go to the agent with the message.
  const modes = params.configuration?.acceptedOutputModes;
  const message = { ...fromA2AMessage(params.message as A2AMessage), ...(modes?.length ? { accepted_output_modes: modes } : {}) };
  const pushConfig = params.configuration?.pushNotificationConfig;
  if (pushConfig) requirePushSupport(call);

  if (params.message.taskId !== undefined) {
    const row = await requireTaskRow(call, params.message.taskId);
    if (params.message.contextId !== undefined && params.message.contextId.toLowerCase() !== row.context_id) {
      throw invalidParams(`Invalid params: params.message.contextId '${params.message.contextId}' is not the context of task ${row.id}`, { taskId: row.id, contextId: row.context_id });
    }
    // Not for a task already ended: its config would never be stored (an error or a retry), and a
    // host lookup would only delay the answer.
    if (pushConfig && !isTerminal(row.status)) await push.checkPushConfig(pushConfig, services.cfg);
    return inTransaction(services, async (uow) => {
      let added;
      try {
        added = await addMessageIn(uow, row.id, message, services.cfg.TASK_MESSAGES_MAX_BYTES, {
          onlyAsAnswer: true,
          beforeAppend: pushConfig && (() => push.storeCheckedPushConfig(uow.trx, row.id, pushConfig, services.cfg)),
        });
      } catch (err) {
        if (err instanceof TaskEnded) {
          throw invalidRequest(`Task ${row.id} is ${err.state}: a terminal task accepts no more messages`, { taskId: row.id, state: err.state });
        }
        if (err instanceof TaskBusy) {
          throw invalidRequest(`${err.message}: follow it (tasks/resubscribe, tasks/get) and send when it asks for input`, { taskId: row.id, state: err.state });
        }
        throw err;
      }
      // Read before commit: the run this message starts cannot change the task before the snapshot.
      const snapshot = opts.snapshot ? await loadA2ATask(uow.trx, row.id, params.configuration?.historyLength) : undefined;
      return { id: row.id, contextId: row.context_id, seq: added.seq, snapshot, retried: added.retried };
    });
  }

  const req = { context_id: params.message.contextId?.toLowerCase(), message };
  const max = services.cfg.TASK_MESSAGES_MAX_BYTES;
  // Before the task is written (a retry's config is checked too, and no host lookup holds the
  // transaction open), after what needs no lookup.
  if (pushConfig) {
    checkFirstMessage(message, max);
    await push.checkPushConfig(pushConfig, services.cfg);
  }
  // The hot path (non-blocking intake): one statement, no re-read.
  const created = !pushConfig && !opts.needSeq
    ? await createTask(services, req, opts.newId)
    : await inTransaction(services, async (uow) => {
      const c = await createTaskIn(uow, req, max, opts.newId);
      // A retry sets nothing: the task keeps what its first send configured.
      if (pushConfig && !c.retry) await push.storeCheckedPushConfigOfNewTask(uow, opts.newId, pushConfig, services.cfg, c.lastSeq);
      return c;
    });
  const { task } = created;
  if (!created.retry) {
    return { id: task.id, contextId: task.context_id, seq: created.lastSeq, snapshot: toA2ATask(task, { messages: [created.message], historyLength: params.configuration?.historyLength }) };
  }
  // The task a retried send found, as it stands now: its view and the item a follower continues
  // after, read in one snapshot so that no update is both in the view and followed.
  const state = await inSnapshot(services.db, async (trx) => {
    const s = await openedTaskState(trx, task.id, created.message);
    return s && { ...s, snapshot: await loadA2ATask(trx, task.id, params.configuration?.historyLength) };
  });
  if (!state) throw new TaskNotFoundError(task.id);
  return { id: task.id, contextId: task.context_id, seq: state.seq, snapshot: state.snapshot, retried: state.retried };
}

// A retried send of a new task is answered with the task its first copy created, not the id minted for
// it: followed from the task's newest timeline item (accept's seq), so what was followed before is
// not needed.
async function refollow(call: A2ACall, follow: TaskFollow, mintedId: string, taskId: string): Promise<TaskFollow> {
  if (taskId === mintedId) return follow;
  follow.close();
  return call.waiter.follow(taskId);
}

export async function sendMessage(call: A2ACall, params: MessageSendParams): Promise<A2ATask> {
  const { services, waiter } = call;
  const historyLength = params.configuration?.historyLength;
  const id = params.message.taskId !== undefined ? taskIdOf(params.message.taskId) : randomUUID();
  if (params.configuration?.blocking === false) {
    const accepted = await accept(call, params, { newId: id, needSeq: false });
    return accepted.snapshot ?? loadA2ATask(services.db, accepted.id, historyLength);
  }
  // Blocking: follow the task until it is terminal or waits for input, or the bounded wait ends.
  // An explicit timer: on Node 20 an AbortSignal.timeout held only by AbortSignal.any can be
  // garbage-collected and never fire (nodejs/node#57736).
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), services.cfg.A2A_BLOCKING_TIMEOUT_MS);
  const deadline = AbortSignal.any([call.signal, timeout.signal]);
  let follow = await waiter.follow(id);
  try {
    // A new task is followed from its start: its first rows are read once, nothing is lost.
    const accepted = await accept(call, params, { newId: id, needSeq: false });
    follow = await refollow(call, follow, id, accepted.id);
    // A retry of a send whose turn has ended since (the task settled, and may have moved on to a
    // later message's run) has nothing more to wait for.
    if (!accepted.retried?.turnEnded) {
      for await (const _event of followTimeline(services.db, follow, accepted, accepted.seq, deadline)) { /* drain to the final event */ }
    }
    return await loadA2ATask(services.db, accepted.id, historyLength);
  } finally {
    clearTimeout(timer);
    follow.close();
  }
}

// The streaming methods: dispatch (jsonrpc.ts) has checked that streaming is on (requireStreaming).
export async function streamMessage(call: A2ACall, params: MessageSendParams): Promise<TaskStream> {
  const { waiter } = call;
  const id = params.message.taskId !== undefined ? taskIdOf(params.message.taskId) : randomUUID();
  let follow = await waiter.follow(id);
  try {
    const accepted = await accept(call, params, { newId: id, needSeq: true, snapshot: true });
    follow = await refollow(call, follow, id, accepted.id);
    // A retry of a send the task has settled since ends as a resubscribe to it would.
    const { retried } = accepted;
    return taskStream(call, follow, { id: accepted.id, contextId: accepted.contextId }, accepted.snapshot, accepted.seq, retried?.settled ? retried.status : undefined);
  } catch (err) {
    follow.close();
    throw err;
  }
}

export async function resubscribe(call: A2ACall, params: TaskIdParams): Promise<TaskStream> {
  const { services, waiter } = call;
  const id = taskIdOf(params.id);
  const follow = await waiter.follow(id);
  try {
    // The snapshot and the seq it covers are read in one consistent view. A task waiting for input
    // that a message has answered is not settled: the answer's run is owed, and the stream follows it
    // (a client told to follow the task and send when it asks for input would be told it asks now).
    const { row, snapshot, seq, settled } = await inSnapshot(services.db, async (trx) => {
      const r = await tasksRepo.getTask(trx, id);
      if (!r) throw new TaskNotFoundError(params.id);
      const answered = isInterrupted(r.status) && await tasksRepo.runOwed(trx, id);
      return { row: r, snapshot: await loadA2ATask(trx, id), seq: await lastTimelineSeq(trx, id), settled: isFinalState(r.status) && !answered };
    });
    return taskStream(call, follow, { id, contextId: row.context_id }, snapshot, seq, settled ? row.status : undefined);
  } catch (err) {
    follow.close();
    throw err;
  }
}

// A task's stream: the task as it stands, then, for one settled in `settledAs`, one final status
// event; otherwise its timeline followed after `seq`. Closes `follow` when it ends.
// The snapshot is let go of once handed over: a stream may stay open for as long as its task runs,
// and each holding its snapshot (up to 8 MiB of history and 16 MiB of artifacts), a key's open
// streams on a large task could hold gigabytes of the API's memory.
function taskStream(call: A2ACall, follow: TaskFollow, task: { id: string; contextId: string }, snapshot: A2ATask, seq: number, settledAs?: TaskState): TaskStream {
  const settled = settledAs && statusEvent(task.id, task.contextId, settledAs, snapshot.status.timestamp!, snapshot.status.message);
  let first: A2ATask | undefined = snapshot;
  const handOver = () => {
    const shown = first!;
    first = undefined;
    return shown;
  };
  return (async function* () {
    try {
      yield handOver();
      if (settled) {
        yield settled;
        return;
      }
      const events = stepper(followTimeline(call.services.db, follow, task, seq, call.signal));
      try {
        while (await events.more()) yield events.take();
      } finally {
        await events.done();
      }
    } finally {
      follow.close();
    }
  })();
}

export async function getTask(call: A2ACall, params: TaskQueryParams): Promise<A2ATask> {
  return loadA2ATask(call.services.db, taskIdOf(params.id), params.historyLength);
}

export async function cancelTask(call: A2ACall, params: TaskIdParams): Promise<A2ATask> {
  const row = await requireTaskRow(call, params.id);
  if (isTerminal(row.status)) throw new TaskNotCancelableError(row.id, row.status);
  try {
    // Publishes TASK_CANCELED: the worker running the agent aborts its signal.
    await updateStatus(call.services, row.id, 'canceled');
  } catch (err) {
    if (!(err instanceof Conflict)) throw err;
    const now = await requireTaskRow(call, row.id);
    throw new TaskNotCancelableError(row.id, now.status);
  }
  return loadA2ATask(call.services.db, row.id);
}

function toA2APushConfig(c: push.PushConfig): TaskPushNotificationConfig {
  return { taskId: c.task_id, pushNotificationConfig: { id: c.id, url: c.url, ...(c.authentication ? { authentication: c.authentication } : {}) } };
}

export async function setPushConfig(call: A2ACall, params: SetPushConfigParams): Promise<TaskPushNotificationConfig> {
  requirePushSupport(call);
  return toA2APushConfig(await push.setPushConfig(call.services.db, taskIdOf(params.taskId), params.pushNotificationConfig, call.services.cfg));
}

export async function getPushConfig(call: A2ACall, params: GetPushConfigParams): Promise<TaskPushNotificationConfig> {
  requirePushSupport(call);
  return toA2APushConfig(await push.getPushConfig(call.services.db, taskIdOf(params.id), params.pushNotificationConfigId));
}

export async function listPushConfigs(call: A2ACall, params: TaskIdParams): Promise<TaskPushNotificationConfig[]> {
  requirePushSupport(call);
  return (await push.listPushConfigs(call.services.db, taskIdOf(params.id))).map(toA2APushConfig);
}

export async function deletePushConfig(call: A2ACall, params: DeletePushConfigParams): Promise<null> {
  requirePushSupport(call);
  await push.deletePushConfig(call.services.db, taskIdOf(params.id), params.pushNotificationConfigId);
  return null;
}

export async function extendedCard(call: A2ACall): Promise<AgentCard> {
  return agentCard(call.services.cfg, { extended: true });
}

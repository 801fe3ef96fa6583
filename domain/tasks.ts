// Task rules: creation, messages, status transitions and their timeline entries. Used by the
// REST API, the A2A handler and the agent runtime alike.
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import * as tasks from '../db/tasks.ts';
import type { StatusChange } from '../db/tasks.ts';
import * as messages from '../db/messages.ts';
import * as timeline from '../db/timeline.ts';
import { artifactBytes, lastTimelineSeq } from '../db/timeline-views.ts';
import type { CreateMessageRequest, CreateTaskRequest, Message, Task, TimelineItem } from './shapes/task.ts';
import { Conflict, NotFound, PayloadTooLarge } from './errors.ts';
import { assertProgressMessage, assertTransition, INTERRUPTED_STATES, isInterrupted, isTerminal, RUN_STARTS_FROM, TERMINAL_STATES, type TaskState } from './task-states.ts';
import { afterCommit, inTransaction, type UnitOfWork, type UowServices } from './unit-of-work.ts';
import { newOutboxRow, type OutboxRow } from '../db/outbox.ts';
import { sameAsStored } from './storable-json.ts';
import type { Services } from './services.ts';

export const TASK_EVENTS = 'task-events';
export const TASK_CANCELED = 'task-canceled';
export const MESSAGES_IN_TASK = 100;

type Tx = Knex | Knex.Transaction;

async function appendTimeline(uow: UnitOfWork, taskId: string, payload: TimelineItem['event_payload'], at: Date): Promise<timeline.TimelineRow> {
  const row = await timeline.insertTimelineItem(uow.trx, { id: randomUUID(), task_id: taskId, event_payload: payload, created_at: at.toISOString() });
  uow.publish(TASK_EVENTS, { task_id: taskId, seq: row.seq });
  return row;
}

// A new message of a task, as it is stored and shown.
function newMessage(taskId: string, req: CreateMessageRequest, createdAt: string): Message {
  return {
    id: randomUUID(), ...(req.client_message_id !== undefined ? { client_message_id: req.client_message_id } : {}), task_id: taskId,
    role: req.role, parts: req.parts, reference_task_ids: (req.reference_task_ids ?? []).map((r) => r.toLowerCase()),
    ...(req.extensions?.length ? { extensions: req.extensions } : {}),
    ...(req.accepted_output_modes?.length ? { accepted_output_modes: req.accepted_output_modes } : {}),
    metadata: req.metadata ?? {}, created_at: createdAt,
  };
}

// A task's messages are read back together (a page of up to 1,000, an A2A task's history, an agent
// run's), and its A2A view reads back every artifact update: a task may hold at most
// TASK_MESSAGES_MAX_BYTES of messages' parts and TASK_ARTIFACTS_MAX_BYTES of artifact updates, or a
// client or an agent (a remote one too) could grow it until reading it fails. A message or update
// that would take it over is refused. The counts are kept on the task row.
const LIMITS = {
  message_bytes: { of: 'messages', item: 'this message', setting: 'TASK_MESSAGES_MAX_BYTES' },
  artifact_bytes: { of: 'artifacts', item: 'this artifact update', setting: 'TASK_ARTIFACTS_MAX_BYTES' },
} as const;

export function checkRoom(taskId: string, count: tasks.ContentCount, held: number, adding: number, maxBytes: number): void {
  if (held + adding <= maxBytes) return;
  const { of, item, setting } = LIMITS[count];
  throw new PayloadTooLarge(`Task '${taskId}' holds ${held} bytes of ${of}; ${item} (${adding} bytes) would take it over the ${maxBytes} a task may hold (${setting})`, { held, adding, limit: maxBytes });
}

// What a task the caller holds locked holds of `count`; one from before migration 0016 is counted now.
async function heldBytes(trx: Tx, locked: tasks.TaskRow, count: tasks.ContentCount): Promise<number> {
  if (locked[count] != null) return Number(locked[count]);
  const held = count === 'message_bytes' ? await messages.messageBytes(trx, locked.id) : await artifactBytes(trx, locked.id);
  await tasks.setContentBytes(trx, locked.id, count, held);
  locked[count] = held;
  return held;
}

// Refuses a status message that would take a task the caller holds locked over maxBytes (the
// status-change statement adds it to the count).
async function checkMessageRoom(trx: Tx, locked: tasks.TaskRow, req: Pick<CreateMessageRequest, 'parts' | 'metadata' | 'extensions' | 'accepted_output_modes'>, maxBytes: number): Promise<void> {
  checkRoom(locked.id, 'message_bytes', await heldBytes(trx, locked, 'message_bytes'), tasks.messageBytes(req), maxBytes);
}

// Takes room for `adding` bytes, added at `at`, in a task the caller holds locked, or refuses them: the
// count is written in the caller's transaction, with the row they go into.
async function takeRoom(trx: Tx, locked: tasks.TaskRow, count: tasks.ContentCount, adding: number, maxBytes: number, at: Date): Promise<void> {
  const held = await heldBytes(trx, locked, count);
  checkRoom(locked.id, count, held, adding, maxBytes);
  await tasks.addContent(trx, locked.id, count, held + adding, at);
  locked[count] = held + adding;
}

// A message of a task the caller holds locked, within what the task may hold.
export async function appendMessage(uow: UnitOfWork, locked: tasks.TaskRow, req: CreateMessageRequest, maxBytes: number, at = new Date()) {
  await takeRoom(uow.trx, locked, 'message_bytes', tasks.messageBytes(req), maxBytes, at);
  const message = await messages.insertMessage(uow.trx, newMessage(locked.id, req, at.toISOString()));
  const { seq: _seq, ...plain } = message;
  const item = await appendTimeline(uow, locked.id, { type: 'message', message: plain as Message }, at);
  return { message: plain as Message, seq: message.seq, timelineItem: item };
}

// An artifact update of a task the caller holds locked, within what the task may hold.
export async function appendArtifact(uow: UnitOfWork, locked: tasks.TaskRow, artifact: Record<string, unknown>, maxBytes: number, at = new Date()) {
  await takeRoom(uow.trx, locked, 'artifact_bytes', tasks.contentBytes(artifact), maxBytes, at);
  return appendTimeline(uow, locked.id, { type: 'artifact-update', artifact }, at);
}

async function lockTask(trx: Tx, id: string): Promise<tasks.TaskRow> {
  const task = await tasks.getTask(trx, id, true);
  if (!task) throw new NotFound('task', id);
  return task;
}

// An agent run's job: its id is the trigger message id, one run per message, findable by recovery.
const runJob = (taskId: string, messageId: string) => ['agent-tasks', 'run', { task_id: taskId, message_id: messageId }, { jobId: messageId }] as const;

export async function enqueueRun(uow: UnitOfWork, taskId: string, messageId: string): Promise<void> {
  await uow.enqueue(...runJob(taskId, messageId));
}

// Every status change of every task passes here: one statement that moves the task to `to`
// only if it is still in one of `from` (and as `only` asks: for a run's change, `run` or `lostRun`;
// `maxMessageBytes`), writes the status message and the timeline items. Returns null when it was not
// (nothing was written).
export async function changeStatusIf(
  uow: UnitOfWork, taskId: string, to: TaskState, from: readonly TaskState[], message?: CreateMessageRequest,
  only?: Pick<StatusChange, 'run' | 'runAttempt' | 'lostRun' | 'maxMessageBytes'>,
): Promise<Task | null> {
  const at = new Date();
  const iso = at.toISOString();
  const msg: Message | undefined = message && newMessage(taskId, message, iso);
  const items: TimelineItem[] = [];
  if (msg) items.push({ id: randomUUID(), task_id: taskId, created_at: iso, event_payload: { type: 'message', message: msg } });
  items.push({ id: randomUUID(), task_id: taskId, created_at: iso, event_payload: { type: 'task-status-update', status: to, ...(msg ? { status_message_id: msg.id } : {}) } });
  const { task, timelineSeqs } = await uow.applyStatusChange({ taskId, to, from, at, message: msg, timeline: items, ...only });
  if (!task) return null;
  // One wake-up per change is enough: followers read the timeline from their last seq.
  uow.publish(TASK_EVENTS, { task_id: taskId, seq: Math.max(...timelineSeqs) });
  if (to === 'canceled') uow.publish(TASK_CANCELED, { task_id: taskId });
  return tasks.toTask(task);
}


// Starts an agent run for `messageId` (db/tasks.ts beginRuns): the task moves to working if it may,
// in one statement shared with concurrent starts; the run decides from what comes back.
// `start: false` reads what a start reads (the task, trigger, history) and moves nothing.
export async function beginRun(s: UowServices & Pick<Services, 'taskStatements'>, taskId: string, messageId: string, history: { limit: number; maxBytes: number }, { start = true } = {}) {
  const at = new Date();
  const timelineItem: TimelineItem = { id: randomUUID(), task_id: taskId, created_at: at.toISOString(), event_payload: { type: 'task-status-update', status: 'working' } };
  const state = await s.taskStatements.beginRun.execute({ taskId, messageId, historyLimit: history.limit, historyMaxBytes: history.maxBytes, at, from: start ? RUN_STARTS_FROM : [], timelineItem });
  if (state?.started) afterCommit(s, [], [[TASK_EVENTS, { task_id: taskId, seq: state.seq }]]);
  return state;
}

// Changes the status of a task the caller holds locked in this transaction, with a status message
// within what the task may hold. A change the task cannot make is a conflict whatever its message
// weighs (as for POST message): the transition is checked before the message's room.
// `run`: the run's own change (it keeps the task), else a client's (it takes the task from its run).
export async function changeStatus(uow: UnitOfWork, task: tasks.TaskRow, to: TaskState, maxMessageBytes: number, message?: CreateMessageRequest, run?: string): Promise<Task> {
  assertTransition(task.status, to);
  if (message) await checkMessageRoom(uow.trx, task, message, maxMessageBytes);
  const changed = await changeStatusIf(uow, task.id, to, [task.status], message, run ? { run } : undefined);
  if (!changed) throw new Conflict(`Task '${task.id}' changed status concurrently; retry`, { from: task.status, to });
  return changed;
}

// Refuses a first message larger than a task may hold of messages.
export function checkFirstMessage(message: CreateMessageRequest, maxMessageBytes: number): void {
  const bytes = tasks.messageBytes(message);
  if (bytes > maxMessageBytes) {
    throw new PayloadTooLarge(`This message (${bytes} bytes) is more than the ${maxMessageBytes} bytes of messages a task may hold (TASK_MESSAGES_MAX_BYTES)`, { adding: bytes, limit: maxMessageBytes });
  }
}

// Builds a new task's rows in memory so they can be written by one statement, and the job of its
// first run (a user message starts one). That job is added right after commit without an outbox
// row: job recovery finds a submitted task whose first message has no job (workers/recover-agent-runs.ts).
function newTaskBundle(req: CreateTaskRequest, id: string, maxMessageBytes: number): { bundle: tasks.TaskBundle; run?: OutboxRow } {
  checkFirstMessage(req.message, maxMessageBytes);
  const at = new Date();
  const iso = at.toISOString();
  const task: tasks.TaskRow = {
    // Ids as Postgres returns them (lower case), so the answer matches later reads.
    id, context_id: (req.context_id ?? randomUUID()).toLowerCase(), status: 'submitted', status_timestamp: at, status_message_id: null,
    metadata: req.metadata ?? {}, created_at: at, updated_at: at,
  };
  const message = newMessage(id, req.message, iso);
  // The message first, as with every status change that carries one: the task as it stood at its
  // status item (a push notification's snapshot) holds the message it was created with.
  const timeline: TimelineItem[] = [
    { id: randomUUID(), task_id: id, created_at: iso, event_payload: { type: 'message', message } },
    { id: randomUUID(), task_id: id, created_at: iso, event_payload: { type: 'task-status-update', status: 'submitted' } },
  ];
  const run = req.message.role === 'user' ? newOutboxRow(...runJob(id, message.id)) : undefined;
  return { bundle: { task, message, timeline, opening: message.client_message_id !== undefined }, run };
}

// Creating a task is a single atomic statement (shared with concurrent intakes), so it needs no
// explicit transaction. No TASK_EVENTS note: nobody can follow a task before its id is known, and
// followers read the timeline from Postgres before they wait for notes. A retried send (an opening
// sender id already taken: findOpeningRetry) gets the task the first copy created.
export async function createTask(s: UowServices & Pick<Services, 'taskStatements' | 'cfg'>, req: CreateTaskRequest, id: string = randomUUID()): Promise<CreatedTask> {
  const { bundle, run } = newTaskBundle(req, id, s.cfg.TASK_MESSAGES_MAX_BYTES);
  const written = await writeBundle(s.db, req, bundle, (b) => s.taskStatements.insertTaskBundle.execute(b));
  if ('retry' in written) return written.retry;
  afterCommit(s, [], [], run ? [run] : []);
  return { task: tasks.toTask(bundle.task), message: bundle.message, lastSeq: 0, retry: false };
}

// The same, inside a caller's larger transaction.
export async function createTaskIn(uow: UnitOfWork, req: CreateTaskRequest, maxMessageBytes: number, id: string = randomUUID()): Promise<CreatedTask> {
  const { bundle, run } = newTaskBundle(req, id, maxMessageBytes);
  const written = await writeBundle(uow.trx, req, bundle, async (b) => (await tasks.insertTaskBundles(uow.trx, [b]))[0]);
  if ('retry' in written) return written.retry;
  if (run) uow.addRecoverable(run);
  return { task: tasks.toTask(bundle.task), message: bundle.message, lastSeq: Math.max(...written.seqs), retry: false };
}

// Writes a new task's rows with `insert`, which gives their timeline seqs, or nothing when the
// bundle's opening sender id is taken: then the send is a retry of the one that created that task
// (findOpeningRetry), or, with other content, a task of its own whose first message is not marked.
async function writeBundle(db: Tx, req: CreateTaskRequest, bundle: tasks.TaskBundle, insert: (b: tasks.TaskBundle) => Promise<number[] | undefined>): Promise<{ seqs: number[] } | { retry: CreatedTask }> {
  const seqs = await insert(bundle);
  if (seqs) return { seqs };
  const retry = await findOpeningRetry(db, req);
  if (retry) return { retry };
  return { seqs: (await insert({ ...bundle, opening: false }))! };
}

// A new task with its first message, or for a retried send (`retry`) the task the first copy created
// as it stood when found, with the message that opened it (openedTaskState reads how it stands).
// lastSeq: the new task's newest timeline item (createTaskIn; 0 from createTask, which does not read
// it, and for a retry).
export interface CreatedTask { task: Task; message: Message; lastSeq: number; retry: boolean }

// A message to a task that repeats one the task holds (the same sender id, role, parts, metadata,
// extensions and reference ids) is that send again, from a client whose answer was lost: nothing is
// stored, it is answered with the original. `settled`: the task is terminal or waits for input again
// since the original came (nothing more will come of it). `turnEnded`: it has been so at some time
// since, whatever it is now (a later message may have started another run): what the original
// started has ended; else it is still to come. Senders may reuse an id for other content: that is a
// new message.
export interface Retried { status: TaskState; settled: boolean; turnEnded: boolean }

// How a task stands for a retry of `original`: its item, whether the task has settled since, and
// the task's newest item (where a follower continues). Read in one view of the task: under its row
// lock, or in a snapshot.
async function retryState(trx: Tx, task: tasks.TaskRow, original: Pick<Message, 'id' | 'created_at'>) {
  const item = await timeline.messageItem(trx, task.id, original);
  if (!item) return undefined;
  const settled = (isTerminal(task.status) || isInterrupted(task.status)) && await timeline.statusChangedAfter(trx, task.id, item.seq);
  // Read only for a task working under another message's run (or a client's): under the original's
  // own, or not started, its turn has not ended, and the read would walk the run's items (under the
  // task's lock).
  const turnEnded = settled || (task.status === 'working' && task.run_message_id !== original.id
    && await timeline.statusChangedAfter(trx, task.id, item.seq, [...TERMINAL_STATES, ...INTERRUPTED_STATES]));
  const retried: Retried = { status: task.status, settled, turnEnded };
  return { item, seq: await lastTimelineSeq(trx, task.id), retried };
}

async function findRetried(trx: Tx, locked: tasks.TaskRow, req: CreateMessageRequest) {
  if (req.client_message_id === undefined) return undefined;
  const original = await messages.findSameMessage(trx, newMessage(locked.id, req, ''));
  const state = original && await retryState(trx, locked, original);
  if (!state) return undefined;
  const { seq: _m, ...message } = original!;
  const { seq: _i, ...timeline_item } = state.item;
  return { message: message as Message, timeline_item, seq: state.seq, retried: state.retried };
}

// A send of a new task whose sender id opened a task, with the role and content of the message that
// opened it (compared as findRetried compares them), the same task metadata and, if it names one, the same context, is that send again:
// it is answered with that task. Another send that reuses the id makes a task of its own, which a
// retry of it cannot find (the id is taken); senders are to make their ids unique.
async function findOpeningRetry(db: Tx, req: CreateTaskRequest): Promise<CreatedTask | undefined> {
  const taskId = await messages.taskOpenedBy(db, req.message.client_message_id!);
  const task = taskId && await tasks.getTask(db, taskId);
  if (!task || (req.context_id !== undefined && req.context_id.toLowerCase() !== task.context_id)) return undefined;
  if (!sameAsStored(task.metadata, req.metadata ?? {})) return undefined;
  const original = await messages.findSameMessage(db, newMessage(task.id, req.message, ''), true);
  if (!original) return undefined;
  const { seq: _seq, ...message } = original;
  return { task: tasks.toTask(task), message: message as Message, lastSeq: 0, retry: true };
}

// How the task a retried first send found stands (retryState), for a caller that reads it in one
// snapshot with what it answers from; undefined if the task is gone.
export async function openedTaskState(trx: Tx, taskId: string, opening: Message) {
  const task = await tasks.getTask(trx, taskId);
  return task && retryState(trx, task, opening);
}

// Why a task refuses a message (409 over REST, data.status its state); A2A answers each its own way.
export class TaskEnded extends Conflict {
  constructor(taskId: string, readonly state: TaskState) {
    super(`Task '${taskId}' is ${state} and accepts no more messages`, { status: state });
  }
}
export class TaskBusy extends Conflict {
  constructor(taskId: string, readonly state: TaskState, why: string) {
    super(`Task '${taskId}' is ${state}: ${why}`, { status: state });
  }
}

export interface AddMessageOptions {
  /** Runs, under the lock, only for a message that will be stored. */
  beforeAppend?: () => Promise<unknown>;
  /**
   * A user message is refused (TaskBusy) while a run of the agent has the task: working
   * under it, or submitted or answered with it yet to begin. The run answers another message and
   * reads none sent after it began, so the sender would be answered with another's reply (A2A). A
   * task a client drives (opened by an agent message, set working by PUT) takes it as REST does.
   */
  onlyAsAnswer?: boolean;
}

// Why a user message cannot be the task's next: a run of the agent has it (onlyAsAnswer).
async function busyWithRun(trx: Tx, task: tasks.TaskRow): Promise<string | undefined> {
  if (task.status === 'working') return task.run_seen_at ? 'its agent is working on an earlier message' : undefined;
  if (task.status !== 'submitted' && !isInterrupted(task.status)) return undefined;
  if (!await tasks.runOwed(trx, task.id)) return undefined;
  return task.status === 'submitted' ? 'its agent has yet to begin on its first message' : 'an earlier message already answered it and its run has not begun';
}

// Adds a message to a task that is not terminal, in the caller's transaction; a user message to an
// interrupted task starts a run, which cannot begin before that transaction commits. Of several
// such messages sent before a run starts (onlyAsAnswer refuses all but the first), the first run to
// start takes the task; the others find it working under another run and end
// (workers/run-agent-task.ts). A retried send (findRetried) is recognised under the task's lock, so
// two copies racing store one, and before the other checks, so the retry of the message that ended
// a task (or that a run is answering) gets the original.
export async function addMessageIn(uow: UnitOfWork, taskId: string, req: CreateMessageRequest, maxBytes: number, opts: AddMessageOptions = {}) {
  const task = await lockTask(uow.trx, taskId);
  const retry = await findRetried(uow.trx, task, req);
  if (retry) return retry;
  if (isTerminal(task.status)) throw new TaskEnded(taskId, task.status);
  const busy = opts.onlyAsAnswer && req.role === 'user' ? await busyWithRun(uow.trx, task) : undefined;
  if (busy) throw new TaskBusy(taskId, task.status, busy);
  await opts.beforeAppend?.();
  const { message, timelineItem } = await appendMessage(uow, task, req, maxBytes);
  if (req.role === 'user' && isInterrupted(task.status)) {
    await tasks.markRunDue(uow.trx, taskId, message.id);
    await enqueueRun(uow, taskId, message.id);
  }
  const { seq, ...timeline_item } = timelineItem;
  // seq: where a follower of the task's timeline continues from (api/a2a streams).
  return { message, timeline_item, seq, retried: undefined as Retried | undefined };
}

export async function addMessage(s: UowServices & Pick<Services, 'cfg'>, taskId: string, req: CreateMessageRequest) {
  return inTransaction(s, (uow) => addMessageIn(uow, taskId, req, s.cfg.TASK_MESSAGES_MAX_BYTES));
}

export async function updateStatus(s: UowServices & Pick<Services, 'cfg'>, taskId: string, to: TaskState, message?: CreateMessageRequest): Promise<Task> {
  return inTransaction(s, async (uow) => {
    const task = await lockTask(uow.trx, taskId);
    assertProgressMessage(task.status, to, message !== undefined);
    return changeStatus(uow, task, to, s.cfg.TASK_MESSAGES_MAX_BYTES, message);
  });
}

export async function getTaskWithMessages(db: Tx, taskId: string) {
  const found = await tasks.getTaskWithMessages(db, taskId, MESSAGES_IN_TASK);
  if (!found) throw new NotFound('task', taskId);
  const { task, statusMessage } = found;
  // More messages than a page: the page and its token as the message list gives them.
  const page = found.more ? await messages.listMessages(db, taskId, MESSAGES_IN_TASK) : { items: found.messages, next_page_token: undefined };
  return {
    task,
    messages: page.items,
    ...(page.next_page_token ? { messages_next_page_token: page.next_page_token } : {}),
    ...(statusMessage ? { status_message: statusMessage } : {}),
  };
}

export async function requireTask(db: Tx, taskId: string): Promise<tasks.TaskRow> {
  const task = await tasks.getTask(db, taskId);
  if (!task) throw new NotFound('task', taskId);
  return task;
}

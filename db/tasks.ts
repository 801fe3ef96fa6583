import type { Knex } from 'knex';
import { pgQuery, type Tx } from './knex.ts';
import { StatementBatcher } from './statement-batcher.ts';
import { keysetPage, PAGE_MAX_BYTES, type Page } from './pagination.ts';
import { COLUMNS as MESSAGE_COLUMNS, messageFromJson, messageFromRow, messageWeight, messageWeightSql, storedWeight } from './messages.ts';
import { parsedWeight } from '../domain/storable-json.ts';
import { Task, type ContextInfo, type Message, type TimelineItem } from '../domain/shapes/task.ts';
import { CLIENT_RUN, RUN_STARTS_FROM, type TaskState } from '../domain/task-states.ts';

export interface TaskRow {
  id: string; context_id: string; status: TaskState; status_timestamp: Date; status_message_id: string | null;
  metadata: Record<string, unknown>; created_at: Date; updated_at: Date;
  /** Internal (migration 0009): the trigger message of the run that moved the task to working. */
  run_message_id?: string | null;
  /** Internal (migration 0013): the user message the task is owed a run for (job recovery). */
  run_due_message_id?: string | null;
  /** Internal (migration 0016): the bytes of its messages' parts and of its artifact updates; null until first counted. */
  message_bytes?: string | number | null;
  artifact_bytes?: string | number | null;
  /** Internal (migration 0020): when the task's run started or a worker last said it is still going; null once the task leaves working. */
  run_seen_at?: Date | null;
  /** Internal (migration 0037): which take of the run's job holds the task, counted up by each (beginRuns, claimRun). */
  run_attempt?: number;
  /** Internal (migration 0042): what its metadata weighs once parsed; null for tasks from before. */
  metadata_weight?: string | number | null;
}

// Dates serialise to RFC 3339 with milliseconds in JSON responses.
export const toTask = ({ run_message_id: _run, run_due_message_id: _due, message_bytes: _m, artifact_bytes: _a, run_seen_at: _seen, run_attempt: _attempt, metadata_weight: _w, ...r }: TaskRow) => r as unknown as Task;

export async function getTask(db: Tx, id: string, lock = false): Promise<TaskRow | undefined> {
  const q = db('tasks').where({ id }).first();
  return lock ? q.forUpdate() : q;
}

// What the API shows of a task: the Task schema's properties, which are its columns in the table's
// order (as toTask leaves a row read with *). Named, not *, in prepared statements: a prepared *
// fails once a migration adds a column.
const TASK_SELECT = Object.keys(Task.properties).map((c) => `t.${c}`).join(', ');

// The subqueries the one-round-trip reads below share: up to `limit` ($2) messages of the task as
// JSON, from its first (`asc`) or its newest (`desc`), as many as fit PAGE_MAX_BYTES ($3) weighed as
// parsed (always one), oldest first, and how many were read before that cut; its status message as
// JSON. A task holds up to TASK_MESSAGES_MAX_BYTES of messages, which parsed whole in several
// answers at once ran the API out of heap.
// (row_to_json of the columns: to_jsonb(w) less the two took ten times as long.)
const messagesJson = (from: 'asc' | 'desc') => `(select json_build_object('fetched', count(*), 'items',
      coalesce(json_agg((select row_to_json(x) from (select ${MESSAGE_COLUMNS.map((c) => `w.${c}`).join(', ')}) x) order by w.seq) filter (where w._before < $3), '[]'))
    from (select l.*, sum(l._w) over (order by l.seq ${from}) - l._w as _before
            from (select ${MESSAGE_COLUMNS.join(', ')}, ${messageWeightSql('messages')} as _w from messages where task_id = t.id order by seq ${from} limit $2) l) w) as _messages`;
const STATUS_MESSAGE_JSON = `(select row_to_json(s) from (select ${MESSAGE_COLUMNS.join(', ')} from messages where id = t.status_message_id) s) as _status_message`;
type WithMessagesJson = Task & { _messages: { items: Record<string, unknown>[]; fetched: number }; _status_message: Record<string, unknown> | null };

// Reads `select`, a task row with those subqueries, and parts it into the task and its messages.
async function readTaskWithMessagesJson<R extends WithMessagesJson>(db: Tx, select: string, values: unknown[], name: string) {
  const { rows: [row] } = await pgQuery<R>(db, select, values, name);
  if (!row) return undefined;
  const { _messages: { items, fetched }, _status_message: status, ...rest } = row;
  return { rest, messages: items.map(messageFromJson), fetched, ...(status ? { statusMessage: messageFromJson(status) } : {}) };
}

// A task with its first `limit` messages within PAGE_MAX_BYTES, whether it has more, and its status message,
// in one round trip: get-task is the hottest read, and a statement more costs a round trip's socket
// writes and statement overhead in both the API and Postgres. Prepared: both reads go by an index
// (the primary keys, messages' (task_id, seq)) whatever the tables' sizes.
export async function getTaskWithMessages(db: Tx, id: string, limit: number): Promise<{ task: Task; messages: Message[]; more: boolean; statusMessage?: Message } | undefined> {
  const read = await readTaskWithMessagesJson<WithMessagesJson>(db,
    `select ${TASK_SELECT}, ${messagesJson('asc')}, ${STATUS_MESSAGE_JSON} from tasks t where t.id = $1`, [id, limit + 1, PAGE_MAX_BYTES], 'task-with-messages');
  if (!read) return undefined;
  const { rest: task, messages, fetched, statusMessage } = read;
  return { task, messages: messages.slice(0, limit), more: fetched > limit || messages.length < fetched, ...(statusMessage ? { statusMessage } : {}) };
}

// A task as its A2A view shows it (domain/a2a/task-view.ts), in one round trip: its newest `limit`
// messages within PAGE_MAX_BYTES (oldest first), its status message and its artifact updates in order. tasks/get is what
// A2A clients poll, and the view took three statements. Prepared, as getTaskWithMessages.
export async function getTaskView(db: Tx, id: string, limit: number): Promise<{ task: Task; messages: Message[]; statusMessage?: Message; artifactItems: Pick<TimelineItem, 'event_payload'>[] } | undefined> {
  const read = await readTaskWithMessagesJson<WithMessagesJson & { _artifacts: TimelineItem['event_payload'][] }>(db,
    `select ${TASK_SELECT}, ${messagesJson('desc')}, ${STATUS_MESSAGE_JSON},
            (select coalesce(json_agg(i.event_payload order by i.seq), '[]') from timeline_items i
              where i.task_id = t.id and i.event_payload->>'type' = 'artifact-update') as _artifacts
       from tasks t where t.id = $1`,
    [id, limit, PAGE_MAX_BYTES], 'task-view');
  if (!read) return undefined;
  const { rest: { _artifacts: artifacts, ...task }, messages, statusMessage } = read;
  return { task, messages, artifactItems: artifacts.map((event_payload) => ({ event_payload })), ...(statusMessage ? { statusMessage } : {}) };
}

export type ContentCount = 'message_bytes' | 'artifact_bytes';

// How a task's counts measure what they count: a message's parts, an artifact update, as compact JSON.
export const contentBytes = (value: unknown) => Buffer.byteLength(JSON.stringify(value));

// A message's parts and, when it has any, its metadata, extensions and accepted output modes: all of
// it is read back with the task's history, so a message with small parts and a large metadata object
// counts as large.
const listBytes = (list: unknown[] | null | undefined) => (list?.length ? contentBytes(list) : 0);
export const messageBytes = (m: { parts: unknown; metadata?: Record<string, unknown>; extensions?: unknown[] | null; accepted_output_modes?: unknown[] | null }) =>
  contentBytes(m.parts) + (m.metadata && Object.keys(m.metadata).length ? contentBytes(m.metadata) : 0) + listBytes(m.extensions) + listBytes(m.accepted_output_modes);

export async function setContentBytes(db: Tx, id: string, count: ContentCount, bytes: number): Promise<void> {
  await db('tasks').where({ id }).update({ [count]: bytes });
}

// Records content added to a task (a message, an artifact update) in its row: the new count, and
// `updated_at` moved to when it was added, never back, so a client polling on it sees new content.
export async function addContent(db: Tx, id: string, count: ContentCount, bytes: number, at: Date): Promise<void> {
  await db('tasks').where({ id }).update({ [count]: bytes, updated_at: db.raw('greatest(updated_at, ?)', [at]) });
}

// Whether the message a task's run_due_message_id names came after the task's status changed last
// (by the order of messages when the change carried one). Every change clears the mark; one left
// from before a change was set by processes of a release before migration 0013, which do not clear it.
const DUE_SINCE_STATUS = `coalesce(d.seq > (select sm.seq from messages sm where sm.id = t.status_message_id), d.created_at >= t.status_timestamp)`;

// A user message to a task waiting for input is owed a run: the first such one, until a run starts
// or the status changes (job recovery reads these, listRunsToCheck).
export async function markRunDue(db: Tx, taskId: string, messageId: string): Promise<void> {
  await db.raw(
    `update tasks t set run_due_message_id = ?
      where t.id = ? and (t.run_due_message_id is null
                          or not exists (select 1 from messages d where d.id = t.run_due_message_id and ${DUE_SINCE_STATUS}))`,
    [messageId, taskId],
  );
}

// Whether a run of the agent already has the task's next word: a submitted task opened by a user
// message (its first run), or one waiting for input that a user message already answered (the mark
// is current) before that run began. (A task working under a run says so in its row: run_seen_at.)
export async function runOwed(db: Tx, taskId: string): Promise<boolean> {
  const { rows } = await db.raw(
    `select case when t.status = 'submitted' then (select m.role = 'user' from messages m where m.task_id = t.id order by m.seq limit 1)
                 else exists (select 1 from messages d where d.id = t.run_due_message_id and ${DUE_SINCE_STATUS}) end as owed
       from tasks t where t.id = ?`,
    [taskId],
  );
  return rows[0]?.owed === true;
}

// Marks no longer owed (tasks run, ended or changed by processes of a release before migration
// 0013, which do not clear them): on a task in a state no run starts from, or older than its last
// status change. Cleared, so the partial index holds the owed tasks only.
// A bounded batch, read through the partial index on marked tasks, skipping rows others hold: it
// never waits on, nor deadlocks with, the hot statements.
export async function clearStaleRunDue(db: Tx, limit = 1000): Promise<number> {
  const { rowCount } = await db.raw(
    `update tasks set run_due_message_id = null
      where id in (select t.id from tasks t left join messages d on d.id = t.run_due_message_id
                    where t.run_due_message_id is not null
                      and (t.status <> all(?) or d.id is null or not ${DUE_SINCE_STATUS})
                    limit ? for update of t skip locked)`,
    [[...RUN_STARTS_FROM], limit],
  );
  return rowCount ?? 0;
}

// Who holds each task: its status and the message of the run that took it last.
export async function runHolders(db: Tx, ids: readonly string[]): Promise<Pick<TaskRow, 'id' | 'status' | 'run_message_id' | 'run_attempt'>[]> {
  if (!ids.length) return [];
  return db('tasks').select('id', 'status', 'run_message_id', 'run_attempt').whereIn('id', ids);
}

export async function listTasks(db: Tx, filter: { status?: string; context_id?: string }, pageSize: number, token?: string): Promise<Page<TaskRow>> {
  const q = db('tasks').select('*');
  if (filter.status) q.where('status', filter.status);
  if (filter.context_id) q.where('context_id', filter.context_id);
  return keysetPage<TaskRow>(q, {
    list: ['tasks', filter.status, filter.context_id], columns: ['created_at', 'id'], kinds: ['timestamp', 'uuid'], direction: 'desc', cursorOf: (r) => [r.created_at, r.id],
    // Its metadata as parsed (dense metadata, 100,000 '{}', is ten times its text in memory).
    bytes: { db, size: storedWeight('metadata_weight', 'metadata::text'), max: PAGE_MAX_BYTES },
  }, pageSize, token);
}

export async function listContexts(db: Tx, pageSize: number, token?: string): Promise<Page<ContextInfo>> {
  const q = db('contexts').select({ context_id: 'id', created_at: 'created_at' });
  return keysetPage<ContextInfo>(q, { list: ['contexts'], columns: ['created_at', 'id'], kinds: ['timestamp', 'uuid'], direction: 'desc', cursorOf: (r) => [r.created_at, r.context_id] }, pageSize, token);
}

// `opening`: its message's sender id marks it as the one that opened the task (migration 0024).
export interface TaskBundle { task: TaskRow; message: Message; timeline: TimelineItem[]; opening: boolean }

// New tasks with their contexts, first messages and timelines, written by
// ONE statement whatever their number: task intake is the hottest write path, and concurrent
// intakes are coalesced into one such statement (db/statement-batcher.ts). The bundles travel
// as one jsonb parameter so the statement text, and its prepared plan, never change.
// All of a bundle's rows are stamped with its task's created_at (newTaskBundle makes one instant).
// An opening message whose sender id another opening message holds (one committed, or earlier in the
// same statement) is not stored, and nor is the rest of its bundle: the caller looks for the task that
// id opened (domain/tasks.ts). Messages go in by sender id: concurrent statements holding the same
// ids then wait for each other in one order, never in a cycle (a deadlock). Returns, per bundle in order, the seqs of its timeline items, or undefined
// for a bundle not stored.
export async function insertTaskBundles(db: Tx, bundles: readonly TaskBundle[]): Promise<(number[] | undefined)[]> {
  const input = bundles.map(({ task: t, message: m, timeline, opening }, i) => ({
    i, id: t.id, context_id: t.context_id, status: t.status, at: t.created_at, metadata: t.metadata, mdw: parsedWeight(t.metadata),
    m_id: m.id, cm_id: m.client_message_id ?? null, role: m.role, parts: m.parts, mb: messageBytes(m), mw: messageWeight(m), refs: m.reference_task_ids, ext: m.extensions ?? null, aom: m.accepted_output_modes ?? null, m_metadata: m.metadata, op: opening,
    tl: timeline.map((item) => ({ id: item.id, p: item.event_payload, w: parsedWeight(item.event_payload) })),
  }));
  const { rows } = await pgQuery<{ seqs: (string | number)[] | null; stored: boolean }>(db,
    `with b as (select * from jsonb_to_recordset($1::jsonb) as x(i int, id uuid, context_id uuid, status text, at timestamptz, metadata jsonb, mdw bigint,
                   m_id uuid, cm_id text, role text, parts jsonb, mb bigint, mw bigint, refs uuid[], ext text[], aom text[], m_metadata jsonb, op boolean, tl jsonb)),
      m as (insert into messages (id, client_message_id, task_id, role, parts, reference_task_ids, extensions, accepted_output_modes, metadata, created_at, opens_task, weight)
            select m_id, cm_id, id, role, parts, refs, ext, aom, m_metadata, at, op, mw from b order by cm_id, i
            on conflict (client_message_id) where opens_task do nothing
            returning task_id),
      s as (select b.* from b join m on m.task_id = b.id),
      -- A context is made with its first task, and keeps that task's time: list-contexts pages on it, so
      -- a context whose time moved would be listed twice or never to a client paging meanwhile. (A
      -- later task stamped earlier, by another API's clock, does not move it.) The update that changes
      -- nothing locks an existing context until commit (do nothing would not): a purge holding it
      -- (db/task-purge.ts lockContexts) is waited for, and a context it deleted is inserted again,
      -- where the tasks' foreign key check would otherwise fail. Statements take contexts in id order,
      -- after their messages, so they wait for each other without a cycle.
      c as (insert into contexts (id, created_at) select distinct on (context_id) context_id, at from s order by context_id, at
            on conflict (id) do update set created_at = contexts.created_at where false),
      t as (insert into tasks (id, context_id, status, status_timestamp, status_message_id, metadata, metadata_weight, created_at, updated_at, run_due_message_id, message_bytes)
            select id, context_id, status, at, null, metadata, mdw, at, at, case when role = 'user' then m_id end, mb from s),
      tl as (insert into timeline_items (id, task_id, event_payload, created_at, weight)
             select (e.item->>'id')::uuid, s.id, e.item->'p', s.at, (e.item->>'w')::bigint
               from s cross join lateral jsonb_array_elements(s.tl) with ordinality as e(item, n)
              order by s.i, e.n
             returning task_id, seq)
    select b.i, (select array_agg(seq order by seq) from tl where tl.task_id = b.id) as seqs,
           exists (select 1 from m where m.task_id = b.id) as stored
      from b order by b.i`,
    [JSON.stringify(input)], 'task-bundles',
  );
  return rows.map((r) => (r.stored ? (r.seqs ?? []).map(Number) : undefined));
}

// Batched statements lock task rows in input order: sorted by task id, concurrent batches cannot
// deadlock each other. (Results still come back in the callers' order, by `i`.)
const byTaskId = (a: { task_id: string }, b: { task_id: string }) => (a.task_id < b.task_id ? -1 : a.task_id > b.task_id ? 1 : 0);

const parseTaskJson = (j: Record<string, unknown>): TaskRow => ({
  ...(j as unknown as TaskRow),
  status_timestamp: new Date(j.status_timestamp as string),
  created_at: new Date(j.created_at as string),
  updated_at: new Date(j.updated_at as string),
});

export interface StatusChange {
  taskId: string; to: TaskState; from: readonly TaskState[]; at: Date; message?: Message; timeline: TimelineItem[];
  /** A running run's own change (its message): applied only while the task is working under it. */
  run?: string;
  /** With `run`: applied only while the task is still held by this take of the run's job (run_attempt). */
  runAttempt?: number;
  /** The change for a run whose job ended without its own handling: applied only while the task is working under that run or still owed it. */
  lostRun?: string;
  /** Applied only if its message keeps the task within this many bytes of messages (TASK_MESSAGES_MAX_BYTES). */
  maxMessageBytes?: number;
}
export interface StatusChangeResult { task?: TaskRow; timelineSeqs: number[] }

// Status changes in one statement: each task moves to `to` only if it is still in one of
// `from`, and, for a run's change, still working under that run (the compare-and-set that replaces
// a row lock: a task a client or another run took since is not this run's to end) and within what
// it may hold with the change's message when `maxMessageBytes` says, and only then are its status message
// and timeline items written. A change whose compare-and-set did not match gets no task.
// The changes travel as one jsonb parameter (see insertTaskBundles). No two may name one task.
export async function applyStatusChanges(db: Tx, changes: readonly StatusChange[]): Promise<StatusChangeResult[]> {
  const input = changes.map((c, i) => ({
    i, task_id: c.taskId, to: c.to, from: c.from, at: c.at, msg: c.message ?? null, mb: c.message ? messageBytes(c.message) : 0, mw: c.message ? messageWeight(c.message) : null, max: c.maxMessageBytes ?? null, run: c.run ?? null, attempt: c.runAttempt ?? null, lost_run: c.lostRun ?? null,
    tl: c.timeline.map((item) => ({ id: item.id, p: item.event_payload, c: item.created_at, w: parsedWeight(item.event_payload) })),
  }))
    .sort(byTaskId);
  // Not a prepared statement: a plan cached while the table was small would scan all of it on every
  // call until the table is next analysed; planned each time, it sees the table's size and probes the
  // primary key. (Prepared, it measured no cheaper under the A2A bench.)
  const { rows } = await pgQuery<{ task: Record<string, unknown> | null; seqs: (string | number)[] | null }>(db,
    `with b as (select * from jsonb_to_recordset($1::jsonb) as x(i int, task_id uuid, "to" text, "from" text[], at timestamptz, msg jsonb, mb bigint, mw bigint, max bigint, tl jsonb, run uuid, attempt int, lost_run uuid)),
      u as (update tasks t set status = b."to", status_message_id = (b.msg->>'id')::uuid, status_timestamp = b.at,
                               -- never back: content another process added may carry a later time (clocks differ)
                               updated_at = greatest(t.updated_at, b.at),
                               run_due_message_id = null, message_bytes = t.message_bytes + b.mb,
                               -- a run's mark lasts while the task stays working: one a client sets working later has no run
                               run_seen_at = case when b."to" = 'working' then t.run_seen_at end,
                               -- a client's move to another status takes the task from its run (CLIENT_RUN);
                               -- its progress update of a working task leaves the run at work
                               run_message_id = case when b.run is null and b.lost_run is null and t.status <> b."to" then '${CLIENT_RUN}'::uuid else t.run_message_id end
              from b
             -- The ids as a parameter keep the plan on the primary key: the planner cannot know how
             -- many rows b has (it guesses 100) and would otherwise scan the whole table to hash-join them.
             where t.id = any($2::uuid[]) and t.id = b.task_id and t.status = any(b."from")
               -- tasks from before migration 0009 name no run
               and (b.run is null or (t.status = 'working' and (t.run_message_id is null or t.run_message_id = b.run)))
               and (b.attempt is null or t.run_attempt = b.attempt)
               -- a lost run's failure: of the run the task is working under, or of the run it is owed
               and (b.lost_run is null or t.status = 'submitted' or t.run_due_message_id = b.lost_run
                    or (t.status = 'working' and (t.run_message_id is null or t.run_message_id = b.lost_run)))
               -- tasks from before migration 0016 are not counted yet
               and (b.max is null or t.message_bytes is null or t.message_bytes + b.mb <= b.max)
             returning t.*),
      m as (insert into messages (id, client_message_id, task_id, role, parts, reference_task_ids, extensions, accepted_output_modes, metadata, created_at, weight)
            select (b.msg->>'id')::uuid, b.msg->>'client_message_id', b.task_id, b.msg->>'role', b.msg->'parts',
                   array(select jsonb_array_elements_text(b.msg->'reference_task_ids'))::uuid[],
                   case when b.msg ? 'extensions' then array(select jsonb_array_elements_text(b.msg->'extensions')) end,
                   case when b.msg ? 'accepted_output_modes' then array(select jsonb_array_elements_text(b.msg->'accepted_output_modes')) end,
                   b.msg->'metadata', (b.msg->>'created_at')::timestamptz, b.mw
              from b join u on u.id = b.task_id where b.msg is not null order by b.i),
      tl as (insert into timeline_items (id, task_id, event_payload, created_at, weight)
             select (e.item->>'id')::uuid, b.task_id, e.item->'p', (e.item->>'c')::timestamptz, (e.item->>'w')::bigint
               from b join u on u.id = b.task_id cross join lateral jsonb_array_elements(b.tl) with ordinality as e(item, n)
              order by b.i, e.n
             returning task_id, seq)
    select (select row_to_json(u) from u where u.id = b.task_id) as task,
           (select array_agg(seq order by seq) from tl where tl.task_id = b.task_id) as seqs
      from b order by b.i`,
    [JSON.stringify(input), input.map((c) => c.task_id)],
  );
  return rows.map((r) =>
    (r.task ? { task: parseTaskJson(r.task), timelineSeqs: (r.seqs ?? []).map(Number) } : { timelineSeqs: [] }));
}

export interface RunStart { taskId: string; messageId: string; historyLimit: number; historyMaxBytes: number; at: Date; from: readonly TaskState[]; timelineItem: TimelineItem }
export interface RunState {
  /** The task: after the move to working when `started`, else as it was. */
  task: TaskRow;
  /** Whether this statement moved the task to working (with the timeline item at `seq`). */
  started: boolean;
  seq?: number;
  trigger?: Message & { seq: number };
  answered: boolean;
  history: (Message & { seq: number })[];
}

// Starts agent runs, several in one round trip (coalesced like the writes): each task moves to
// working, with its timeline item, only if it is in one of `from`, its trigger message
// exists and no agent message answered that message yet (the run for it already ended by
// interrupting the task: input-required or auth-required after the message; progress messages of
// a run that died do not count). Whatever happened, the run gets the task, the trigger, whether it
// was answered and recent history to decide and work with. No task: undefined.
export async function beginRuns(db: Tx, runs: readonly RunStart[]): Promise<(RunState | undefined)[]> {
  const input = runs.map((r, i) => ({ i, task_id: r.taskId, message_id: r.messageId, lim: r.historyLimit, max_bytes: r.historyMaxBytes, at: r.at, from: r.from, item: { id: r.timelineItem.id, p: r.timelineItem.event_payload, w: parsedWeight(r.timelineItem.event_payload) } }))
    .sort(byTaskId);
  const ids = input.map((r) => r.task_id);
  // Planned each time, like applyStatusChanges.
  const { rows } = await pgQuery<{ task: Record<string, unknown> | null; started: boolean; seq: string | number | null; trigger: Record<string, unknown> | null; answered: boolean; history: Record<string, unknown>[] }>(db,
    `with b as (select * from jsonb_to_recordset($1::jsonb) as x(i int, task_id uuid, message_id uuid, lim int, max_bytes bigint, at timestamptz, "from" text[], item jsonb)),
      s as (select b.*, t.status, row_to_json(t) as task,
                   (select row_to_json(m) from (select ${MESSAGE_COLUMNS.join(', ')} from messages where id = b.message_id and task_id = t.id) m) as trigger,
                   exists (select 1 from messages tr where tr.id = b.message_id and t.status in ('input-required', 'auth-required')
                           and coalesce((select sm.seq from messages sm where sm.id = t.status_message_id) > tr.seq,
                                        t.status_timestamp > tr.created_at)) as answered
              from b
              -- the ids as a parameter keep both reads of tasks on the primary key (see applyStatusChanges)
              left join (select * from tasks where id = any($2::uuid[])) t on t.id = b.task_id),
      u as (update tasks t set status = 'working', status_message_id = null, status_timestamp = s.at, updated_at = greatest(t.updated_at, s.at),
                               run_message_id = s.message_id, run_due_message_id = null, run_seen_at = s.at, run_attempt = t.run_attempt + 1
              from s
             where t.id = any($2::uuid[]) and t.id = s.task_id
               and s.status = any(s."from") and s.trigger is not null and not s.answered
               -- a task changed since s was read keeps its new state. Not "=": with it the planner
               -- probes (status, created_at, id) by status alone, reading every task of that status.
               and t.status is not distinct from s.status
            returning t.*),
      tl as (insert into timeline_items (id, task_id, event_payload, created_at, weight)
             select (s.item->>'id')::uuid, s.task_id, s.item->'p', s.at, (s.item->>'w')::bigint
               from s join u on u.id = s.task_id order by s.task_id
             returning task_id, seq)
    select coalesce((select row_to_json(u) from u where u.id = s.task_id), s.task) as task,
           exists (select 1 from u where u.id = s.task_id) as started,
           (select seq from tl where tl.task_id = s.task_id) as seq,
           s.trigger, s.answered,
           -- The newest messages within both limits (weighed as parsed), and always the run's
           -- message and the agent's messages after it (a run tried again reads what it already
           -- said there, not to say it twice), even when more than the limit came after them. User
           -- messages after it count like the rest: a client may send any number while the run
           -- waits, and they made a history of any size.
           (select coalesce(json_agg(h order by h.seq), '[]') from
              (select ${MESSAGE_COLUMNS.join(', ')} from
                 (select l.*, sum(l._w) over (order by l.seq desc) as upto
                    from ((select ${MESSAGE_COLUMNS.join(', ')}, ${messageWeightSql('messages')} as _w from messages where task_id = s.task_id order by seq desc limit s.lim)
                          union all
                          -- those of the run's that the newest did not reach (none, but for a task
                          -- sent more than the limit while the run waited)
                          select ${MESSAGE_COLUMNS.join(', ')}, ${messageWeightSql('messages')} as _w from messages
                           where task_id = s.task_id and seq >= (s.trigger->>'seq')::bigint and (seq = (s.trigger->>'seq')::bigint or role = 'agent')
                             and seq < (select min(n.seq) from (select seq from messages where task_id = s.task_id order by seq desc limit s.lim) n)) l) w
                where w.upto <= s.max_bytes or w.seq = (s.trigger->>'seq')::bigint
                   or (w.seq > (s.trigger->>'seq')::bigint and w.role = 'agent')) h) as history
      from s order by s.i`,
    [JSON.stringify(input), ids],
  );
  const toMessage = (m: Record<string, unknown>): Message & { seq: number } =>
    messageFromRow({ ...(m as unknown as Message), seq: Number(m.seq), created_at: new Date(m.created_at as string).toISOString() });
  return rows.map((r) => (r.task
    ? {
      task: parseTaskJson(r.task), started: r.started, ...(r.seq !== null ? { seq: Number(r.seq) } : {}),
      trigger: r.trigger ? toMessage(r.trigger) : undefined, answered: r.answered, history: r.history.map(toMessage),
    }
    : undefined));
}

/** Takes a task working under `messageId` for a new take of that run's job; its run_attempt, or undefined when the task is not working under that run. */
export async function claimRun(db: Tx, taskId: string, messageId: string): Promise<number | undefined> {
  const [row] = await db('tasks').where({ id: taskId, status: 'working' })
    .andWhere((q) => q.whereNull('run_message_id').orWhere('run_message_id', messageId))
    .increment('run_attempt', 1).returning('run_attempt');
  return row?.run_attempt;
}

export interface RunToCheck {
  task_id: string; message_id: string; created_at: Date; status: TaskState;
  /** Whether a run whose job is gone may be enqueued again: an owed run, or a run that still has its working task (not one a client set working since). */
  resumable: boolean;
}

// Candidates for run recovery, in (created_at, id) order after `after`:
// - tasks owed a run (run_due_message_id: opened by a user message, or a user message since they
//   began to wait for input, and no run started nor status change since) for a message sent at
//   least `olderThanMs` ago;
// - tasks working under a run (its message; not one a client took, CLIENT_RUN) that has neither
//   changed their status nor been said to be going on (markRunsSeen) for as long.
// Each branch reads its own index (the partial one on owed tasks; status), not every task.
export async function listRunsToCheck(db: Tx, olderThanMs: number, after: { created_at: Date; task_id: string } | undefined, limit: number): Promise<RunToCheck[]> {
  const cursor = [after?.created_at ?? new Date(0), after?.task_id ?? '00000000-0000-0000-0000-000000000000'];
  const { rows } = await db.raw(
    `select * from (
      (select t.id as task_id, t.created_at, t.status, t.run_due_message_id as message_id, true as resumable
         from tasks t join messages d on d.id = t.run_due_message_id
        where t.run_due_message_id is not null and t.status = any(?)
          and d.created_at < now() - make_interval(secs => ?) and ${DUE_SINCE_STATUS}
          and (t.created_at, t.id) > (?::timestamptz, ?::uuid)
        order by t.created_at, t.id limit ?)
      union all
      (select t.id, t.created_at, t.status, t.run_message_id, t.run_seen_at is not null
         from tasks t
        where t.status = 'working' and t.run_message_id is not null and t.run_message_id <> '${CLIENT_RUN}'
          and greatest(t.status_timestamp, t.run_seen_at) < now() - make_interval(secs => ?)
          and (t.created_at, t.id) > (?::timestamptz, ?::uuid)
        order by t.created_at, t.id limit ?)
    ) c order by created_at, task_id limit ?`,
    [[...RUN_STARTS_FROM], olderThanMs / 1000, ...cursor, limit, olderThanMs / 1000, ...cursor, limit, limit],
  );
  return rows;
}

/** Marks runs (task and trigger message) as still going, for those tasks still working under them. */
export async function markRunsSeen(db: Tx, runs: readonly { taskId: string; messageId: string }[]): Promise<void> {
  // In task id order, as the batched run and status statements lock tasks: in another order the two
  // could deadlock (Postgres would abort one after deadlock_timeout).
  const sorted = runs.map((r) => ({ task_id: r.taskId, message_id: r.messageId })).sort(byTaskId);
  await db.raw(
    `update tasks t set run_seen_at = now() from unnest(?::uuid[], ?::uuid[]) as r(task_id, message_id)
      -- a mark a status change cleared stays cleared: a run about to be aborted cannot bring it back
      where t.id = r.task_id and t.status = 'working' and t.run_message_id = r.message_id and t.run_seen_at is not null`,
    [sorted.map((r) => r.task_id), sorted.map((r) => r.message_id)],
  );
}

// The hot task statements of a process, each coalescing concurrent calls (db/statement-batcher.ts)
// into one multi-row statement.
export function createTaskStatements(db: Knex) {
  // Messages dominate the size of a statement's jsonb parameter (a bundle carries its message twice).
  const parameterBytes = (m?: Message) => (m ? 2 * JSON.stringify(m.parts).length : 0);
  return {
    insertTaskBundle: new StatementBatcher((bundles: TaskBundle[]) => insertTaskBundles(db, bundles), { size: (b) => parameterBytes(b.message) }),
    // A task's changes are never written at the same time: one UPDATE cannot apply two of them.
    applyStatusChange: new StatementBatcher((changes: StatusChange[]) => applyStatusChanges(db, changes), { key: (c) => c.taskId, size: (c) => parameterBytes(c.message) }),
    beginRun: new StatementBatcher((runs: RunStart[]) => beginRuns(db, runs), { key: (r) => r.taskId }),
  };
}
export type TaskStatements = ReturnType<typeof createTaskStatements>;

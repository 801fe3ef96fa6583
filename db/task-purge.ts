// Deletes ended tasks past their retention (TASK_RETENTION_DAYS; domain/task-retention.ts).
// A task's messages, timeline, push configs and remote-task link go with it (ON DELETE CASCADE);
// a context goes when its last task does, and one that stays keeps its created_at (the time it was
// made with its first task): list-contexts pages on it.
import type { Knex } from 'knex';
import { TERMINAL_STATES } from '../domain/task-states.ts';
import { statementTimedOut } from '../domain/errors.ts';
import { tryAdvisoryXactLock } from './advisory-locks.ts';

// Only one purger at a time across workers: two would race over contexts whose tasks each deletes
// a part of, and leave such a context behind with no task to bring it up again.
const PURGE_LOCK = 'taskbridge:purge-ended-tasks';

// The next `limit` tasks that ended (a terminal status) before `before`, the earliest ended first: a
// range of the partial index of ended tasks by their status time (migration 0034), read in its order
// up to `limit`, which reaches neither tasks that have not ended nor tasks that ended after `before`,
// however long ago those were created. (Read by created_at, each batch passed over every task created
// before `before` that ended after it, and the batch with nothing due that ends a pass read them all.)
// The status list is the index's predicate: the planner uses a partial index only for a query that
// names the same list, as constants (test/task-purge.test.ts checks what a batch reads). The condition
// on created_at, which the status time implies, only filters what the index finds. Locked tasks are
// skipped: a request holding one is reading or refusing a change.
const ENDED = TERMINAL_STATES.map((s) => `'${s}'`).join(', ');
const ENDED_BEFORE = `select id from tasks t where t.status in (${ENDED}) and t.status_timestamp < ? and t.created_at < ?
   order by t.status_timestamp limit ? for update skip locked`;
const endedBefore = (before: Date, limit: number) => [before, before, limit];
const DELETE_ENDED = `delete from tasks where id in (${ENDED_BEFORE}) returning context_id`;

// Deletes those tasks with the contexts left without tasks; the number of tasks deleted, or null
// when another worker is purging. In one interruptible transaction whose statements are each
// canceled past `timeoutMs` (statement_timeout): the batch as a whole may take longer.
export async function purgeEndedTasks(db: Knex, before: Date, limit: number, timeoutMs: number, interrupt?: AbortSignal): Promise<{ tasks: number; contexts: number } | null> {
  return interruptibleTransaction(db, timeoutMs, interrupt, async (trx) => {
    if (!(await tryAdvisoryXactLock(trx, PURGE_LOCK))) return null;
    const { rows: gone } = await trx.raw(DELETE_ENDED, endedBefore(before, limit));
    if (!gone.length) return { tasks: 0, contexts: 0 };
    const contextIds = [...new Set((gone as { context_id: string }[]).map((r) => r.context_id))];
    await lockContexts(trx, contextIds);
    const contexts = await deleteEmptyContexts(trx, contextIds);
    return { tasks: gone.length, contexts };
  });
}

// A transaction whose statements are canceled past `timeoutMs` (57014), whatever the connection's
// own statement_timeout (none with DB_QUERY_TIMEOUT_MS=0), and whose backend `interrupt` (a worker's
// stop: its pool would wait for the connection before it closes) ends, which rolls it back: canceled
// instead, a statement begun after the cancel came would go on. The end runs on another connection of
// the pool, maybe only once this transaction has committed and its connection serves another caller:
// so it ends the backend only while it is still in this transaction (its start, xact_start).
async function interruptibleTransaction<T>(db: Knex, timeoutMs: number, interrupt: AbortSignal | undefined, work: (trx: Knex.Transaction) => Promise<T>): Promise<T> {
  return db.transaction(async (trx) => {
    const { rows: [self] } = await trx.raw(`select set_config('statement_timeout', ?, true), pg_backend_pid() as pid, transaction_timestamp()::text as began`, [String(timeoutMs)]);
    const end = () => void db.raw('select pg_terminate_backend(pid) from pg_stat_activity where pid = ? and xact_start = ?::timestamptz', [self.pid, self.began]).catch(() => undefined);
    interrupt?.addEventListener('abort', end, { once: true });
    try {
      // A signal that fired before the listener was added never calls it.
      interrupt?.throwIfAborted();
      return await work(trx);
    } finally {
      interrupt?.removeEventListener('abort', end);
    }
  });
}

// The next such task alone holding too many rows to be deleted in one statement: its timeline items
// and messages are deleted `chunk` rows a statement first, each in an interruptible transaction of
// `timeoutMs` committed by itself (the task is going, so losing its history early loses nothing).
// The number of rows deleted; a statement that times out after others deleted rows ends the call
// with those (the next call goes on), and one that times out first is thrown. A worker that stops
// (`stop.stopping`) gets no further chunk; `stop.interrupt` ends the chunk in flight.
export async function thinNextEndedTask(db: Knex, before: Date, chunk: number, timeoutMs: number, stop?: { stopping: AbortSignal; interrupt: AbortSignal }): Promise<number> {
  const within = <T>(work: (trx: Knex.Transaction) => Promise<T>) => interruptibleTransaction(db, timeoutMs, stop?.interrupt, work);
  const next = await within(async (trx) => (await trx.raw(ENDED_BEFORE, endedBefore(before, 1))).rows[0] as { id: string } | undefined);
  if (!next) return 0;
  let deleted = 0;
  try {
    for (const table of ['timeline_items', 'messages']) {
      for (;;) {
        if (stop?.stopping.aborted) return deleted;
        const n = await within((trx) => trx(table).whereIn('id', trx(table).select('id').where({ task_id: next.id }).limit(chunk)).delete());
        deleted += n;
        if (n < chunk) break;
      }
    }
  } catch (err) {
    if (!deleted || !statementTimedOut(err)) throw err;
  }
  return deleted;
}

// The contexts the purge may delete, locked before, in id order. An intake locks each existing
// context it writes to until it commits (insertTaskBundles: its on conflict update), in id order:
// locked as the delete comes on them, the purge could hold a context an intake still needs while
// waiting for one that intake holds, a deadlock (40P01). An intake into one of them now waits for the
// purge's commit (and makes again a context it deleted), or the purge for the intake's.
async function lockContexts(trx: Knex.Transaction, ids: string[]): Promise<void> {
  await trx.raw(`select id from contexts where id = any(?::uuid[]) order by id for update`, [ids]);
}

// A task written in one of these contexts meanwhile by a writer that does not lock the context
// (the intake does: lockContexts makes it wait) makes this delete fail its foreign key check
// (23503). Run again, the statement sees that task and keeps its context.
async function deleteEmptyContexts(trx: Knex.Transaction, ids: string[]): Promise<number> {
  const attempt = () => trx.transaction((sp) => sp('contexts').whereIn('id', ids)
    .whereNotExists((q) => q.select(trx.raw('1')).from('tasks').whereRaw('tasks.context_id = contexts.id')).delete());
  try {
    return await attempt();
  } catch (err) {
    if ((err as { code?: string }).code !== '23503') throw err;
    return attempt();
  }
}

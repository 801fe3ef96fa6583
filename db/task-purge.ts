// Deletes ended tasks past their retention (TASK_RETENTION_DAYS; domain/task-retention.ts).
// A task's messages, timeline, push configs and remote-task link go with it (ON DELETE CASCADE);
// a context goes when its last task does.
import type { Knex } from 'knex';
import { TERMINAL_STATES } from '../domain/task-states.ts';

// Only one purger at a time across workers: two would race over contexts whose tasks each deletes
// a part of, and leave such a context behind with no task to bring it up again.
const PURGE_LOCK = 'taskbridge:purge-ended-tasks';

// Deletes up to `limit` tasks that ended (a terminal status) before `before`, with the contexts
// left without tasks; the number of tasks deleted, or null when another worker is purging.
// created_at < before is implied by the status time: each status's range of the (status,
// created_at, id) index is read from its oldest (a condition on the status list as a whole let the
// planner scan the table whenever it misjudged how many have ended). Locked tasks are skipped: a request holding one is reading or refusing a change.
export async function purgeEndedTasks(db: Knex, before: Date, limit: number): Promise<{ tasks: number; contexts: number } | null> {
  return db.transaction(async (trx) => {
    const { rows: [lock] } = await trx.raw(`select pg_try_advisory_xact_lock(hashtext(?)) as held`, [PURGE_LOCK]);
    if (!lock.held) return null;
    const { rows: gone } = await trx.raw(
      `delete from tasks where id in (
         select e.id from unnest(?::text[]) as s(status) cross join lateral (
           select id from tasks t where t.status = s.status and t.created_at < ? and t.status_timestamp < ?
            order by t.created_at limit ? for update skip locked) e
          limit ?)
       returning context_id`,
      [[...TERMINAL_STATES], before, before, limit, limit],
    );
    if (!gone.length) return { tasks: 0, contexts: 0 };
    const contextIds = [...new Set((gone as { context_id: string }[]).map((r) => r.context_id))];
    return { tasks: gone.length, contexts: await deleteEmptyContexts(trx, contextIds) };
  });
}

// A client may start a task in one of these contexts meanwhile: its foreign key check then makes
// this delete fail (23503). Run again, the statement sees that task and keeps its context.
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

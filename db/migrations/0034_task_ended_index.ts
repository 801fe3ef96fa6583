import type { Knex } from 'knex';

// The purge of tasks past TASK_RETENTION_DAYS (db/task-purge.ts) finds ended tasks by the time they
// ended. Read by created_at on (status, created_at, id), each batch also read, and passed over, every
// task created before the cutoff that ended after it (long runs, tasks that waited for input long):
// at 1,000,000 of them, a batch of 1,000 due read the whole table (22,105 buffers, 212 ms), and a batch
// with nothing due, which ends every pass, read it once per status (56,396 buffers, 534 ms). With this
// index, 8,024 buffers and 27 ms (the deletes themselves), and 19 buffers and 0.4 ms. Partial: a task
// gets an entry once it ends, and status changes of tasks that have not ended write none. Its status
// list is TERMINAL_STATES (domain/task-states.ts), which the purge names: the planner uses a partial
// index only for a query naming its list. Built in the release's transaction, as every migration is:
// writes to `tasks` wait while it is built (0.4 s at 2,000,000 tasks, half of them ended).
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`create index tasks_ended_at on tasks (status_timestamp) where status in ('completed', 'canceled', 'failed', 'rejected')`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists tasks_ended_at');
}

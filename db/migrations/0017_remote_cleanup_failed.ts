import type { Knex } from 'knex';

// The remote agent's housekeeping pass also cancels the remote tasks of local tasks that failed (a run
// that failed for good, or was refused what the remote sent, leaves its remote task running): one
// partial index over both states, which the pass's `status in (...)` can use, replaces 0014's.
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`create index tasks_canceled_or_failed_at on tasks (status_timestamp) where status in ('canceled', 'failed')`);
  await knex.raw('drop index if exists tasks_canceled_at');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`create index tasks_canceled_at on tasks (status_timestamp) where status = 'canceled'`);
  await knex.raw('drop index if exists tasks_canceled_or_failed_at');
}

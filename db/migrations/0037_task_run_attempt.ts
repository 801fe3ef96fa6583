import type { Knex } from 'knex';

// Which take of a run's job holds the task (db/tasks.ts beginRuns, claimRun). A job whose worker
// stalled past its lock (event loop blocked, Redis out of its reach) is taken again, perhaps by
// another worker, while the first copy may still be running: both were working under the same
// message, so both wrote replies and artifacts. Each take now counts one up, and a run writes,
// ends the task and stays running only while the count is still its own. A constant default adds
// the column without rewriting the table.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('alter table tasks add column run_attempt integer not null default 0');
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.dropColumn('run_attempt');
  });
}

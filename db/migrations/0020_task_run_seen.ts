import type { Knex } from 'knex';

// When a worker last said the run a working task is under is still going (workers/run-heartbeat.ts):
// job recovery tells a run going on from one whose queue job Redis lost. Null until a run has gone
// on for a heartbeat. A nullable column without a default: added without rewriting the table.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.timestamp('run_seen_at', { useTz: true });
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.dropColumn('run_seen_at');
  });
}

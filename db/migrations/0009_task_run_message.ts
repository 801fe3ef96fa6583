import type { Knex } from 'knex';

// The trigger message of the run that moved the task to working (db/tasks.ts beginRuns): a run job
// that finds the task working carries on only if it is that run's job (a re-run after a crash), so
// a task never has two runs, even when several user messages each enqueued one.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.uuid('run_message_id');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.dropColumn('run_message_id');
  });
}

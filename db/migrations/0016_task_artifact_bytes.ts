import type { Knex } from 'knex';

// The bytes of artifact updates a task holds (TASK_ARTIFACTS_MAX_BYTES), kept as they are added so
// a check costs no read of the task's timeline. Null until a task's first artifact under this
// release: tasks from before it are counted from their timeline then, so the migration reads nothing.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.bigInteger('artifact_bytes');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.dropColumn('artifact_bytes');
  });
}

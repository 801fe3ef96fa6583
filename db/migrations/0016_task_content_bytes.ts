import type { Knex } from 'knex';

// The bytes of messages (their parts) and of artifact updates a task holds (TASK_MESSAGES_MAX_BYTES,
// TASK_ARTIFACTS_MAX_BYTES), kept as they are added so a check reads no more than the task row. Null
// until first counted: a task from before this release is counted from its rows the first time one is
// checked, so the migration reads nothing.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.bigInteger('message_bytes');
    t.bigInteger('artifact_bytes');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.dropColumn('message_bytes');
    t.dropColumn('artifact_bytes');
  });
}

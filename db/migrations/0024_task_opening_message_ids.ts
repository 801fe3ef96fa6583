import type { Knex } from 'knex';

// The first message of a task created since this migration is marked `opens_task` when its sender gave
// it an id (A2A `messageId`, task API `client_message_id`), and no two such messages share an id: a
// send of a new task that is retried (its answer lost) finds the task the first one created instead
// of creating another, even when both copies arrive at once. A constant default: added without
// rewriting the table; tasks from before are not marked (their first sends are long past retrying).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.boolean('opens_task').notNullable().defaultTo(false);
  });
  await knex.raw('create unique index messages_opening_client_message_id on messages (client_message_id) where opens_task');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index messages_opening_client_message_id');
  await knex.schema.alterTable('messages', (t) => {
    t.dropColumn('opens_task');
  });
}

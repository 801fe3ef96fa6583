import type { Knex } from 'knex';

// The sender's own id for a message (A2A `messageId`, or `client_message_id` in the task API),
// kept apart from our UUID `id` because A2A allows any string and senders may reuse one.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.text('client_message_id');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.dropColumn('client_message_id');
  });
}

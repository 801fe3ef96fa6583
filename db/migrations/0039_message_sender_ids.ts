import type { Knex } from 'knex';

// A message sent to an existing task (POST /api/task/v1/{id}/message, A2A message/send with its
// messageId) is looked for among the task's earlier messages with its sender id (db/messages.ts
// findSameMessage), under the task's row lock. Found on (task_id, seq), that read every message of
// the task (5,001 rows for a task of 5,000), holding up every other write to the task meanwhile; with
// this index, the messages of that sender id alone. Partial: a message without a sender id writes no
// entry. Built in the release's transaction, as every migration is: writes to `messages` wait while
// it is built, a read of the table (0.45 s at 1,000,000 messages, half with a sender id).
export async function up(knex: Knex): Promise<void> {
  await knex.raw('create index messages_task_client_message_id on messages (task_id, client_message_id) where client_message_id is not null');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists messages_task_client_message_id');
}

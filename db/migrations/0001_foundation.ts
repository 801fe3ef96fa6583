import type { Knex } from 'knex';

// Timestamps are kept at millisecond precision so keyset cursors built from JSON timestamps
// compare exactly with the stored values.
const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('api_keys', (t) => {
    t.uuid('id').primary();
    t.text('name').notNullable();
    t.specificType('scopes', 'text[]').notNullable();
    t.binary('key_hash').notNullable().unique();
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'last_used_at');
    ts(t, 'revoked_at');
  });

  await knex.schema.createTable('contexts', (t) => {
    t.uuid('id').primary();
    ts(t, 'created_at').notNullable();
    t.index(['created_at', 'id']);
  });

  await knex.schema.createTable('tasks', (t) => {
    t.uuid('id').primary();
    t.uuid('context_id').notNullable().references('contexts.id');
    t.text('status').notNullable();
    ts(t, 'status_timestamp').notNullable();
    t.uuid('status_message_id');
    t.jsonb('metadata').notNullable().defaultTo('{}');
    ts(t, 'created_at').notNullable();
    ts(t, 'updated_at').notNullable();
    t.index(['created_at', 'id']);
    t.index(['context_id', 'created_at', 'id']);
    t.index(['status', 'created_at', 'id']);
  });

  // seq orders rows of one task by insertion; it is the keyset for messages and timelines.
  await knex.schema.createTable('messages', (t) => {
    t.uuid('id').primary();
    t.bigIncrements('seq', { primaryKey: false });
    t.uuid('task_id').notNullable().references('tasks.id').onDelete('CASCADE');
    t.text('role').notNullable();
    t.jsonb('parts').notNullable();
    t.specificType('reference_task_ids', 'uuid[]').notNullable().defaultTo('{}');
    t.jsonb('metadata').notNullable().defaultTo('{}');
    ts(t, 'created_at').notNullable();
    t.index(['task_id', 'seq']);
  });

  await knex.schema.createTable('timeline_items', (t) => {
    t.uuid('id').primary();
    t.bigIncrements('seq', { primaryKey: false });
    t.uuid('task_id').notNullable().references('tasks.id').onDelete('CASCADE');
    t.jsonb('event_payload').notNullable();
    ts(t, 'created_at').notNullable();
    t.index(['task_id', 'seq']);
  });

  // Jobs to enqueue, written in the same transaction as the change that needs them.
  await knex.schema.createTable('outbox', (t) => {
    t.uuid('id').primary();
    t.text('queue').notNullable();
    t.text('name').notNullable();
    t.jsonb('payload').notNullable();
    t.jsonb('options').notNullable().defaultTo('{}');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    t.index(['created_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['outbox', 'timeline_items', 'messages', 'tasks', 'contexts', 'api_keys']) await knex.schema.dropTableIfExists(table);
}

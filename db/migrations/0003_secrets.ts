import type { Knex } from 'knex';

const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  // A secret remembers both the alias it was stored under and the DEK that actually encrypted
  // it: reads decrypt with dek_id, so they keep working while an alias is being rotated.
  await knex.schema.createTable('secrets', (t) => {
    t.uuid('id').primary();
    t.text('key').notNullable().unique();
    t.text('encrypted_secret').notNullable();
    t.text('dek_id').notNullable().references('deks.id').onDelete('RESTRICT');
    t.text('dek_alias').notNullable();
    // Database time, so alias rotation can compare updated_at with its job's started_at.
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.index(['created_at', 'id']);
    // (alias, id): alias rotation walks the secrets of an alias in id order.
    t.index(['dek_alias', 'id']);
    t.index(['dek_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('secrets');
}

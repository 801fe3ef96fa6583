import type { Knex } from 'knex';

const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  // Id is the file name for local keys and the ARN for KMS keys, as the API names them.
  await knex.schema.createTable('envelope_keys', (t) => {
    t.text('id').primary();
    t.text('type').notNullable();
    t.text('file_name');
    t.text('arn');
    t.text('region');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    t.index(['created_at', 'id']);
  });

  await knex.schema.createTable('deks', (t) => {
    t.text('id').primary();
    t.text('envelope_key_id').notNullable().references('envelope_keys.id').onDelete('RESTRICT');
    t.text('encrypted_dek').notNullable();
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    // (envelope, id): the bulk migration walks an envelope's DEKs in id order.
    t.index(['envelope_key_id', 'id']);
    t.index(['envelope_key_id', 'created_at', 'id']);
  });

  await knex.schema.createTable('dek_aliases', (t) => {
    t.text('alias').primary();
    t.text('dek_id').notNullable().references('deks.id').onDelete('RESTRICT');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.index(['dek_id']);
  });

  // Long key work (bulk DEK migration, alias rotation). `cursor` is the last DEK id handled, so
  // a resumed job continues after it.
  await knex.schema.createTable('key_jobs', (t) => {
    t.uuid('id').primary();
    t.text('kind').notNullable();
    t.text('status').notNullable();
    t.integer('total').notNullable().defaultTo(0);
    t.integer('done').notNullable().defaultTo(0);
    t.integer('failed').notNullable().defaultTo(0);
    t.jsonb('errors').notNullable().defaultTo('[]');
    t.jsonb('params').notNullable().defaultTo('{}');
    t.text('source_envelope_key_id');
    t.text('cursor');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'started_at');
    ts(t, 'finished_at');
    t.index(['created_at', 'id']);
  });
  await knex.raw(`create unique index key_jobs_one_running_migrate on key_jobs (source_envelope_key_id)
    where kind = 'migrate-deks' and status in ('queued', 'running')`);
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['key_jobs', 'dek_aliases', 'deks', 'envelope_keys']) await knex.schema.dropTableIfExists(table);
}

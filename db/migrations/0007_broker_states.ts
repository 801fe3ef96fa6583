import type { Knex } from 'knex';

const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  // OAuth authorization-code brokering in progress (domain/bridge/brokering.ts). The state sent to
  // the provider is kept only as its SHA-256 (the authorize URL that carries it is not kept), so a
  // database reader cannot complete a flow; the PKCE verifier is useless without the code, which
  // only the callback receives, and the client secret (encrypted). The callback deletes the row.
  await knex.schema.createTable('broker_states', (t) => {
    t.uuid('id').primary();
    t.text('state_hash').notNullable().unique();
    t.text('provider_instance_id').notNullable().references('provider_instances.id').onDelete('CASCADE');
    t.text('code_verifier').notNullable();
    t.jsonb('metadata').notNullable().defaultTo('{}');
    ts(t, 'expires_at').notNullable();
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.index(['provider_instance_id']);
    t.index(['expires_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('broker_states');
}

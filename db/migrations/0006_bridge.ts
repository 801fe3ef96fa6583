import type { Knex } from 'knex';

const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  // Resource server and user credentials share one shape. `value` is the controller's
  // configuration with every sensitive member replaced by its ciphertext under dek_id, so the
  // row can be listed and exported without ever holding a raw secret.
  await knex.schema.createTable('bridge_credentials', (t) => {
    t.uuid('id').primary();
    t.text('kind').notNullable().checkIn(['resource_server', 'user']);
    t.text('provider_controller_type_id').notNullable();
    t.text('type_id').notNullable();
    t.jsonb('value').notNullable();
    t.jsonb('metadata').notNullable().defaultTo('{}');
    t.text('dek_id').notNullable().references('deks.id').onDelete('RESTRICT');
    t.text('dek_alias').notNullable();
    ts(t, 'next_rotation_time');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.index(['dek_id']);
  });

  await knex.schema.createTable('provider_instances', (t) => {
    t.text('id').primary();
    t.text('display_name').notNullable();
    t.text('provider_controller_type_id').notNullable();
    t.text('credential_controller_type_id').notNullable();
    t.text('status').notNullable().checkIn(['brokering_initiated', 'active', 'disabled', 'refresh_failed']);
    t.uuid('resource_server_credential_id').references('bridge_credentials.id').onDelete('RESTRICT');
    t.uuid('user_credential_id').references('bridge_credentials.id').onDelete('RESTRICT');
    t.jsonb('return_on_successful_brokering');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.index(['created_at', 'id']);
    t.index(['resource_server_credential_id']);
    t.index(['user_credential_id']);
  });

  await knex.schema.createTable('function_instances', (t) => {
    t.text('provider_instance_id').notNullable().references('provider_instances.id').onDelete('CASCADE');
    t.text('function_controller_type_id').notNullable();
    t.text('provider_controller_type_id').notNullable();
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.primary(['provider_instance_id', 'function_controller_type_id']);
    t.index(['created_at', 'provider_instance_id', 'function_controller_type_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('function_instances');
  await knex.schema.dropTableIfExists('provider_instances');
  await knex.schema.dropTableIfExists('bridge_credentials');
}

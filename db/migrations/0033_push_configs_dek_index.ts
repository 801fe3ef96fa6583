import type { Knex } from 'knex';

// Deleting a DEK (a rotation that ends canceled or failed deletes the one it made) checks that no
// push config's secrets are sealed with it: without an index that check read every push config, while
// the ending job's row was locked. Built in the release's transaction, as every migration is, so a
// failed release still leaves the schema as it was.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('create index push_configs_secrets_dek_id on push_configs (secrets_dek_id) where secrets_dek_id is not null');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists push_configs_secrets_dek_id');
}

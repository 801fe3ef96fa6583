import type { Knex } from 'knex';

// GET /api/bridge/v1/credential pages newest first by (created_at, id), as every other list does
// on its own index; without one each page sorted every credential.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('bridge_credentials', (t) => { t.index(['created_at', 'id']); });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('bridge_credentials', (t) => { t.dropIndex(['created_at', 'id']); });
}

import type { Knex } from 'knex';

// The ids of deleted DEKs (db/deks.ts deleteUnusedDek writes one in the delete's transaction). A
// process may hold a deleted DEK's key in its cache, keyed by id, for DEK_CACHE_TTL_MS after a
// cache-drop note it missed: a new DEK under that id would have values sealed with the old key and
// recorded as the new one's, unreadable for ever. So an id here is never given to a DEK again.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('deleted_deks', (t) => {
    t.text('id').primary();
    t.timestamp('deleted_at', { useTz: true, precision: 3 }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTableIfExists('deleted_deks');
}

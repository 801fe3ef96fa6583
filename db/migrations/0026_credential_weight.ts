import type { Knex } from 'knex';

// What a bridge credential weighs in an answer that shows it (its value and metadata at the most
// their JSON text can weigh parsed, db/messages.ts textWeightBound), kept by Postgres: provider lists
// count it at every instance that names it, and would otherwise turn each shared megabyte into text
// again for every row they consider. Generated, so processes from before write it too; adding it
// rewrites bridge_credentials (a small table: one row per configured credential).
export async function up(knex: Knex): Promise<void> {
  await knex.raw('alter table bridge_credentials add column weight bigint generated always as (12::bigint * (octet_length(value::text) + octet_length(metadata::text))) stored');
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('bridge_credentials', (t) => { t.dropColumn('weight'); });
}

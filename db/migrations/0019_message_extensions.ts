import type { Knex } from 'knex';

// The A2A extensions a message says it uses (A2A Message.extensions: URIs), kept as sent; null when
// it named none. A nullable column without a default: added without rewriting the table.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.specificType('extensions', 'text[]');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.dropColumn('extensions');
  });
}

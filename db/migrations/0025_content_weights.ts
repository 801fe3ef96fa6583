import type { Knex } from 'knex';

// What a message or timeline item weighs once parsed (domain/storable-json.ts parsedWeight), written
// with it: reads that hand out a budget of them sum it instead of walking every JSON value. Null for
// rows from before, which reads bound from their text (db/messages.ts). No default: added without
// rewriting either table.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => { t.bigInteger('weight'); });
  await knex.schema.alterTable('timeline_items', (t) => { t.bigInteger('weight'); });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => { t.dropColumn('weight'); });
  await knex.schema.alterTable('timeline_items', (t) => { t.dropColumn('weight'); });
}

import type { Knex } from 'knex';

// The media types the sender of a message accepts for the reply's parts (A2A
// configuration.acceptedOutputModes), for the agent that answers it to tailor its output; null when
// it named none. Nullable, no default: added without rewriting the table.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.specificType('accepted_output_modes', 'text[]');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('messages', (t) => {
    t.dropColumn('accepted_output_modes');
  });
}

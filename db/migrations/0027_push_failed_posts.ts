import type { Knex } from 'knex';

// Failed posts of a config's next undelivered update (the one after delivered_seq): PUSH_ATTEMPTS
// counts posts of each update, whichever of the config's delivery jobs made them.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('push_configs', (t) => { t.integer('failed_posts').notNullable().defaultTo(0); });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('push_configs', (t) => { t.dropColumn('failed_posts'); });
}

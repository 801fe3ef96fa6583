import type { Knex } from 'knex';

// An admin's disable kept beside the status: a failed refresh shows `refresh_failed` over it, and
// brokering again must bring back `disabled`, not `active`.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('provider_instances', (t) => { t.boolean('disabled_by_admin').notNullable().defaultTo(false); });
  await knex('provider_instances').where({ status: 'disabled' }).update({ disabled_by_admin: true });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('provider_instances', (t) => { t.dropColumn('disabled_by_admin'); });
}

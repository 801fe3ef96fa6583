import type { Knex } from 'knex';

// When a credential refresh gave up on the instance (null while it is usable): a refresh that stores
// new tokens revives only instances marked since its run read the credential, and updated_at, which
// it went by, is also moved by a PATCH. Instances already refresh_failed keep null: only brokering
// revives them.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('alter table provider_instances add column refresh_failed_at timestamptz');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('alter table provider_instances drop column if exists refresh_failed_at');
}

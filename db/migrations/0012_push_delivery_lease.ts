import type { Knex } from 'knex';

// A delivery run holds its config by a lease instead of a row lock: the run posts to a webhook for
// up to tens of seconds, and a row lock held that long made a config set (which locks the task
// first) wait, and with it every status change of the task.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('push_configs', (t) => {
    t.uuid('lease_id').nullable();
    t.timestamp('lease_until', { useTz: true }).nullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('push_configs', (t) => {
    t.dropColumn('lease_id');
    t.dropColumn('lease_until');
  });
}

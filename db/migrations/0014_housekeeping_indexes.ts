import type { Knex } from 'knex';

// Indexes for two periodic passes that read a large table to return a few rows (measured at a
// million tasks): the remote agent's pass over tasks canceled in the last day (a bitmap over every
// canceled task, 105 ms a pass; 0.7 ms with this), and the credential refresh pass over due user
// credentials (a sequential scan of every credential).
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`create index tasks_canceled_at on tasks (status_timestamp) where status = 'canceled'`);
  await knex.raw(`create index bridge_credentials_user_rotation on bridge_credentials (next_rotation_time) where kind = 'user'`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists tasks_canceled_at');
  await knex.raw('drop index if exists bridge_credentials_user_rotation');
}

import type { Knex } from 'knex';

// The last local message forwarded to a remote agent's task: a run that finds the remote task still
// running follows it only if it was sent this run's message (a retry after the send); another
// message (a client answered while an earlier run was going) is sent on.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('remote_agent_tasks', (t) => {
    t.uuid('last_message_id');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('remote_agent_tasks', (t) => {
    t.dropColumn('last_message_id');
  });
}

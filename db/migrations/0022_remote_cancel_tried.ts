import type { Knex } from 'knex';

// When a worker last took a left remote task to cancel (workers/agents/remote-a2a.ts housekeeping):
// every worker of a fleet runs the pass, and each used to cancel the same remote tasks; a worker
// now takes a task only if none tried it within the retry interval. Nullable, no default: no rewrite.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('remote_agent_tasks', (t) => {
    t.timestamp('cancel_tried_at', { useTz: true, precision: 3 });
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('remote_agent_tasks', (t) => {
    t.dropColumn('cancel_tried_at');
  });
}

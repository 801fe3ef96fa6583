import type { Knex } from 'knex';

// The remote task's interruption (input-required, auth-required) that the last answer forwarded to
// it answers, as the remote showed it when the answer went out: its state, time stamp and status
// message id, with the answer's message id. A retry of that answer's send that finds the remote
// showing it still knows the answer is not taken up yet, where the remote's history cannot say (it
// keeps no history, or its status messages out of it). Null until a turn answers a question.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('alter table remote_agent_tasks add column answering jsonb');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('alter table remote_agent_tasks drop column if exists answering');
}

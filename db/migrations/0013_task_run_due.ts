import type { Knex } from 'knex';

// The user message a task is owed a run for, from the moment it should start one (a task opened
// by a user message; a user message to a task waiting for input) until a run starts or the task's
// status changes otherwise. Job recovery (db/tasks.ts listRunsToCheck) reads only these tasks
// through the partial index: it used to walk every task, and look up the messages of every open one
// (660 ms a pass at a million tasks, on every worker every JOB_RECOVERY_MS).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('tasks', (t) => {
    t.uuid('run_due_message_id');
  });
  // The tasks owed a run now, by the rule recovery applied until this migration.
  await knex.raw(`
    update tasks t set run_due_message_id = m.id
      from tasks o
      join lateral (select id, role from messages
                     where task_id = o.id
                       and (o.status = 'submitted'
                            or (role = 'user' and coalesce(seq > (select sm.seq from messages sm where sm.id = o.status_message_id),
                                                           created_at > o.status_timestamp)))
                     order by seq limit 1) m on true
     where t.id = o.id and o.status in ('submitted', 'input-required', 'auth-required') and m.role = 'user'`);
  await knex.raw('create index tasks_run_due on tasks (created_at, id) where run_due_message_id is not null');
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop index if exists tasks_run_due');
  await knex.schema.alterTable('tasks', (t) => {
    t.dropColumn('run_due_message_id');
  });
}

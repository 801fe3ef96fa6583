import type { Knex } from 'knex';

const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  // A2A push notification configs. Ids are client-chosen strings (A2A), unique per task.
  // delivered_seq is the last timeline seq delivered (or given up) to this webhook: deliveries
  // go out strictly in timeline order after it.
  await knex.schema.createTable('push_configs', (t) => {
    t.uuid('task_id').notNullable().references('tasks.id').onDelete('CASCADE');
    t.text('id').notNullable();
    t.text('url').notNullable();
    t.text('token');
    t.jsonb('authentication');
    t.bigInteger('delivered_seq').notNullable().defaultTo(0);
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.primary(['task_id', 'id']);
  });

  // The remote A2A task that mirrors a local task (AGENT_KIND=remote): follow-up turns of the
  // local task continue the same remote task.
  await knex.schema.createTable('remote_agent_tasks', (t) => {
    t.uuid('task_id').primary().references('tasks.id').onDelete('CASCADE');
    t.text('remote_task_id').notNullable();
    t.text('remote_context_id');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  for (const table of ['remote_agent_tasks', 'push_configs']) await knex.schema.dropTableIfExists(table);
}

import type { Knex } from 'knex';

const ts = (t: Knex.CreateTableBuilder, name: string) => t.timestamp(name, { useTz: true, precision: 3 });

export async function up(knex: Knex): Promise<void> {
  // A2A push notification configs. Ids are client-chosen strings (A2A), unique per task. The
  // token and authentication credentials are stored only encrypted (a JSON object sealed with the
  // DEK secrets_dek_id); `authentication` keeps the schemes. delivered_seq is the last timeline seq
  // delivered (or given up) to this webhook: deliveries go out strictly in timeline order after it.
  await knex.schema.createTable('push_configs', (t) => {
    t.uuid('task_id').notNullable().references('tasks.id').onDelete('CASCADE');
    t.text('id').notNullable();
    t.text('url').notNullable();
    t.jsonb('authentication');
    t.text('encrypted_secrets');
    t.text('secrets_dek_id').references('deks.id').onDelete('RESTRICT');
    t.bigInteger('delivered_seq').notNullable().defaultTo(0);
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
    ts(t, 'updated_at').notNullable().defaultTo(knex.fn.now());
    t.primary(['task_id', 'id']);
  });

  // Fan-out of status updates to push configs, inside whatever statement writes the status
  // update (several status changes are single statements without a transaction): one outbox row
  // per config, so no update of a task with push configs can be lost, and for the usual task
  // without configs the cost is one index probe inside Postgres instead of a round trip.
  // The NOTIFY (sent on commit) lets workers relay the rows at once instead of at the next sweep.
  await createRowFanout(knex);

  // The remote A2A task that mirrors a local task (AGENT_KIND=remote): follow-up turns of the
  // local task continue the same remote task.
  await knex.schema.createTable('remote_agent_tasks', (t) => {
    t.uuid('task_id').primary().references('tasks.id').onDelete('CASCADE');
    t.text('remote_task_id').notNullable();
    t.text('remote_context_id');
    ts(t, 'created_at').notNullable().defaultTo(knex.fn.now());
  });
}

// Kept as a function: migration 0011 replaces it with a per-statement trigger and restores it on the way down.
export async function createRowFanout(knex: Knex): Promise<void> {
  await knex.raw(`
    create function push_deliveries_fanout() returns trigger language plpgsql as $$
    declare r record;
    begin
      for r in
        insert into outbox (id, queue, name, payload)
        select gen_random_uuid(), 'push-notifications', 'deliver',
               jsonb_build_object('task_id', c.task_id, 'config_id', c.id, 'timeline_seq', new.seq)
        from push_configs c where c.task_id = new.task_id
        returning id, payload
      loop
        perform pg_notify('push_deliveries', json_build_object('id', r.id, 'payload', r.payload)::text);
      end loop;
      return null;
    end $$`);
  await knex.raw(`
    create trigger timeline_items_push_fanout after insert on timeline_items
    for each row when (new.event_payload->>'type' = 'task-status-update')
    execute function push_deliveries_fanout()`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists timeline_items_push_fanout on timeline_items');
  await knex.raw('drop function if exists push_deliveries_fanout()');
  for (const table of ['remote_agent_tasks', 'push_configs']) await knex.schema.dropTableIfExists(table);
}

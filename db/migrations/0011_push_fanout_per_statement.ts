import type { Knex } from 'knex';
import { createRowFanout } from './0004_push_notifications.ts';

// The push fan-out of migration 0004, run once per statement instead of once per row: the hot
// task statements (db/tasks.ts) write the status items of many tasks at a time, and a PL/pgSQL
// call per status item was about a seventh of Postgres's CPU per task under load. Same rows, same
// order (by timeline seq, then config), same notifications.
export async function up(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists timeline_items_push_fanout on timeline_items');
  await knex.raw('drop function if exists push_deliveries_fanout()');
  await createStatementFanout(knex);
  await knex.raw(`
    create trigger timeline_items_push_fanout after insert on timeline_items
    referencing new table as new_items
    for each statement execute function push_deliveries_fanout()`);
}

// Kept as a function: migration 0029 replaces it and restores it on the way down.
export async function createStatementFanout(knex: Knex): Promise<void> {
  await knex.raw(`
    create or replace function push_deliveries_fanout() returns trigger language plpgsql as $$
    declare r record;
    begin
      for r in
        insert into outbox (id, queue, name, payload)
        select gen_random_uuid(), 'push-notifications', 'deliver',
               jsonb_build_object('task_id', c.task_id, 'config_id', c.id, 'timeline_seq', n.seq)
          from new_items n join push_configs c on c.task_id = n.task_id
         where n.event_payload->>'type' = 'task-status-update'
         order by n.seq, c.id
        returning id, payload
      loop
        perform pg_notify('push_deliveries', json_build_object('id', r.id, 'payload', r.payload)::text);
      end loop;
      return null;
    end $$`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('drop trigger if exists timeline_items_push_fanout on timeline_items');
  await knex.raw('drop function if exists push_deliveries_fanout()');
  await createRowFanout(knex);
}

import type { Knex } from 'knex';

// The push fan-out (a trigger on every statement that writes timeline items: intake, run starts, status
// changes) ends at once when none of the statement's tasks has a push config, which is so for every
// intake statement (a config needs its task's row first) and for most tasks. Before, it grouped the
// statement's items, and locked, updated and inserted nothing at the cost of a plan run:
// 0.25 ms a statement under the A2A bench, 0.06 after (pg_stat_statements, track = all).
// Its result is the same: every status item is written by a statement that locks its task's row,
// and every config write takes that row first, so no config of these tasks commits between the
// check and the query (one written earlier in the transaction is seen by both).
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    create or replace function push_deliveries_fanout() returns trigger language plpgsql as $$
    declare r record;
    begin
      -- No config of any task the statement wrote to: nothing to fan out (a new task has none yet).
      if not exists (select 1 from push_configs c where c.task_id in (select task_id from new_items)) then
        return null;
      end if;
      for r in
        with newest as (select task_id, max(seq) as seq from new_items
                         where event_payload->>'type' = 'task-status-update' group by task_id),
        locked as (select c.task_id, c.id, n.seq from push_configs c join newest n on n.task_id = c.task_id
                    order by c.task_id, c.id for update of c),
        configs as (
          update push_configs c set status_seq = greatest(c.status_seq, l.seq)
            from locked l where c.task_id = l.task_id and c.id = l.id
          returning c.task_id, c.id)
        insert into outbox (id, queue, name, payload)
        select gen_random_uuid(), 'push-notifications', 'deliver',
               jsonb_build_object('task_id', c.task_id, 'config_id', c.id, 'timeline_seq', n.seq)
          from new_items n join configs c on c.task_id = n.task_id
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
  // As migration 0029 left it.
  await knex.raw(`
    create or replace function push_deliveries_fanout() returns trigger language plpgsql as $$
    declare r record;
    begin
      for r in
        with newest as (select task_id, max(seq) as seq from new_items
                         where event_payload->>'type' = 'task-status-update' group by task_id),
        locked as (select c.task_id, c.id, n.seq from push_configs c join newest n on n.task_id = c.task_id
                    order by c.task_id, c.id for update of c),
        configs as (
          update push_configs c set status_seq = greatest(c.status_seq, l.seq)
            from locked l where c.task_id = l.task_id and c.id = l.id
          returning c.task_id, c.id)
        insert into outbox (id, queue, name, payload)
        select gen_random_uuid(), 'push-notifications', 'deliver',
               jsonb_build_object('task_id', c.task_id, 'config_id', c.id, 'timeline_seq', n.seq)
          from new_items n join configs c on c.task_id = n.task_id
         where n.event_payload->>'type' = 'task-status-update'
         order by n.seq, c.id
        returning id, payload
      loop
        perform pg_notify('push_deliveries', json_build_object('id', r.id, 'payload', r.payload)::text);
      end loop;
      return null;
    end $$`);
}

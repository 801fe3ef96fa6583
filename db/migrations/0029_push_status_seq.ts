import type { Knex } from 'knex';
import { createStatementFanout } from './0011_push_fanout_per_statement.ts';

// The push recovery pass (workers/recover-push-deliveries.ts) looked for undelivered updates among
// every config ever set, those of ended tasks included (kept for ever by default): a sequential scan
// of push_configs and a timeline probe per config, 0.5-0.9 s at 200,000 configs, in every worker at
// every JOB_RECOVERY_MS. status_seq is the seq of the newest status update of the config's task,
// kept by the fan-out (which already joins the task's configs); a config has updates undelivered
// exactly when it is past delivered_seq, and only such configs are in the partial index.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('push_configs', (t) => { t.bigInteger('status_seq').notNullable().defaultTo(0); });
  // Left at 0 where every status update is delivered: only a later one has to move it past delivered_seq.
  await knex.raw(`
    update push_configs c set status_seq = u.seq
      from (select c2.task_id, c2.id, (select max(t.seq) from timeline_items t
                                        where t.task_id = c2.task_id and t.seq > c2.delivered_seq
                                          and t.event_payload->>'type' = 'task-status-update') as seq
              from push_configs c2) u
     where u.task_id = c.task_id and u.id = c.id and u.seq is not null`);
  await knex.raw('create index push_configs_undelivered on push_configs (task_id, id) where status_seq > delivered_seq');
  // The status statement's configs are updated and then fanned out to in one statement. They stay
  // locked until the statement's transaction ends, taken in (task_id, id) order, the order every
  // writer of several configs takes them in (alias rotation's reencryptPushConfigs): two such
  // writers wait for each other, never in a cycle (a deadlock). Delivery runs write one at a time.
  await createStatusSeqFanout(knex);
}

// The fan-out function as this migration makes it; `opening`: statements run first (migration 0031's early exit).
export async function createStatusSeqFanout(knex: Knex, opening = ''): Promise<void> {
  await knex.raw(`
    create or replace function push_deliveries_fanout() returns trigger language plpgsql as $$
    declare r record;
    begin${opening}
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
  await createStatementFanout(knex);
  await knex.raw('drop index if exists push_configs_undelivered');
  await knex.schema.alterTable('push_configs', (t) => { t.dropColumn('status_seq'); });
}

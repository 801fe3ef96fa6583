import type { Tx } from './knex.ts';
import type { TimelineRow } from './timeline.ts';
import { itemWeightSql } from './messages.ts';
import { batchWithinBytes, type Budget } from './pagination.ts';
import { addOutbox } from './outbox.ts';

// Channel of the NOTIFY sent for each delivery job the fan-out trigger writes to the outbox.
export const PUSH_DELIVERIES_CHANNEL = 'push_deliveries';

export interface PushConfigRow {
  task_id: string; id: string; url: string; authentication: { schemes: string[] } | null;
  encrypted_secrets: string | null; secrets_dek_id: string | null; delivered_seq: number; failed_posts: number; created_at: Date; updated_at: Date;
  // The newest status update of the task (kept by the fan-out trigger, migration 0029): past
  // delivered_seq while the config has updates undelivered.
  status_seq: number;
  lease_id?: string | null; lease_until?: Date | null;
}

// Where a new config's deliveries start: 'beginning', every update of the task (a config that comes
// with the task's creation); 'now', only later updates; 'current status', the task's newest status
// update and the later ones. Replacing a config keeps its delivery position, and gives the pending
// update fresh attempts without the old target's hold (a webhook fixed by setting it again).
// The fan-out trigger keeps status_seq from then on; a new config starts at the task's newest status update.
export type DeliveryStart = 'beginning' | 'now' | 'current status';

export async function upsertPushConfig(
  db: Tx,
  row: Pick<PushConfigRow, 'task_id' | 'id' | 'url' | 'authentication' | 'encrypted_secrets' | 'secrets_dek_id'>,
  start: DeliveryStart = 'now',
): Promise<{ row: PushConfigRow; created: boolean }> {
  const now = new Date();
  const statusSeq = db.raw(`coalesce((select max(seq) from timeline_items where task_id = ? and event_payload->>'type' = 'task-status-update'), 0)`, [row.task_id]);
  const deliveredSeq = {
    beginning: 0,
    now: db.raw('coalesce((select max(seq) from timeline_items where task_id = ?), 0)', [row.task_id]),
    // Just before the newest status update: that one is undelivered, nothing earlier is.
    'current status': db.raw(`greatest(?::bigint - 1, 0)`, [statusSeq]),
  }[start];
  const [out] = await db('push_configs')
    .insert({
      ...row,
      authentication: row.authentication === null ? null : JSON.stringify(row.authentication),
      delivered_seq: deliveredSeq,
      status_seq: statusSeq,
      created_at: now,
      updated_at: now,
    })
    .onConflict(['task_id', 'id'])
    .merge({
      url: db.raw('excluded.url'), authentication: db.raw('excluded.authentication'), encrypted_secrets: db.raw('excluded.encrypted_secrets'),
      secrets_dek_id: db.raw('excluded.secrets_dek_id'), updated_at: db.raw('excluded.updated_at'), failed_posts: 0,
      // A hold has no lease id; a run's lease is left to it.
      lease_until: db.raw('case when push_configs.lease_id is null then null else push_configs.lease_until end'),
    })
    // xmax is 0 only on a row this statement inserted (a merged one carries this transaction's id):
    // not documented by Postgres, but the usual way to tell an upsert's insert from its update.
    .returning(['*', db.raw('(xmax = 0) as created')]);
  const { created, ...config } = out as PushConfigRow & { created: boolean };
  return { row: config, created };
}

// A delivery job for a config's updates up to `seq`, relayed once the transaction commits as the
// fan-out trigger's are (an outbox row, and a NOTIFY the workers listen for).
export async function enqueueDelivery(db: Tx, taskId: string, configId: string, seq: number): Promise<void> {
  const payload = { task_id: taskId, config_id: configId, timeline_seq: seq };
  const row = await addOutbox(db, 'push-notifications', 'deliver', payload);
  await db.raw('select pg_notify(?, ?)', [PUSH_DELIVERIES_CHANNEL, JSON.stringify({ id: row.id, payload })]);
}

export async function getPushConfig(db: Tx, taskId: string, id?: string): Promise<PushConfigRow | undefined> {
  const q = db('push_configs').where({ task_id: taskId });
  if (id !== undefined) q.where({ id });
  // Without an id: the task's own config (its id is the task's) comes first.
  else q.orderByRaw('(id = ?) desc', [taskId]);
  return q.orderBy([{ column: 'created_at', order: 'asc' }, { column: 'id', order: 'asc' }]).first();
}

export async function listPushConfigs(db: Tx, taskId: string): Promise<PushConfigRow[]> {
  return db('push_configs').where({ task_id: taskId }).orderBy([{ column: 'created_at', order: 'asc' }, { column: 'id', order: 'asc' }]);
}

// How many configs a task has besides the one named `id`.
export async function countOtherPushConfigs(db: Tx, taskId: string, id: string): Promise<number> {
  const [{ n }] = await db('push_configs').where({ task_id: taskId }).whereNot({ id }).count({ n: '*' });
  return Number(n);
}

export async function deletePushConfig(db: Tx, taskId: string, id: string): Promise<boolean> {
  return (await db('push_configs').where({ task_id: taskId, id }).delete()) > 0;
}

const leaseEnd = (db: Tx, ms: number) => db.raw(`now() + make_interval(secs => ?)`, [ms / 1000]);

// Leases one config to a delivery run for `ms` so deliveries to it never overlap; undefined when
// another run holds an unexpired lease (or the config is gone). No lock is held meanwhile.
export async function leasePushConfig(db: Tx, taskId: string, id: string, leaseId: string, ms: number): Promise<PushConfigRow | undefined> {
  const [row] = await db('push_configs')
    .where({ task_id: taskId, id })
    .where((q) => q.whereNull('lease_until').orWhere('lease_until', '<', db.fn.now()))
    .update({ lease_id: leaseId, lease_until: leaseEnd(db, ms) })
    .returning('*');
  return row;
}

export async function releasePushConfig(db: Tx, taskId: string, id: string, leaseId: string): Promise<void> {
  await db('push_configs').where({ task_id: taskId, id, lease_id: leaseId }).update({ lease_id: null, lease_until: null });
}

// Extends a run's lease by `ms` from now; false when the lease is no longer the run's (another run
// took the config after it ran out, or the config was deleted).
export async function renewPushConfigLease(db: Tx, taskId: string, id: string, leaseId: string, ms: number): Promise<boolean> {
  return (await db('push_configs').where({ task_id: taskId, id, lease_id: leaseId }).update({ lease_until: leaseEnd(db, ms) })) > 0;
}

// Holds a run's config for `ms` from now (a webhook's Retry-After): no run's lease any more
// (lease_id null), yet leasePushConfig refuses it until then. Only the config as the run posted to it
// (`postedTo`: its updated_at, which only a set changes): one set again meanwhile is released, not held for the old URL.
export async function holdPushConfig(db: Tx, taskId: string, id: string, leaseId: string, ms: number, postedTo: Date): Promise<void> {
  await db('push_configs').where({ task_id: taskId, id, lease_id: leaseId })
    .update({ lease_id: null, lease_until: db.raw('case when updated_at = ? then ? else null end', [postedTo, leaseEnd(db, ms)]) });
}

// Of a config leasePushConfig refused: how many ms a hold (holdPushConfig) has left, 0 when a run
// leases it instead (or it came free meanwhile); undefined when the config is gone.
export async function pushConfigHoldMs(db: Tx, taskId: string, id: string): Promise<number | undefined> {
  const row = await db('push_configs').where({ task_id: taskId, id })
    .first(db.raw(`case when lease_id is null and lease_until > now() then ceil(extract(epoch from lease_until - now()) * 1000) else 0 end as hold_ms`));
  return row && Number(row.hold_ms);
}

// Counts a failed post of the config's next update (the one after delivered_seq) by the run holding
// its lease; returns how many of its posts have failed, undefined when the lease is no longer the run's
// or the config was set again since the post went out (`postedTo`, as holdPushConfig): the new URL's
// attempts are its own.
export async function countFailedPost(db: Tx, taskId: string, id: string, leaseId: string, postedTo: Date): Promise<number | undefined> {
  const [row] = await db('push_configs').where({ task_id: taskId, id, lease_id: leaseId, updated_at: postedTo })
    .update({ failed_posts: db.raw('failed_posts + 1') })
    .returning('failed_posts');
  return row?.failed_posts;
}

// Records a delivered (or given up) update, so the next one starts with no failed posts, and extends the run's lease by `ms`; returns the config as it is now
// (a set meanwhile may have changed its URL or token), undefined when the lease is no longer the
// run's (it ran out and another run took the config, or the config was deleted).
export async function setDeliveredSeq(db: Tx, taskId: string, id: string, seq: number, leaseId: string, ms: number): Promise<PushConfigRow | undefined> {
  const [row] = await db('push_configs').where({ task_id: taskId, id, lease_id: leaseId })
    .update({
      delivered_seq: db.raw('greatest(delivered_seq, ?)', [seq]),
      failed_posts: db.raw('case when ? > delivered_seq then 0 else failed_posts end', [seq]),
      lease_until: leaseEnd(db, ms),
    })
    .returning('*');
  return row;
}

// Passes over a config's updates up to `seq` without posting them (push notifications off), whichever
// run leases it: delivered_seq only moves forward.
export async function skipUpdatesUpTo(db: Tx, taskId: string, id: string, seq: number): Promise<void> {
  await db('push_configs').where({ task_id: taskId, id }).where('delivered_seq', '<', seq).update({ delivered_seq: seq, failed_posts: 0 });
}

// Status updates of a task after a timeline position, oldest first: what a webhook has not seen.
export async function statusItemsAfter(db: Tx, taskId: string, afterSeq: number, limit: number): Promise<TimelineRow[]> {
  return db('timeline_items')
    .select('id', 'seq', 'task_id', 'event_payload', 'created_at')
    .where({ task_id: taskId })
    .where('seq', '>', afterSeq)
    .whereRaw(`event_payload->>'type' = 'task-status-update'`)
    .orderBy('seq', 'asc')
    .limit(limit);
}

export interface StalledDelivery { task_id: string; config_id: string; seq: number }

// Configs with status updates still undelivered whose newest is older than `olderThanMs`, that no
// run holds (lease) and no unsent outbox row will bring a job for: each with that newest update's seq.
// Only configs with updates undelivered are read (the partial index push_configs_undelivered), not
// the many of ended tasks, all delivered.
export async function listStalledDeliveries(db: Tx, olderThanMs: number, limit: number): Promise<StalledDelivery[]> {
  const { rows } = await db.raw(
    `select c.task_id, c.id as config_id, c.status_seq as seq
       from push_configs c
      where c.status_seq > c.delivered_seq
        -- A subquery per config read: as a join, the planner (which cannot tell how few configs are
        -- past delivered_seq) hashed the whole timeline.
        and (select t.created_at from timeline_items t where t.task_id = c.task_id and t.seq = c.status_seq) < now() - make_interval(secs => ?)
        and (c.lease_until is null or c.lease_until < now())
        and not exists (select 1 from outbox o where o.queue = 'push-notifications'
                          and o.payload->>'task_id' = c.task_id::text and o.payload->>'config_id' = c.id)
      limit ?`,
    [olderThanMs / 1000, limit],
  );
  return (rows as { task_id: string; config_id: string; seq: string | number }[]).map((r) => ({ ...r, seq: Number(r.seq) }));
}

// A task's messages and artifact updates as they stood at a timeline position: what a pushed
// snapshot of the task at that status shows. Messages: the newest within `history.limit` and
// `history.maxBytes` (weighed as parsed), and always the newest one, oldest first.
export async function timelineAt(db: Tx, taskId: string, uptoSeq: number, history: { limit: number; maxBytes: number }): Promise<{ messages: TimelineRow[]; artifacts: TimelineRow[] }> {
  const columns = ['id', 'seq', 'task_id', 'event_payload', 'created_at'];
  const base = () => db('timeline_items').select(columns).where({ task_id: taskId }).where('seq', '<=', uptoSeq);
  const newest = base().select(db.raw(`${itemWeightSql('timeline_items')} as _w`)).whereRaw(`event_payload->>'type' = 'message'`).orderBy('seq', 'desc').limit(history.limit).as('l');
  const weighed = db.select('*', db.raw('sum(_w) over (order by seq desc) as upto'), db.raw('row_number() over (order by seq desc) as n'))
    .from(newest).as('w');
  const [messages, artifacts] = await Promise.all([
    db.select(columns).from(weighed).where((q) => q.where('n', 1).orWhere('upto', '<=', history.maxBytes)).orderBy('seq', 'asc'),
    base().whereRaw(`event_payload->>'type' = 'artifact-update'`).orderBy('seq', 'asc'),
  ]);
  return { messages, artifacts };
}

// Rotation of the push alias (domain/alias-rotation.ts): configs whose secrets are not under
// `newDekId`, in key order after `after`.
export async function pushConfigsToRotate(
  db: Tx, newDekId: string, after: { task_id: string; id: string } | null, batch: Budget,
): Promise<{ task_id: string; id: string; secrets_dek_id: string; encrypted_secrets: string }[]> {
  const q = db('push_configs').select('task_id', 'id', 'secrets_dek_id', 'encrypted_secrets')
    .whereNotNull('encrypted_secrets').whereNot({ secrets_dek_id: newDekId })
    .orderBy([{ column: 'task_id' }, { column: 'id' }]);
  if (after) q.whereRaw('(task_id, id) > (?::uuid, ?)', [after.task_id, after.id]);
  return batchWithinBytes(db, q, ['task_id', 'id'], 'octet_length(encrypted_secrets)', batch);
}

export async function countPushConfigsToRotate(db: Tx, newDekId: string): Promise<number> {
  const [{ n }] = await db('push_configs').whereNotNull('encrypted_secrets').whereNot({ secrets_dek_id: newDekId }).count({ n: '*' });
  return Number(n);
}

// Compare-and-set like reencryptSecrets: a config replaced meanwhile keeps its new secrets.
// Returns how many were rewritten.
export async function reencryptPushConfigs(
  db: Tx, newDekId: string, rows: { task_id: string; id: string; old_dek_id: string; old_ciphertext: string; ciphertext: string }[],
): Promise<number> {
  if (!rows.length) return 0;
  // Locked first in (task_id, id) order, the order the status fan-out (migration 0029) takes them in:
  // a batch and a status change of several of its configs never deadlock.
  await db.raw(
    `select 1 from push_configs p join unnest(?::uuid[], ?::text[]) as v(task_id, id) on p.task_id = v.task_id and p.id = v.id
      order by p.task_id, p.id for update of p`,
    [rows.map((r) => r.task_id), rows.map((r) => r.id)],
  );
  const res = await db.raw(
    `update push_configs p set encrypted_secrets = v.c, secrets_dek_id = ?
       from unnest(?::uuid[], ?::text[], ?::text[], ?::text[], ?::text[]) as v(task_id, id, old_dek, old_c, c)
      where p.task_id = v.task_id and p.id = v.id and p.secrets_dek_id = v.old_dek and p.encrypted_secrets = v.old_c`,
    [newDekId, rows.map((r) => r.task_id), rows.map((r) => r.id), rows.map((r) => r.old_dek_id), rows.map((r) => r.old_ciphertext), rows.map((r) => r.ciphertext)],
  );
  return res.rowCount ?? 0;
}

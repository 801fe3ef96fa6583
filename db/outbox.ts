import { randomUUID } from 'node:crypto';
import type { JobsOptions } from 'bullmq';
import type { Tx } from './knex.ts';
import type { JobPayloads, QueueName } from '../queues/names.ts';

export interface OutboxRow { id: string; queue: QueueName; name: string; payload: Record<string, unknown>; options: JobsOptions }

// The row id becomes the BullMQ job id. A job id given in the options (a UUID) is used for both, so
// the job can be found from what it is about (agent runs: the trigger message id).
export function newOutboxRow<Q extends QueueName>(queue: Q, name: string, payload: JobPayloads[Q], options: JobsOptions = {}): OutboxRow {
  const { jobId, ...rest } = options;
  return { id: jobId ?? randomUUID(), queue, name, payload: payload as unknown as Record<string, unknown>, options: rest };
}

export async function addOutbox<Q extends QueueName>(db: Tx, queue: Q, name: string, payload: JobPayloads[Q], options: JobsOptions = {}): Promise<OutboxRow> {
  const row = newOutboxRow(queue, name, payload, options);
  await db('outbox').insert(row);
  return row;
}

// Rows the immediate relay did not take (Redis down, process died); locked so sweepers in
// several processes do not send the same rows at once.
export async function lockStaleOutbox(db: Tx, olderThanMs: number, limit: number): Promise<OutboxRow[]> {
  return db('outbox')
    .where('created_at', '<', db.raw(`now() - make_interval(secs => ?)`, [olderThanMs / 1000]))
    .orderBy('created_at')
    .limit(limit)
    .forUpdate()
    .skipLocked();
}

// Rows of jobs the relay could not add directly; one may already be there (sent before).
export async function insertOutbox(db: Tx, rows: OutboxRow[]): Promise<void> {
  if (rows.length) await db('outbox').insert(rows).onConflict('id').ignore();
}

export async function deleteOutbox(db: Tx, ids: string[]): Promise<void> {
  if (ids.length) await db('outbox').whereIn('id', ids).delete();
}

// Payloads of the rows for one queue that the relay has not sent yet.
export async function pendingOutboxPayloads(db: Tx, queue: QueueName): Promise<Record<string, unknown>[]> {
  return (await db('outbox').select('payload').where({ queue })).map((r: { payload: Record<string, unknown> }) => r.payload);
}

// Which of these outbox rows the relay has not sent yet.
export async function pendingOutboxIds(db: Tx, ids: string[]): Promise<Set<string>> {
  if (!ids.length) return new Set();
  return new Set((await db('outbox').select('id').whereIn('id', ids)).map((r: { id: string }) => r.id));
}

// Rows waiting to be handed to Redis, for /metrics.
export async function countOutbox(db: Tx): Promise<number> {
  const [{ n }] = await db('outbox').count({ n: '*' });
  return Number(n);
}

// Age in seconds of the oldest row waiting (0 when none), for /metrics; read from the created_at index.
export async function oldestOutboxAgeSeconds(db: Tx): Promise<number> {
  const row = await db('outbox').first(db.raw('coalesce(extract(epoch from now() - min(created_at)), 0)::float8 as age'));
  return Math.max(0, Number(row.age));
}

import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Knex } from 'knex';
import type { Config } from '../domain/config.ts';
import type { Logger } from '../domain/logger.ts';
import { throttledWarn } from '../domain/throttled-warn.ts';
import { deleteOutbox, insertOutbox, lockStaleOutbox, type OutboxRow } from '../db/outbox.ts';
import { defaultJobOptions, QUEUE_NAMES, type QueueName } from './names.ts';

// Rows a sweep sends per transaction, and at most per sweep (100,000 rows).
const SWEEP_BATCH = 1000;
const SWEEP_MAX_BATCHES = 100;

export type Queues = Record<QueueName, Queue>;

export function createQueues(cfg: Config, connection: Redis): Queues {
  return Object.fromEntries(
    QUEUE_NAMES.map((name) => [name, new Queue(name, { connection, prefix: cfg.QUEUE_PREFIX, defaultJobOptions: defaultJobOptions(cfg, name) })]),
  ) as Queues;
}

// Moves outbox rows into BullMQ. The job id is the outbox id, so a row sent twice (crash
// between add and delete) is still one job. Jobs committed by one coalesced statement are sent
// together: one addBulk per queue and one DELETE, which keeps intake cheap under load. They are
// sent in a microtask, before the requests that made them go on to build their responses: a
// setImmediate put about 0.6 ms of that work in front of every idle task's start.
// Jobs that job recovery can rebuild from Postgres (first runs of submitted tasks) skip the outbox:
// `send` adds them after commit and writes their rows only if the add fails (Redis down), for the
// sweeper; a crash before that leaves a submitted task without a job, which recovery re-enqueues.
export class OutboxRelay {
  private timer?: NodeJS.Timeout;
  private sweeping = false;
  private stopped = false;
  private pending: { row: OutboxRow; stored: boolean }[] = [];
  private flushScheduled = false;
  // While Redis is away every send is deferred and every sweep with rows fails.
  private readonly warnDeferred: (fields: Record<string, unknown>) => void;
  private readonly warnSweepFailed: (fields: Record<string, unknown>) => void;

  constructor(private readonly db: Knex, private readonly queues: Queues, private readonly log: Logger, private readonly sweepMs: number) {
    this.warnDeferred = throttledWarn(log, 'outbox relay deferred to sweeper');
    this.warnSweepFailed = throttledWarn(log, 'outbox sweep failed; will retry');
  }

  private async addJobs(rows: OutboxRow[]): Promise<void> {
    const byQueue = new Map<QueueName, OutboxRow[]>();
    for (const r of rows) byQueue.set(r.queue, [...(byQueue.get(r.queue) ?? []), r]);
    for (const [queue, list] of byQueue) {
      await this.queues[queue].addBulk(list.map((r) => ({ name: r.name, data: r.payload, opts: { ...r.options, jobId: r.id } })));
    }
  }

  /** Called right after the transaction that wrote the rows to the outbox has committed. */
  kick(rows: OutboxRow[]): void {
    this.schedule(rows, true);
  }

  /** Called right after the transaction that made these recoverable jobs due has committed (rows not stored). */
  send(rows: OutboxRow[]): void {
    this.schedule(rows, false);
  }

  private schedule(rows: OutboxRow[], stored: boolean): void {
    for (const row of rows) this.pending.push({ row, stored });
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    queueMicrotask(() => {
      const batch = this.pending;
      this.pending = [];
      this.flushScheduled = false;
      const rowsOf = (stored: boolean) => batch.filter((p) => p.stored === stored).map((p) => p.row);
      this.addJobs(batch.map((p) => p.row))
        .then(
          () => deleteOutbox(this.db, rowsOf(true).map((r) => r.id)),
          (err) => {
            this.warnDeferred({ err: { message: (err as Error).message }, count: batch.length });
            return insertOutbox(this.db, rowsOf(false));
          },
        )
        .catch((err) => this.log.warn({ err: { message: (err as Error).message }, count: batch.length }, 'outbox relay failed; sweeper or job recovery will send'));
    });
  }

  // Takes batches while they come back full, so a backlog (a Redis outage's) drains as fast as Redis
  // takes it rather than one batch per period. Each batch is its own transaction: its rows stay locked
  // only while it sends them, and the sweepers of other processes take other rows meanwhile (SKIP
  // LOCKED). It stops at shutdown, and after SWEEP_MAX_BATCHES so that it ends; the next tick goes on.
  async sweep(): Promise<number> {
    if (this.sweeping) return 0;
    this.sweeping = true;
    let sent = 0;
    try {
      for (let batches = 0; batches < SWEEP_MAX_BATCHES && !this.stopped; batches++) {
        const count = await this.sweepBatch();
        sent += count;
        if (count) this.log.info({ count, sent }, 'outbox sweeper sent leftover jobs');
        if (count < SWEEP_BATCH) break;
      }
    } catch (err) {
      this.warnSweepFailed({ err: { message: (err as Error).message }, sent });
    } finally {
      this.sweeping = false;
    }
    return sent;
  }

  private sweepBatch(): Promise<number> {
    return this.db.transaction(async (trx) => {
      const rows = await lockStaleOutbox(trx, Math.max(this.sweepMs, 500), SWEEP_BATCH);
      if (!rows.length) return 0;
      await this.addJobs(rows);
      await deleteOutbox(trx, rows.map((r) => r.id));
      return rows.length;
    });
  }

  startSweeper(): void {
    this.timer = setInterval(() => void this.sweep(), this.sweepMs);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
  }
}

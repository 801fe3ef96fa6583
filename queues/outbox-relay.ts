import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Knex } from 'knex';
import type { Config } from '../domain/config.ts';
import type { Logger } from '../domain/logger.ts';
import { deleteOutbox, insertOutbox, lockStaleOutbox, type OutboxRow } from '../db/outbox.ts';
import { defaultJobOptions, QUEUE_NAMES, type QueueName } from './names.ts';

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
  private pending: { row: OutboxRow; stored: boolean }[] = [];
  private flushScheduled = false;

  constructor(private readonly db: Knex, private readonly queues: Queues, private readonly log: Logger, private readonly sweepMs: number) {}

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
            this.log.warn({ err: { message: (err as Error).message }, count: batch.length }, 'outbox relay deferred to sweeper');
            return insertOutbox(this.db, rowsOf(false));
          },
        )
        .catch((err) => this.log.warn({ err: { message: (err as Error).message }, count: batch.length }, 'outbox relay failed; sweeper or job recovery will send'));
    });
  }

  async sweep(): Promise<number> {
    if (this.sweeping) return 0;
    this.sweeping = true;
    try {
      return await this.db.transaction(async (trx) => {
        const rows = await lockStaleOutbox(trx, Math.max(this.sweepMs, 500), 1000);
        if (!rows.length) return 0;
        await this.addJobs(rows);
        await deleteOutbox(trx, rows.map((r) => r.id));
        this.log.info({ count: rows.length }, 'outbox sweeper sent leftover jobs');
        return rows.length;
      });
    } catch (err) {
      this.log.warn({ err: { message: (err as Error).message } }, 'outbox sweep failed; will retry');
      return 0;
    } finally {
      this.sweeping = false;
    }
  }

  startSweeper(): void {
    this.timer = setInterval(() => void this.sweep(), this.sweepMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }
}

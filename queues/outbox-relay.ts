import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Knex } from 'knex';
import type { Config } from '../domain/config.ts';
import type { Logger } from '../domain/logger.ts';
import { deleteOutbox, getOutbox, lockStaleOutbox, type OutboxRow } from '../db/outbox.ts';
import { defaultJobOptions, QUEUE_NAMES, type QueueName } from './names.ts';

export type Queues = Record<QueueName, Queue>;

export function createQueues(cfg: Config, connection: Redis): Queues {
  return Object.fromEntries(
    QUEUE_NAMES.map((name) => [name, new Queue(name, { connection, prefix: cfg.QUEUE_PREFIX, defaultJobOptions: defaultJobOptions(cfg, name) })]),
  ) as Queues;
}

// Moves outbox rows into BullMQ. The job id is the outbox id, so a row sent twice (crash
// between add and delete) is still one job.
export class OutboxRelay {
  private timer?: NodeJS.Timeout;
  private sweeping = false;

  constructor(private readonly db: Knex, private readonly queues: Queues, private readonly log: Logger, private readonly sweepMs: number) {}

  private async addJobs(rows: OutboxRow[]): Promise<void> {
    const byQueue = new Map<QueueName, OutboxRow[]>();
    for (const r of rows) byQueue.set(r.queue, [...(byQueue.get(r.queue) ?? []), r]);
    for (const [queue, list] of byQueue) {
      await this.queues[queue].addBulk(list.map((r) => ({ name: r.name, data: r.payload, opts: { ...r.options, jobId: r.id } })));
    }
  }

  // Called right after the transaction that wrote the rows has committed.
  async send(ids: string[]): Promise<void> {
    if (!ids.length) return;
    const rows = await getOutbox(this.db, ids);
    if (!rows.length) return;
    await this.addJobs(rows);
    await deleteOutbox(this.db, rows.map((r) => r.id));
  }

  kick(ids: string[]): void {
    this.send(ids).catch((err) => this.log.warn({ err: { message: (err as Error).message }, count: ids.length }, 'outbox relay deferred to sweeper'));
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

// Processor of the push-notifications queue: delivers a config's pending status updates in order
// (domain/push-delivery.ts); failures are retried by BullMQ with exponential backoff. Also the
// listener that relays the delivery jobs the fan-out trigger writes to the outbox as soon as
// their transaction commits (the outbox sweeper still covers any notification missed).
import { DelayedError, type Job } from 'bullmq';
import pg from 'pg';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import { deliverPending } from '../domain/push-delivery.ts';
import { PUSH_DELIVERIES_CHANNEL } from '../db/push-configs.ts';

// A run that finds the config locked by another run comes back after this long, and one that
// stopped at its budget comes back at once, neither spending an attempt.
const BUSY_DELAY_MS = 200;
const RECONNECT_MS = 1000;

export function createPushDeliveryProcessor(services: Services) {
  return async function deliverPush(job: Job<JobPayloads['push-notifications']>, token?: string): Promise<string> {
    const finalAttempt = job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
    const outcome = await deliverPending(services, job.data, finalAttempt);
    if (outcome === 'busy' || outcome === 'more') {
      await job.moveToDelayed(Date.now() + (outcome === 'busy' ? BUSY_DELAY_MS : 0), token);
      throw new DelayedError();
    }
    return outcome;
  };
}

export async function listenForPushDeliveries(services: Services): Promise<{ close(): Promise<void> }> {
  const { cfg, log, outbox } = services;
  let client: pg.Client | undefined;
  let closed = false;
  const connect = async (): Promise<void> => {
    const c = new pg.Client({ connectionString: cfg.DATABASE_URL });
    c.on('notification', (n) => {
      try {
        const { id, payload } = JSON.parse(n.payload ?? '') as { id: string; payload: JobPayloads['push-notifications'] };
        outbox.kick([{ id, queue: 'push-notifications', name: 'deliver', payload: payload as unknown as Record<string, unknown>, options: {} }]);
      } catch (err) {
        log.warn({ err: { message: (err as Error).message } }, 'unreadable push delivery notification');
      }
    });
    let lost = false;
    const onLost = (why: string) => {
      if (lost || closed) return;
      lost = true;
      log.warn({ why }, 'push delivery listener lost its connection; reconnecting');
      c.end().catch(() => undefined);
      reconnect();
    };
    c.on('error', (err) => onLost(err.message));
    c.on('end', () => onLost('connection ended'));
    await c.connect();
    await c.query(`LISTEN ${PUSH_DELIVERIES_CHANNEL}`);
    client = c;
  };
  const reconnect = (): void => {
    if (!closed) setTimeout(() => void connect().catch(reconnect), RECONNECT_MS).unref();
  };
  await connect();
  return {
    async close() {
      closed = true;
      await client?.end().catch(() => undefined);
    },
  };
}

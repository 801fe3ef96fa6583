// Processor of the push-notifications queue: delivers a config's pending status updates in order
// (domain/push-delivery.ts); failures are retried by BullMQ with exponential backoff. Also the
// listener that relays the delivery jobs the fan-out trigger writes to the outbox as soon as
// their transaction commits (the outbox sweeper still covers any notification missed).
import { DelayedError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import { deliverPending } from '../domain/push-delivery.ts';
import { PUSH_DELIVERIES_CHANNEL } from '../db/push-configs.ts';
import { listenPg } from '../db/pg-listener.ts';

// A run that finds the config leased by another run comes back after this long, and one that
// stopped at its budget comes back at once, neither spending an attempt.
const BUSY_DELAY_MS = 200;

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

export function listenForPushDeliveries(services: Services): Promise<{ close(): Promise<void> }> {
  const { cfg, log, outbox } = services;
  return listenPg(cfg.DATABASE_URL, {
    [PUSH_DELIVERIES_CHANNEL]: (raw) => {
      const { id, payload } = JSON.parse(raw) as { id: string; payload: JobPayloads['push-notifications'] };
      outbox.kick([{ id, queue: 'push-notifications', name: 'deliver', payload: payload as unknown as Record<string, unknown>, options: {} }]);
    },
  }, log);
}

// Processor of the push-notifications queue: delivers a config's pending status updates in order
// (domain/push-delivery.ts), which holds the config for a failed post's backoff and comes back when the
// hold ends; BullMQ retries only faults of ours (exponential backoff, capped). Also the
// listener that relays the delivery jobs the fan-out trigger writes to the outbox as soon as
// their transaction commits (the outbox sweeper still covers any notification missed).
import { DelayedError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import { deliverPending, OriginSlots } from '../domain/push-delivery.ts';
import { PUSH_DELIVERIES_CHANNEL } from '../db/push-configs.ts';
import { listenPg } from '../db/pg-listener.ts';

export function createPushDeliveryProcessor(services: Services) {
  const slots = new OriginSlots(services.cfg);
  return async function deliverPush(job: Job<JobPayloads['push-notifications']>, token?: string): Promise<string> {
    // attemptsStarted counts this run too.
    const outcome = await deliverPending(services, slots, job.data, job.attemptsStarted - 1);
    // A run to come back to later (domain/push-delivery.ts Later) does so without spending an attempt.
    if (typeof outcome === 'object') {
      // Debug: a held or slow webhook turns many runs away; why one waits is there when looked for.
      services.log.debug({ job_id: job.id, task_id: job.data.task_id, config_id: job.data.config_id, later: outcome.later, ms: outcome.ms }, 'push delivery comes back later');
      await job.moveToDelayed(Date.now() + outcome.ms, token);
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

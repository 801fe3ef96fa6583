// Push deliveries whose queue job Redis lost (a failover, a flush, the last second before a crash
// under appendfsync everysec): the fan-out job of a task's last status update is the only one that
// would carry it, so without this pass that update, and the ones before it still pending, would
// never be posted. A config counts as stalled once its newest undelivered update is older than its
// job could still be retrying (PUSH_ATTEMPTS posts of up to PUSH_TIMEOUT_MS with their backoff or Retry-After);
// it then gets a job for that update, under an id of its own, so each pass adds it once (or, when that
// job failed for good, adds it again in its place). A job
// that was not lost after all (a long backlog) finds nothing to deliver: runs of one config never
// overlap (domain/push-delivery.ts, the lease), and each posts only what is still undelivered.
import { createHash } from 'node:crypto';
import type { Services } from '../domain/services.ts';
import { listStalledDeliveries } from '../db/push-configs.ts';
import { addAgain } from '../queues/add-again.ts';
import { retryBackoffMs } from '../domain/push-delivery.ts';
import { RETRY_AFTER_MAX_MS } from '../domain/retry-after.ts';

const PAGE = 500;

const recoveryJobId = (taskId: string, configId: string, seq: number) => {
  const h = createHash('sha256').update(`push-recovery/${taskId}/${configId}/${seq}`).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
};

// How long an update may still be retried: after each failed post the config is held for its
// backoff, or up to RETRY_AFTER_MAX_MS when the webhook sent Retry-After.
export function pushRetryWindowMs(cfg: Services['cfg']): number {
  let backoff = 0;
  for (let failed = 1; failed < cfg.PUSH_ATTEMPTS; failed++) backoff += Math.max(retryBackoffMs(cfg, failed), RETRY_AFTER_MAX_MS);
  return backoff + cfg.PUSH_ATTEMPTS * cfg.PUSH_TIMEOUT_MS;
}

/** Adds a job for each stalled config, until `stopping`; returns how many. */
export async function recoverPushDeliveries(services: Services, olderThanMs: number, stopping: AbortSignal): Promise<number> {
  const { db, queues, log } = services;
  const stalled = await listStalledDeliveries(db, Math.max(olderThanMs, pushRetryWindowMs(services.cfg)), PAGE);
  const queue = queues['push-notifications'];
  let added = 0;
  for (const { task_id, config_id, seq } of stalled) {
    if (stopping.aborted) break;
    const jobId = recoveryJobId(task_id, config_id, seq);
    const earlier = await queue.getJob(jobId);
    // Added by an earlier pass and still retrying (a receiver that keeps failing): left to its
    // retries. One that failed for good (a fault of ours outlasting its attempts: an undecryptable
    // token, a database error) would hold the id, and the update, for the failed jobs' 7 days.
    // A completed one carried this update (delivered or given up) after the list was read, unless
    // the config was deleted and set again under its id since: that waits for BullMQ to drop the job (within the hour).
    if (earlier && !(await earlier.isFailed())) continue;
    // Another worker's pass doing the same meanwhile still leaves one job: its add finds the id
    // taken, or this one replaces its job (whose run, if it had one, posted what was undelivered).
    await addAgain(queue, 'deliver', { task_id, config_id, timeline_seq: seq }, jobId);
    log.warn({ task_id, config_id, seq }, earlier ? 'push delivery job had failed for good: enqueued again' : 'push delivery had no queue job: enqueued again');
    added += 1;
  }
  return added;
}

// Processor of the credential-refresh queue (domain/bridge/credential-refresh.ts), and the periodic
// pass of every worker that enqueues the credentials due for refresh.
import type { Job, Worker } from 'bullmq';
import type { Services } from '../domain/services.ts';
import { abandonRefresh, enqueueDueRefreshes, refreshCredential, refreshRetrying, requeueRefresh, type RefreshOutcome, type UnstoredTokens } from '../domain/bridge/credential-refresh.ts';
import { lastAttempt, retryDelayMs, type JobPayloads } from '../queues/names.ts';
import type { WorkerMetrics } from '../queues/worker-metrics.ts';
import { failedForGood } from './record-job-metrics.ts';
import { JobPayloadMismatch } from '../queues/job-payloads.ts';
import { stalledTooOften } from '../queues/stalled.ts';

export function createRefreshCredentialProcessor(services: Services, unstored: UnstoredTokens) {
  return async (job: Job<JobPayloads['credential-refresh']>): Promise<RefreshOutcome> => {
    try {
      return await refreshCredential(services, job.data.credential_id, lastAttempt(job), unstored);
    } catch (err) {
      const backoff = await retryDelayMs(services.cfg, job, err as Error);
      if (backoff !== undefined) await refreshRetrying(services, job.data.credential_id, backoff);
      throw err;
    }
  };
}

// Every way a refresh job ends for good ends its refresh, not only a last attempt that fails in the
// processor (refreshCredential): else the instance stayed active, its credential marked as queued. It
// gives up, but on a job that stalled too often: that one is queued again by the next scan (tokens
// this worker kept for it stay for that job, if it runs here and the credential is as it was).
export function giveUpOnRefreshesFailedForGood(worker: Worker<JobPayloads['credential-refresh'], RefreshOutcome>, services: Services, unstored: UnstoredTokens): void {
  worker.on('failed', (job, err) => {
    if (!job || !failedForGood(job) || err instanceof JobPayloadMismatch) return;
    const credentialId = job.data.credential_id;
    if (stalledTooOften(err)) {
      requeueRefresh(services, credentialId, err.message).catch((e: Error) => services.log.warn({ credential_id: credentialId, err: { message: e.message } },
        'could not end the scan\'s mark of a credential refresh job that stalled too often; the scan queues the refresh again once the mark lapses'));
      return;
    }
    unstored.delete(credentialId);
    abandonRefresh(services, credentialId, err.message).catch((e: Error) => services.log.warn({ credential_id: credentialId, err: { message: e.message } },
      'could not mark the instance of a credential refresh that failed for good; the scan queues the refresh again once its mark lapses'));
  });
}

// Counts refreshes by outcome: what the job returned (`not due` as not_due), `retrying` for an
// attempt that failed, `error` for a last attempt that could not even mark the instance.
export function recordRefreshOutcomes(worker: Worker<JobPayloads['credential-refresh'], RefreshOutcome>, metrics: WorkerMetrics): void {
  worker.on('completed', (_job, outcome) => metrics.count('taskbridge_credential_refreshes_total', { outcome: outcome.replaceAll(' ', '_') }));
  worker.on('failed', (job) => {
    if (job) metrics.count('taskbridge_credential_refreshes_total', { outcome: failedForGood(job) ? 'error' : 'retrying' });
  });
}

export function startRefreshScheduler(services: Services): () => void {
  let running = false;
  const timer = setInterval(() => {
    if (running) return;
    running = true;
    enqueueDueRefreshes(services, services.queues['credential-refresh'])
      .catch((err) => services.log.warn({ err: { message: (err as Error).message } }, 'credential refresh scan failed; will retry'))
      .finally(() => { running = false; });
  }, services.cfg.CREDENTIAL_REFRESH_SCAN_MS);
  timer.unref();
  return () => clearInterval(timer);
}

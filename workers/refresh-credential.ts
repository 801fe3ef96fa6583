// Processor of the credential-refresh queue (domain/bridge/credential-refresh.ts), and the periodic
// pass of every worker that enqueues the credentials due for refresh.
import type { Job, Worker } from 'bullmq';
import type { Services } from '../domain/services.ts';
import { enqueueDueRefreshes, refreshCredential, refreshRetrying, type RefreshOutcome, type UnstoredTokens } from '../domain/bridge/credential-refresh.ts';
import { lastAttempt, retryDelayMs, type JobPayloads } from '../queues/names.ts';
import type { WorkerMetrics } from '../queues/worker-metrics.ts';
import { failedForGood } from './record-job-metrics.ts';

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

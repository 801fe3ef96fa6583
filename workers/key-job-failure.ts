// How a key job processor (migrate-deks, rotate-alias) ends on an error: canceled when a cancel was
// asked meanwhile, else retried by BullMQ while attempts remain and the error can heal, else the
// key_jobs row is failed with what users may see (publicReason) and BullMQ is told not to retry
// (UnrecoverableError). The log keeps the whole text (SQL without values).
import { UnrecoverableError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import { lastAttempt, type JobPayloads } from '../queues/names.ts';
import { publicReason } from '../domain/errors.ts';
import { applyRequestedCancel, failKeyJob } from '../domain/crypto/key-jobs.ts';

// A job canceled while its failing batch ran ends there, canceled, as after a batch that succeeded:
// it is neither retried nor failed (resolves then).
export async function cancelFailOrRetryKeyJob(services: Services, job: Job<JobPayloads['key-jobs']>, err: unknown, permanent: boolean, what: string): Promise<void> {
  const jobId = job.data.job_id;
  // Postgres out of reach (maybe the error itself): retried or failed as before.
  const now = await applyRequestedCancel(services, jobId).catch(() => undefined);
  if (now?.status === 'canceled') {
    services.log.info({ job_id: jobId, status: now.status, done: now.done, failed: now.failed, err: { message: err instanceof Error ? err.message : String(err) } }, `${what} finished`);
    return;
  }
  const message = publicReason(err);
  const detail = err instanceof Error ? err.message : String(err);
  if (permanent || lastAttempt(job)) {
    await failKeyJob(services, jobId, message);
    services.log.error({ job_id: jobId, err: { message: detail } }, `${what} failed`);
    throw new UnrecoverableError(message);
  }
  services.log.warn({ job_id: jobId, err: { message: detail } }, `${what} step failed; will retry`);
  throw err;
}

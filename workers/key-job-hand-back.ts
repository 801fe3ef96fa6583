import { setTimeout as sleep } from 'node:timers/promises';
import { WaitingError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';

// What a key job does between two batches: its pause (cut short by the hand-back), then, if the
// worker is shutting down, back to the queue without using up an attempt. With Redis out of reach
// the job cannot be moved; its lock then expires and another worker takes it over.
export async function betweenBatches(services: Services, job: Job<JobPayloads['key-jobs']>, token: string | undefined, handBack: AbortSignal, pauseMs: number): Promise<void> {
  if (pauseMs) await sleep(pauseMs, undefined, { signal: handBack }).catch(() => undefined);
  if (!handBack.aborted) return;
  const where = { job_id: job.data.job_id, name: job.name };
  await job.moveToWait(token).then(
    () => services.log.warn(where, 'worker shutting down: key job handed back to the queue'),
    (err: Error) => services.log.warn({ ...where, reason: err.message }, 'worker shutting down: key job left to its lock (it could not be handed back); another worker takes it over once the lock expires'),
  );
  throw new WaitingError();
}

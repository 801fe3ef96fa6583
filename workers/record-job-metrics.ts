// Feeds a worker's job events into the worker metrics (queues/worker-metrics.ts): each attempt's
// duration and outcome, the enqueue lag of first attempts, and jobs found stalled.
import type { Job, Worker } from 'bullmq';
import { retriedAfterFinishing } from '../queues/names.ts';
import type { WorkerMetrics } from '../queues/worker-metrics.ts';

const secondsSince = (ms: number | undefined, until = Date.now()) => (ms ? (until - ms) / 1000 : 0);

// In a worker's 'failed' event: BullMQ sets finishedOn only on a job that failed for good, not on
// an attempt that will be retried.
export const failedForGood = (job: Job): boolean => !!job.finishedOn;

export function recordJobMetrics(worker: Worker, metrics: WorkerMetrics): void {
  const queue = worker.name;
  worker.on('active', (job: Job) => {
    // Later attempts wait for their backoff, which is not lag; a job retried once it had finished
    // (keeping its add time) waited from that retry, of which BullMQ keeps no time.
    if (retriedAfterFinishing(job, true) || !job.processedOn) return;
    metrics.observe('taskbridge_job_enqueue_lag_seconds', { queue }, secondsSince(job.timestamp + (job.opts.delay ?? 0), job.processedOn));
  });
  // Emitted by the worker whose stalled-job check found the job; its attempt has no 'failed' event.
  worker.on('stalled', () => metrics.count('taskbridge_jobs_stalled_total', { queue }));
  worker.on('completed', (job: Job) => {
    metrics.observe('taskbridge_job_duration_seconds', { queue, outcome: 'completed' }, secondsSince(job.processedOn, job.finishedOn));
  });
  worker.on('failed', (job: Job | undefined) => {
    if (!job) return;
    const outcome = failedForGood(job) ? 'failed' : 'retrying';
    metrics.observe('taskbridge_job_duration_seconds', { queue, outcome }, secondsSince(job.processedOn, job.finishedOn ?? Date.now()));
  });
}

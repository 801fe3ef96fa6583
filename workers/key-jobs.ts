// The key-jobs queue carries several kinds of key work; each job name has its processor here.
import { UnrecoverableError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import { createMigrateDeksProcessor } from './migrate-deks.ts';
import { createRotateAliasProcessor } from './rotate-alias.ts';
import { stalledTooOften } from '../queues/stalled.ts';
import { failKeyJob } from '../domain/crypto/key-jobs.ts';
import { MIGRATE_DEKS, ROTATE_ALIAS } from '../domain/key-job-states.ts';

export type KeyJobProcessor = (job: Job<JobPayloads['key-jobs']>, token?: string) => Promise<unknown>;

// `handBack` fires when a shutting-down worker's grace period is over: key jobs then go back to the
// queue between two batches, as the job row's cursor says where the next worker goes on.
export function createKeyJobsProcessor(services: Services, handBack: AbortSignal): KeyJobProcessor {
  const processors: Record<string, KeyJobProcessor> = {
    [MIGRATE_DEKS]: createMigrateDeksProcessor(services, handBack),
    [ROTATE_ALIAS]: createRotateAliasProcessor(services, handBack),
  };
  return async (job, token) => {
    const processor = processors[job.name];
    if (!processor) throw new UnrecoverableError(`no processor for key job '${job.name}'`);
    return processor(job, token);
  };
}

// A job that stalled too often (its worker killed repeatedly) never reaches its processor's own
// failure handling; its key_jobs row is closed here.
export function onKeyJobFailed(services: Services) {
  return (job: Job<JobPayloads['key-jobs']> | undefined, err: Error): void => {
    if (!job || !stalledTooOften(err)) return;
    failKeyJob(services, job.data.job_id, err.message).catch(() => undefined);
  };
}

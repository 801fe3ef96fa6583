// Processor of 'migrate-deks' jobs on the key-jobs queue: re-wraps every DEK of an envelope key
// in batches (domain/crypto/dek-migration.ts), reporting progress in the key_jobs row and the
// BullMQ job. Safe to run again after a crash: the job row's cursor says where to go on.
import { WaitingError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import { AppError } from '../domain/errors.ts';
import { failOrRetryKeyJob } from './key-job-failure.ts';
import { beginMigrateAll, migrateNextBatch } from '../domain/crypto/dek-migration.ts';
import { invalidateKeyring } from '../domain/keyring.ts';
import { betweenBatches } from './key-job-hand-back.ts';
import { isOpenKeyJob } from '../domain/key-job-states.ts';

export function createMigrateDeksProcessor(services: Services, handBack: AbortSignal) {
  const { log, cfg } = services;
  return async (job: Job<JobPayloads['key-jobs']>, token?: string): Promise<void> => {
    const jobId = job.data.job_id;
    try {
      const started = await beginMigrateAll(services, jobId);
      if (!started) return;
      let row = started;
      // Not ended by its start (a cancel asked while an earlier worker's batch held it): run.
      if (isOpenKeyJob(started.status)) {
        log.info({ job_id: jobId, total: started.total, done: started.done }, 'DEK migration running');
        for (;;) {
          const next = await migrateNextBatch(services, jobId, cfg.DEK_MIGRATION_BATCH);
          row = next.job;
          await job.updateProgress({ total: row.total, done: row.done, failed: row.failed });
          if (next.finished) break;
          await betweenBatches(services, job, token, handBack, cfg.DEK_MIGRATION_PAUSE_MS);
        }
      }
      log.info({ job_id: jobId, status: row.status, done: row.done, failed: row.failed }, 'DEK migration finished');
      await invalidateKeyring(services.bus, { all: true });
    } catch (err) {
      if (err instanceof WaitingError) throw err;
      // A missing envelope key or an unusable key file does not heal by retrying.
      await failOrRetryKeyJob(services, job, err, err instanceof AppError && (err.status === 404 || err.status === 500), 'DEK migration');
      // Returned: canceled as that batch failed. The DEKs earlier batches moved are read anew, as after the last batch.
      await invalidateKeyring(services.bus, { all: true });
    }
  };
}

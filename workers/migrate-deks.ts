// Processor of 'migrate-deks' jobs on the key-jobs queue: re-wraps every DEK of an envelope key
// in batches (domain/crypto/dek-migration.ts), reporting progress in the key_jobs row and the
// BullMQ job. Safe to run again after a crash: the job row's cursor says where to go on.
import { UnrecoverableError, WaitingError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import { cancelFailOrRetryKeyJob } from './key-job-failure.ts';
import { beginMigrateAll, isPermanentMigrationError, migrateNextBatch } from '../domain/crypto/dek-migration.ts';
import { invalidateKeyring } from '../domain/keyring.ts';
import { betweenBatches } from './key-job-hand-back.ts';

export function createMigrateDeksProcessor(services: Services, handBack: AbortSignal) {
  const { log, cfg } = services;
  return async (job: Job<JobPayloads['key-jobs']>, token?: string): Promise<void> => {
    const jobId = job.data.job_id;
    // Set once the job has ended here (its last batch, a cancel, a failure); not when it goes back to
    // the queue (a retry, a hand-back): a key service down would then have every process unwrap its
    // DEKs anew from that service.
    let ended = false;
    try {
      const start = await beginMigrateAll(services, jobId);
      if (start.state === 'ended-before') return;
      let row = start.job;
      // Not ended by its start (a cancel asked while an earlier worker's batch held it): run.
      if (start.state === 'running') {
        log.info({ job_id: jobId, total: row.total, done: row.done }, 'DEK migration running');
        for (;;) {
          const next = await migrateNextBatch(services, jobId, cfg.DEK_MIGRATION_BATCH);
          row = next.job;
          if (next.endedElsewhere) {
            ended = true;
            log.info({ job_id: jobId, status: row.status, done: row.done, failed: row.failed }, 'DEK migration ended by another worker');
            return;
          }
          await job.updateProgress({ total: row.total, done: row.done, failed: row.failed });
          if (next.finished) break;
          await betweenBatches(services, job, token, handBack, cfg.DEK_MIGRATION_PAUSE_MS);
        }
      }
      ended = true;
      log.info({ job_id: jobId, status: row.status, done: row.done, failed: row.failed }, 'DEK migration finished');
    } catch (err) {
      if (err instanceof WaitingError) throw err;
      // Canceled (resolves) or failed (UnrecoverableError) ends it; any other rejection is a retry.
      ended = true;
      await cancelFailOrRetryKeyJob(services, job, err, isPermanentMigrationError(err), 'DEK migration')
        .catch((thrown: unknown) => { ended = thrown instanceof UnrecoverableError; throw thrown; });
    } finally {
      // The DEKs its batches moved (earlier workers' too) are read anew. invalidateKeyring does not
      // throw (a note Redis cannot take is logged): thrown here, it would replace how the job ended
      // (an UnrecoverableError, the job resolved) and have BullMQ retry a job that has ended.
      if (ended) await invalidateKeyring(services, { all: true }, { job_id: jobId, job: 'DEK migration' });
    }
  };
}

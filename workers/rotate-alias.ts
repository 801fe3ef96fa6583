// Processor of 'rotate-alias' jobs on the key-jobs queue (domain/alias-rotation.ts): new DEK,
// re-encrypt the alias's secrets in batches, repoint the alias, sweep what was written meanwhile,
// then re-encrypt its bridge credentials and (the push alias) push notification secrets.
// Safe to run again after a crash: every step is committed with the job row's state.
import { WaitingError, type Job } from 'bullmq';
import type { Services } from '../domain/services.ts';
import { cancelFailOrRetryKeyJob } from './key-job-failure.ts';
import { betweenBatches } from './key-job-hand-back.ts';
import type { JobPayloads } from '../queues/names.ts';
import { beginAliasRotation, finishAliasRotation, isPermanentRotationError, nextRotationPhase, repointRotatedAlias, rotateNextBatch, type Phase } from '../domain/alias-rotation.ts';

export function createRotateAliasProcessor(services: Services, handBack: AbortSignal) {
  const { log, cfg } = services;
  return async (job: Job<JobPayloads['key-jobs']>, token?: string): Promise<void> => {
    const jobId = job.data.job_id;
    // Batches until the phase the job is in has nothing left; resolves to that phase.
    const runPhase = async (): Promise<Phase> => {
      for (;;) {
        const { job: row, phaseDone } = await rotateNextBatch(services, jobId, cfg.ALIAS_ROTATION_BATCH);
        await job.updateProgress({ total: row.total, done: row.done, failed: row.failed });
        if (phaseDone) return phaseDone;
        await betweenBatches(services, job, token, handBack, cfg.ALIAS_ROTATION_PAUSE_MS);
      }
    };
    try {
      const start = await beginAliasRotation(services, jobId);
      if (start.state === 'ended-before') return;
      let done = start.job;
      // Not ended by its start (a cancel while it made its new DEK): run.
      if (start.state === 'running') {
        const started = start.job;
        log.info({ job_id: jobId, alias: started.params.alias, new_dek_id: started.params.new_dek_id, total: started.total, done: started.done }, 'alias rotation running');
        let finished = await runPhase();
        if (finished === 'walk') {
          await repointRotatedAlias(services, jobId);
          finished = await runPhase();
        }
        while (await nextRotationPhase(services, jobId, finished)) finished = await runPhase();
        const end = await finishAliasRotation(services, jobId);
        done = end.job;
        if (end.endedElsewhere) {
          log.info({ job_id: jobId, status: done.status, done: done.done, failed: done.failed }, 'alias rotation ended by another worker');
          return;
        }
      }
      log.info({ job_id: jobId, status: done.status, done: done.done, failed: done.failed }, 'alias rotation finished');
    } catch (err) {
      if (err instanceof WaitingError) throw err;
      await cancelFailOrRetryKeyJob(services, job, err, isPermanentRotationError(err), 'alias rotation');
    }
  };
}

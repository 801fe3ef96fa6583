// What is done to a key job (bulk DEK migration, alias rotation) whatever its kind: read it, fail
// it, cancel it. A job's batches each lock its row and go on only while it is running, so a job
// ended here stops at the batch in flight; every batch leaves a consistent state (a DEK under one
// envelope key or the other, a secret under one DEK or the other), so a stopped job leaves nothing
// unreadable.
import type { Services } from '../services.ts';
import type { Tx } from '../../db/knex.ts';
import { Conflict, NotFound } from '../errors.ts';
import { finishKeyJob, getKeyJob, lockKeyJob, type KeyJobRow } from '../../db/key-jobs.ts';
import { isOpenKeyJob } from '../key-job-states.ts';

export async function getJob(db: Tx, id: string): Promise<KeyJobRow> {
  const job = await getKeyJob(db, id);
  if (!job) throw new NotFound('job', id);
  return job;
}

export async function failKeyJob(s: Pick<Services, 'db'>, jobId: string, message: string): Promise<void> {
  await s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (job && isOpenKeyJob(job.status)) await finishKeyJob(trx, jobId, 'failed', { id: jobId, message });
  });
}

// Cancels a queued or running job; one already canceled is answered as it is (a retried cancel),
// with `canceled` false. The worker running it stops after the batch it is in; what that batch
// moves stays moved.
export async function cancelKeyJob(s: Pick<Services, 'db'>, jobId: string): Promise<{ job: KeyJobRow; canceled: boolean }> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!job) throw new NotFound('job', jobId);
    if (job.status === 'canceled') return { job, canceled: false };
    if (!isOpenKeyJob(job.status)) throw new Conflict(`Job '${jobId}' already ended (${job.status}); only a queued or running job can be canceled`, { status: job.status });
    await finishKeyJob(trx, jobId, 'canceled');
    return { job: (await getKeyJob(trx, jobId))!, canceled: true };
  });
}

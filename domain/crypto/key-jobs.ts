// What is done to a key job (bulk DEK migration, alias rotation) whatever its kind: read it, fail
// it, cancel it. A job's batches each lock its row and go on only while it is running, so a job
// ended here stops at the batch in flight; every batch leaves a consistent state (a DEK under one
// envelope key or the other, a secret under one DEK or the other), so a stopped job leaves nothing
// unreadable.
import type { Knex } from 'knex';
import type { Services } from '../services.ts';
import type { Tx } from '../../db/knex.ts';
import { Conflict, NotFound } from '../errors.ts';
import {
  endKeyJob, getKeyJob, lockKeyJobCancels, requestKeyJobCancel, selectKeyJobForUpdate, settleKeyJobTotal, takeKeyJobCancel, withdrawKeyJobCancel, type KeyJobError, type KeyJobRow,
} from '../../db/key-jobs.ts';
import { countDeksUnder, deleteUnusedDek } from '../../db/deks.ts';
import { invalidateAfterCommit } from '../keyring.ts';
import { isOpenKeyJob, MIGRATE_DEKS, ROTATE_ALIAS } from '../key-job-states.ts';
import { secretsLeftToRotate } from '../alias-rotation-passes.ts';

// Locks a job's row for the rest of `trx`, which every step of a job does first. A cancel asked
// meanwhile (requestKeyJobCancel) is applied here, so the step finds the job canceled.
export async function lockKeyJob(trx: Knex.Transaction, id: string): Promise<KeyJobRow | undefined> {
  return (await lockKeyJobNotingCancel(trx, id)).job;
}

// lockKeyJob, saying too whether it applied a cancel (`canceledHere`): the job was open as the
// caller's step took it, and that step ended it. `skipLocked` (a cancel): no job, rather than a
// wait, while another transaction holds the row.
export async function lockKeyJobNotingCancel(trx: Knex.Transaction, id: string, opts: { skipLocked?: boolean } = {}): Promise<{ job: KeyJobRow | undefined; canceledHere: boolean }> {
  const job = await selectKeyJobForUpdate(trx, id, opts);
  if (!job || !isOpenKeyJob(job.status) || !(await takeKeyJobCancel(trx, id))) return { job, canceledHere: false };
  await finishKeyJob(trx, id, 'canceled');
  return { job: await getKeyJob(trx, id), canceledHere: true };
}

// How a worker's start of a key job went: the job had ended before it (nothing to do or say), it
// ended during the start (a cancel asked meanwhile, applied there: the worker reports that end), or
// it runs.
export type KeyJobStart = { state: 'ended-before' } | { state: 'ended-during-start' | 'running'; job: KeyJobRow };

// The start's outcome for a job as a step of it found the job, and whether that step ended it.
export function startedAs(job: KeyJobRow | undefined, endedHere = false): KeyJobStart {
  if (job && isOpenKeyJob(job.status)) return { state: 'running', job };
  return job && endedHere ? { state: 'ended-during-start', job } : { state: 'ended-before' };
}

// Ends a job (its row locked). A rotation that ends otherwise than completed (canceled, or failed as
// its alias moved) may leave the DEK it made for itself referred to by nothing but the job's params:
// ended before its walk began, or before a batch moved a value to it. It is deleted with the job's
// end unless something refers to it (deleteUnusedDek): the values the walk moved, the alias once
// repointed, or an alias someone pointed at it. Deleted, it leaves every process's DEK cache once
// this commits (the worker that made it holds it); its id, public in the params, is never given to
// another DEK, as a process that missed that note still holds the key under it.
// Either kind ended so has its total settled: counted as its pass began, it still holds items deleted
// or moved out since and not those written since. It is what it moved or failed and the items it left.
export async function finishKeyJob(trx: Knex.Transaction, id: string, status: 'completed' | 'failed' | 'canceled', error?: KeyJobError): Promise<void> {
  const ended = await endKeyJob(trx, id, status, error);
  if (!ended || status === 'completed') return;
  if (ended.kind === ROTATE_ALIAS) {
    const { prepared_dek_id: prepared, new_dek_id: started } = ended.params as { prepared_dek_id?: string; new_dek_id?: string };
    const made = started ?? prepared;
    if (made && await deleteUnusedDek(trx, made)) invalidateAfterCommit(trx, { dek_ids: [made] });
  }
  const left = await leftToDo(trx, (await getKeyJob(trx, id))!);
  if (left !== undefined) await settleKeyJobTotal(trx, id, left);
}

// What a job had still to do as it ends: a rotation's secrets still to move (undefined outside its
// walk and sweep); a migration's DEKs still under its source, less those it failed on (they stay
// there, counted in `failed`), whichever pass would have taken them.
async function leftToDo(trx: Knex.Transaction, job: KeyJobRow): Promise<number | undefined> {
  if (job.kind === ROTATE_ALIAS) return secretsLeftToRotate(trx, job);
  if (job.kind === MIGRATE_DEKS) return countDeksUnder(trx, job.source_envelope_key_id!, { notFailedIn: job.id });
  return undefined;
}

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

// A cancel recorded while a batch held the job (202) is applied by the job's next step. When that
// batch failed instead, the next step is the retry, which the backoff puts off for up to minutes: it
// is applied now (lockKeyJob does), and the job as it then is returned.
export async function applyRequestedCancel(s: Pick<Services, 'db'>, jobId: string): Promise<KeyJobRow | undefined> {
  return s.db.transaction((trx) => lockKeyJob(trx, jobId));
}

export type CancelOutcome = 'canceled' | 'requested' | 'already';

const ended = (job: KeyJobRow) => new Conflict(`Job '${job.id}' already ended (${job.status}); only a queued or running job can be canceled`, { status: job.status });

// Cancels a queued or running job. The worker running it stops after the batch it is in, and what
// that batch moves stays moved. A batch holds the job's row for as long as it runs (a KMS batch:
// seconds), so the cancel is recorded without the row: applied at once when no batch holds it
// ('canceled'), else by the job's next step ('requested': the job as it stands, still running).
// One canceled already is answered as it is ('already'). Cancels of one job take turns, so the row
// a cancel finds held is held by a step of the job's (a batch, its start, a failure being recorded),
// never by another cancel.
export async function cancelKeyJob(s: Pick<Services, 'db'>, jobId: string): Promise<{ job: KeyJobRow; outcome: CancelOutcome }> {
  const seen = await getJob(s.db, jobId);
  if (seen.status === 'canceled') return { job: seen, outcome: 'already' };
  if (!isOpenKeyJob(seen.status)) throw ended(seen);
  // Committed before the row is tried, so that a step taking the row meanwhile finds it.
  await requestKeyJobCancel(s.db, jobId);
  const out = await s.db.transaction(async (trx) => {
    await lockKeyJobCancels(trx, jobId);
    const { job: locked, canceledHere } = await lockKeyJobNotingCancel(trx, jobId, { skipLocked: true });
    if (canceledHere) return { job: locked!, outcome: 'canceled' as const };
    const job = locked ?? (await getKeyJob(trx, jobId))!;
    if (isOpenKeyJob(job.status)) return { job, outcome: 'requested' as const };
    // It ended before this cancel took effect (by another cancel, or with the batch that was in
    // flight): nothing is left to apply the request to.
    await withdrawKeyJobCancel(trx, jobId);
    return { job, outcome: job.status === 'canceled' ? 'already' as const : undefined };
  });
  if (out.outcome) return { job: out.job, outcome: out.outcome };
  throw ended(out.job);
}

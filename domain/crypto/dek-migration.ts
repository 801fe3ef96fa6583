// Bulk re-wrap of every DEK under one envelope key ("migrate-all"): a key_jobs row tracks
// progress and a cursor (last DEK id handled); workers run it in batches. Each batch is one
// transaction that locks the job row, re-wraps with a compare-and-set UPDATE and advances the
// cursor, so a job resumed after a crash at any point continues exactly where it committed.
// DEKs may be created under the source (or moved there) while the job walks it in id order; those
// with an id the walk has passed are found by sweeps: when a pass ends, with DEK writes under the
// source held back, the job counts the DEKs written there since it started that are still there
// (less those that failed), and if there are any, another pass takes them. Writes that keep coming
// could keep finding some: after MAX_SWEEPS the job fails, naming how many it left. A migration
// into the source of a running one, or out of its target, is refused: it would move DEKs the
// running one is moving (two opposite ones would move the same DEKs back and forth).
import { randomBytes, randomUUID } from 'node:crypto';
import type { Services } from '../services.ts';
import type { Knex } from 'knex';
import { AppError, Conflict, InvalidRequest, NotFound } from '../errors.ts';
import { inTransaction } from '../unit-of-work.ts';
import { countDeksUnder, deksUnder, rewrapDeks, type DekFilter } from '../../db/deks.ts';
import { lockEnvelopeKeyExclusive, lockEnvelopeKeyShared } from '../../db/envelope-keys.ts';
import {
  findActiveMigration, findCrossingMigration, getKeyJob, insertKeyJob, lockMigrationStarts, markKeyJobRunning,
  recordKeyJobProgress, restartKeyJobPass, settleKeyJobTotal, type KeyJobError, type KeyJobRow,
} from '../../db/key-jobs.ts';
import { finishKeyJob, lockKeyJob, lockKeyJobNotingCancel, startedAs, type KeyJobStart } from './key-jobs.ts';
import { DecryptError, KEY_BYTES } from './aes-gcm.ts';
import { envelopeKeyRow, freshWrapperFor, wrapperFor } from '../keyring.ts';
import { isLastingKmsRefusal, type KeyWrapper } from './envelope-keys.ts';
import { endedElsewhere, MIGRATE_DEKS } from '../key-job-states.ts';

const KMS_PARALLEL = 16;
// A DEK written by a transaction that began before the job did carries that earlier time.
const SWEEP_MARGIN_MS = 60_000;
const MAX_SWEEPS = 5;

interface MigrationParams { from_envelope_encryption_key_id: string; to_envelope_encryption_key_id: string; sweep?: number }
const paramsOf = (job: KeyJobRow) => job.params as unknown as MigrationParams;
const migratesTo = (job: KeyJobRow | undefined, targetId: string) => job !== undefined && paramsOf(job).to_envelope_encryption_key_id === targetId;

// DEKs under the source written since the job started, less those it failed on.
const writtenDuringJob = (job: KeyJobRow): DekFilter => ({ since: new Date(job.started_at!.getTime() - SWEEP_MARGIN_MS), notFailedIn: job.id });

// What the job's current pass takes after its cursor: the walk, every DEK; a sweep, those written during the job.
function passFilter(job: KeyJobRow): DekFilter {
  return paramsOf(job).sweep ? { after: job.cursor, ...writtenDuringJob(job) } : { after: job.cursor };
}

export async function startMigrateAll(
  s: Pick<Services, 'db' | 'cfg' | 'outbox' | 'bus' | 'log'>, sourceId: string, targetId: string,
): Promise<{ job: KeyJobRow; created: boolean }> {
  await envelopeKeyRow(s.db, sourceId);
  await envelopeKeyRow(s.db, targetId);
  if (sourceId === targetId) throw new InvalidRequest('source and target envelope keys are the same', [{ path: 'body.to_envelope_encryption_key_id', message: 'must differ from the source envelope key' }]);
  // A target that cannot wrap (a KMS key that is gone or not ours, a local key file that is gone) is refused now, as a single DEK's
  // migration is (502), not found out by a job that would retry for minutes before it failed. Not
  // when the same migration runs already: that request gets the running job.
  if (!migratesTo(await findActiveMigration(s.db, sourceId), targetId)) await (await freshWrapperFor(s, targetId)).wrap(randomBytes(KEY_BYTES));
  for (;;) {
    const out = await inTransaction(s, async (uow) => {
      if (!(await lockEnvelopeKeyShared(uow.trx, targetId))) throw new NotFound('envelope_key', targetId);
      await lockMigrationStarts(uow.trx);
      const crossing = await findCrossingMigration(uow.trx, sourceId, targetId);
      if (crossing) {
        const { from_envelope_encryption_key_id: from, to_envelope_encryption_key_id: to } = paramsOf(crossing);
        throw new Conflict(`a migration of envelope key '${from}' to '${to}' is running (job ${crossing.id}); one into its source or out of its target would move DEKs it is moving: wait for it to end`, { resource: 'job', id: crossing.id });
      }
      const total = await countDeksUnder(uow.trx, sourceId, {});
      const job = await insertKeyJob(uow.trx, {
        id: randomUUID(), kind: MIGRATE_DEKS, source_envelope_key_id: sourceId, total,
        params: { from_envelope_encryption_key_id: sourceId, to_envelope_encryption_key_id: targetId },
      });
      if (job) {
        await uow.enqueue('key-jobs', MIGRATE_DEKS, { job_id: job.id });
        return { job, created: true };
      }
      const running = await findActiveMigration(uow.trx, sourceId);
      if (running && !migratesTo(running, targetId)) {
        throw new Conflict(`a migration of envelope key '${sourceId}' to '${paramsOf(running).to_envelope_encryption_key_id}' is running (job ${running.id}); wait for it to end`, { resource: 'job', id: running.id });
      }
      return running && { job: running, created: false };
    });
    // The running job can finish between the insert and the lookup; then start a new one.
    if (out) return out;
  }
}

export interface RewrapResult { ids: string[]; wrapped: string[]; errors: KeyJobError[] }

// Unwraps under `from` and wraps under `to`. A DEK that does not unwrap is an error of that DEK;
// any other failure (KMS down, key file gone, a KMS key disabled) fails the whole batch, the job
// retried or failed as isPermanentMigrationError says: every DEK under one envelope key shares it.
export async function rewrapAll(from: KeyWrapper, to: KeyWrapper, rows: { id: string; encrypted_dek: string }[]): Promise<RewrapResult> {
  const out: RewrapResult = { ids: [], wrapped: [], errors: [] };
  const one = async (r: { id: string; encrypted_dek: string }) => {
    let plain: Buffer;
    try {
      plain = await from.unwrap(r.encrypted_dek);
    } catch (err) {
      if (err instanceof DecryptError) return { id: r.id, error: err.message };
      throw err;
    }
    return { id: r.id, wrapped: await to.wrap(plain) };
  };
  const collect = (res: { id: string; wrapped?: string; error?: string }) => {
    if (res.wrapped !== undefined) { out.ids.push(res.id); out.wrapped.push(res.wrapped); } else out.errors.push({ id: res.id, message: res.error! });
  };
  if ('unwrapSync' in from && 'wrapSync' in to) {
    // Local to local: plain synchronous crypto, no promise per DEK.
    const f = from as KeyWrapper & { unwrapSync(w: string): Buffer };
    const t = to as KeyWrapper & { wrapSync(d: Buffer): string };
    for (const r of rows) {
      let plain: Buffer;
      try {
        plain = f.unwrapSync(r.encrypted_dek);
      } catch (err) {
        if (!(err instanceof DecryptError)) throw err;
        out.errors.push({ id: r.id, message: err.message });
        continue;
      }
      out.ids.push(r.id);
      out.wrapped.push(t.wrapSync(plain));
    }
    return out;
  }
  for (let i = 0; i < rows.length; i += KMS_PARALLEL) (await Promise.all(rows.slice(i, i + KMS_PARALLEL).map(one))).forEach(collect);
  return out;
}

// Marks the job running and recounts what is left, so a resumed job reports a true total.
export async function beginMigrateAll(s: Pick<Services, 'db'>, jobId: string): Promise<KeyJobStart> {
  return s.db.transaction(async (trx) => {
    const { job, canceledHere } = await lockKeyJobNotingCancel(trx, jobId);
    const start = startedAs(job, canceledHere);
    if (start.state !== 'running') return start;
    const left = await countDeksUnder(trx, start.job.source_envelope_key_id!, passFilter(start.job));
    await markKeyJobRunning(trx, jobId, start.job.done + start.job.failed + left);
    return startedAs(await getKeyJob(trx, jobId));
  });
}

// Whether retrying cannot help: an envelope key gone (404), a key file that cannot be read (500), or
// a KMS key KMS refuses for a state that lasts until someone changes it (disabled, pending deletion,
// deleted): retried, it would take the attempts budget's minutes to fail the same way.
export const isPermanentMigrationError = (err: unknown): boolean =>
  isLastingKmsRefusal(err) || (err instanceof AppError && (err.status === 404 || err.status === 500));

// One batch of a running job; returns the job row after it, with `finished` once nothing is left,
// and `endedElsewhere` when another worker had ended it before this batch (key-job-states.ts).
export async function migrateNextBatch(s: Pick<Services, 'db' | 'cfg'>, jobId: string, batchSize: number): Promise<{ job: KeyJobRow; finished: boolean; endedElsewhere?: boolean }> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!job) throw new NotFound('job', jobId);
    if (job.status !== 'running') return { job, finished: true, endedElsewhere: endedElsewhere(job.status) };
    const source = job.source_envelope_key_id!;
    const target = paramsOf(job).to_envelope_encryption_key_id;
    const rows = await deksUnder(trx, source, passFilter(job), batchSize);
    if (!rows.length) return endPass(trx, job);
    const res = await rewrapAll(await wrapperFor(s, source, trx), await freshWrapperFor(s, target, trx), rows);
    const updated = await rewrapDeks(trx, source, target, res.ids, res.wrapped);
    await recordKeyJobProgress(trx, jobId, {
      done: updated.length,
      failed: res.errors.length,
      // DEKs that left the source meanwhile (single migrations) are no longer part of the job.
      total: updated.length - res.ids.length,
      cursor: rows[rows.length - 1].id,
      errors: res.errors,
    });
    return { job: (await getKeyJob(trx, jobId))!, finished: false };
  });
}

// The current pass has nothing left. DEK writes under the source wait (their foreign key checks)
// while the job counts what the walk or an earlier sweep passed by; another sweep takes those.
async function endPass(trx: Knex.Transaction, job: KeyJobRow): Promise<{ job: KeyJobRow; finished: boolean }> {
  const source = job.source_envelope_key_id!;
  const params = paramsOf(job);
  await lockEnvelopeKeyExclusive(trx, source);
  const missed = await countDeksUnder(trx, source, writtenDuringJob(job));
  if (missed && (params.sweep ?? 0) < MAX_SWEEPS) {
    await restartKeyJobPass(trx, job.id, { ...params, sweep: (params.sweep ?? 0) + 1 }, missed);
    return { job: (await getKeyJob(trx, job.id))!, finished: false };
  }
  if (missed) {
    // The job's reason, under its own id as every key job failure's (failKeyJob): not a DEK's error.
    await finishKeyJob(trx, job.id, 'failed', { id: job.id, message: `${missed} DEKs written under '${source}' while the job ran are still there after ${MAX_SWEEPS} sweeps: migrate it again` });
  } else {
    await settleKeyJobTotal(trx, job.id);
    await finishKeyJob(trx, job.id, 'completed');
  }
  return { job: (await getKeyJob(trx, job.id))!, finished: true };
}

import type { Knex } from 'knex';
import type { Tx } from './knex.ts';
import { advisoryXactLock } from './advisory-locks.ts';
import { KEY_JOB_ENDED, KEY_JOB_OPEN, MIGRATE_DEKS, ROTATE_ALIAS, type KeyJobStatus } from '../domain/key-job-states.ts';

const MAX_ERRORS = 1000;

export interface KeyJobError { id: string; message: string }
export interface KeyJobRow {
  id: string;
  kind: string;
  status: KeyJobStatus;
  total: number;
  done: number;
  failed: number;
  errors: KeyJobError[];
  params: Record<string, unknown>;
  source_envelope_key_id: string | null;
  cursor: string | null;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
}

// Inserts a queued job; for a kind with a one-running-per-source index, returns undefined when
// one is already queued or running for that source.
export async function insertKeyJob(db: Tx, row: { id: string; kind: string; params: Record<string, unknown>; source_envelope_key_id?: string; total?: number }): Promise<KeyJobRow | undefined> {
  const [out] = await db('key_jobs').insert({ ...row, status: 'queued' })
    .onConflict(db.raw(`(source_envelope_key_id) where kind = 'migrate-deks' and status in ('queued', 'running')`)).ignore()
    .returning('*');
  return out as KeyJobRow | undefined;
}

export async function getKeyJob(db: Tx, id: string): Promise<KeyJobRow | undefined> {
  return db('key_jobs').where({ id }).first();
}

// Locks a job's row for the rest of `db` (a transaction). `skipLocked`: undefined, rather than a
// wait, while another transaction holds the row (a batch).
export async function selectKeyJobForUpdate(db: Knex.Transaction, id: string, opts: { skipLocked?: boolean } = {}): Promise<KeyJobRow | undefined> {
  const q = db('key_jobs').where({ id }).forUpdate();
  if (opts.skipLocked) q.skipLocked();
  return q.first();
}

// Takes the cancel asked for a job, if one was: whether there was one.
export async function takeKeyJobCancel(db: Tx, id: string): Promise<boolean> {
  const [asked] = await db('key_job_cancels').where({ job_id: id }).delete().returning('job_id');
  return !!asked;
}

// Asks for a job's cancel without its row (which a batch in flight holds): the next lockKeyJob
// (domain/crypto/key-jobs.ts) applies it.
export async function requestKeyJobCancel(db: Tx, id: string): Promise<void> {
  await db('key_job_cancels').insert({ job_id: id }).onConflict('job_id').ignore();
}

export async function withdrawKeyJobCancel(db: Tx, id: string): Promise<void> {
  await db('key_job_cancels').where({ job_id: id }).delete();
}

export async function findActiveMigration(db: Tx, sourceEnvelopeKeyId: string): Promise<KeyJobRow | undefined> {
  return db('key_jobs').where({ kind: MIGRATE_DEKS, source_envelope_key_id: sourceEnvelopeKeyId }).whereIn('status', KEY_JOB_OPEN).first();
}

// A running migration that moves DEKs into `source` or out of `target`.
export async function findCrossingMigration(db: Tx, source: string, target: string): Promise<KeyJobRow | undefined> {
  return db('key_jobs').where({ kind: MIGRATE_DEKS }).whereIn('status', KEY_JOB_OPEN)
    .where((q) => q.whereRaw(`params->>'to_envelope_encryption_key_id' = ?`, [source]).orWhere('source_envelope_key_id', target))
    .first();
}

export async function markKeyJobRunning(db: Tx, id: string, total: number): Promise<void> {
  await db('key_jobs').where({ id }).update({ status: 'running', total, started_at: db.raw('coalesce(started_at, now())') });
}

export async function addKeyJobTotal(db: Tx, id: string, more: number): Promise<void> {
  if (more) await db('key_jobs').where({ id }).update({ total: db.raw('total + ?', [more]) });
}

// The total as what was handled and the `left` items still to do.
export async function settleKeyJobTotal(db: Tx, id: string, left = 0): Promise<void> {
  await db('key_jobs').where({ id }).update({ total: db.raw('done + failed + ?', [left]) });
}

export async function recordKeyJobProgress(db: Tx, id: string, p: { done: number; failed: number; total: number; cursor: string | null; errors: KeyJobError[] }): Promise<void> {
  if (p.errors.length) {
    await db.raw('insert into key_job_failures (job_id, item_id) select ?, unnest(?::text[]) on conflict do nothing', [id, p.errors.map((e) => e.id)]);
  }
  await db('key_jobs').where({ id }).update({
    done: db.raw('done + ?', [p.done]),
    failed: db.raw('failed + ?', [p.failed]),
    // Never below what was handled: DEKs created under the source mid-walk were not counted at the start.
    total: db.raw('greatest(total + ?, done + failed + ?)', [p.total, p.done + p.failed]),
    cursor: p.cursor,
    // Errors are kept per DEK up to a bound; `failed` still counts every one.
    errors: p.errors.length
      ? db.raw(`case when jsonb_array_length(errors) < ? then errors || ?::jsonb else errors end`, [MAX_ERRORS, JSON.stringify(p.errors)])
      : db.raw('errors'),
  });
}

// Starts another pass of a job over its source: the cursor back to the start; the total is what
// was handled so far and the `more` rows the pass will take.
export async function restartKeyJobPass(db: Tx, id: string, params: Record<string, unknown>, more: number): Promise<void> {
  await db('key_jobs').where({ id }).update({ params, cursor: null, total: db.raw('done + failed + ?', [more]) });
}

// Serializes the cancels of one job: one that found the job's row held by another cancel would take
// it for a batch in flight and answer 202 for a job that other cancel ends at once.
export async function lockKeyJobCancels(db: Tx, id: string): Promise<void> {
  await advisoryXactLock(db, `taskbridge:key-job-cancel:${id}`);
}

// Serializes the start of bulk migrations: crossing ones (into a running one's source, out of its
// target) are refused by a read that two concurrent starts would otherwise both pass.
export async function lockMigrationStarts(db: Tx): Promise<void> {
  await advisoryXactLock(db, 'taskbridge:migrate-deks:start');
}

// Ends a job (its row locked), withdrawing any cancel asked for it; its kind and params as they were.
export async function endKeyJob(db: Tx, id: string, status: 'completed' | 'failed' | 'canceled', error?: KeyJobError): Promise<Pick<KeyJobRow, 'kind' | 'params'> | undefined> {
  await withdrawKeyJobCancel(db, id);
  const [ended] = await db('key_jobs').where({ id }).update({
    status,
    finished_at: db.fn.now(),
    ...(error ? { errors: db.raw(`errors || ?::jsonb`, [JSON.stringify([error])]) } : {}),
  }).returning(['kind', 'params']) as Pick<KeyJobRow, 'kind' | 'params'>[];
  return ended;
}

// Queued or running jobs created at least `olderThanMs` ago: candidates for recovery.
export async function listUnfinishedKeyJobs(db: Tx, olderThanMs: number): Promise<Pick<KeyJobRow, 'id' | 'kind'>[]> {
  return db('key_jobs').select('id', 'kind').whereIn('status', KEY_JOB_OPEN)
    .where('created_at', '<', db.raw(`now() - make_interval(secs => ?)`, [olderThanMs / 1000]));
}

// Key jobs that ended within the last `withinMs`, newest first, with the first error of each (for
// `jobs list --ended`: where an operator finds a job that failed, and why).
export async function listEndedKeyJobs(db: Tx, withinMs: number, limit: number): Promise<(Pick<KeyJobRow, 'id' | 'kind' | 'status' | 'total' | 'done' | 'failed' | 'finished_at'> & { first_error: KeyJobError | null })[]> {
  return db('key_jobs').select('id', 'kind', 'status', 'total', 'done', 'failed', 'finished_at', db.raw(`errors -> 0 as first_error`))
    .whereIn('status', KEY_JOB_ENDED).where('finished_at', '>', db.raw(`now() - make_interval(secs => ?)`, [withinMs / 1000]))
    .orderBy('finished_at', 'desc').limit(limit);
}

// Progress of the key jobs still under way, for metrics.
export async function listActiveKeyJobs(db: Tx): Promise<Pick<KeyJobRow, 'id' | 'kind' | 'status' | 'total' | 'done' | 'failed'>[]> {
  return db('key_jobs').select('id', 'kind', 'status', 'total', 'done', 'failed').whereIn('status', KEY_JOB_OPEN);
}

export async function findActiveRotation(db: Tx, alias: string): Promise<KeyJobRow | undefined> {
  return db('key_jobs').where({ kind: ROTATE_ALIAS }).whereRaw(`params->>'alias' = ?`, [alias])
    .whereIn('status', KEY_JOB_OPEN).first();
}

// Rotation state lives in the job row's params (new DEK, phase); a phase change restarts the walk.
export async function setRotationState(db: Tx, jobId: string, params: Record<string, unknown>, resetCursor = false): Promise<void> {
  await db('key_jobs').where({ id: jobId }).update({ params: JSON.stringify(params), ...(resetCursor ? { cursor: null } : {}) });
}

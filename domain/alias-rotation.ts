// Alias rotation: a new DEK under the alias's envelope key, every secret of the alias
// re-encrypted with it, then the alias pointed at it. A key_jobs row holds the state (new DEK id
// and phase in params, last secret id handled in cursor) and every batch is one transaction
// that locks the job row, so a job resumed after a crash continues where it committed and never
// creates a second DEK. Secrets keep their own dek_id, so readers decrypt throughout.
//
// Phases: 'walk' re-encrypts, in id order, the secrets last written before the job started;
// after the repoint, 'sweep' takes those written since (created or updated concurrently, still
// under the old DEK). Nothing written during the rotation is left behind: a secret write holds
// its alias FOR SHARE from reading the DEK to commit and stamps updated_at with clock_timestamp(),
// while the start and the repoint lock the alias FOR UPDATE. So every write dated before
// started_at has committed before the walk begins, and every write with the old DEK has committed
// before the sweep begins; later writes already use the new DEK.
import { randomUUID } from 'node:crypto';
import type { Services } from './services.ts';
import { AppError, Conflict, NotFound } from './errors.ts';
import { inTransaction } from './unit-of-work.ts';
import { createDek, decryptWithDek, DecryptError, encryptWithDek, repointAlias, type KeyringServices } from './keyring.ts';
import { getDek } from '../db/deks.ts';
import { finishKeyJob, getKeyJob, insertKeyJob, lockKeyJob, markKeyJobRunning, recordKeyJobProgress, type KeyJobError, type KeyJobRow } from '../db/key-jobs.ts';
import { countSecretsToRotate, findActiveRotation, lockAlias, reencryptSecrets, secretsToRotate, setRotationState } from '../db/secrets.ts';

export const ROTATE_ALIAS = 'rotate-alias';

interface RotationParams { alias: string; from_dek_id?: string; new_dek_id?: string; phase?: 'walk' | 'sweep' }

// Starts a rotation, or returns the one already queued or running for the alias.
export async function startAliasRotation(s: Pick<Services, 'db' | 'outbox' | 'bus' | 'log'>, alias: string): Promise<{ job: KeyJobRow; created: boolean }> {
  return inTransaction(s, async (uow) => {
    // The alias row lock serialises concurrent requests for one alias.
    if (!(await lockAlias(uow.trx, alias))) throw new NotFound('dek_alias', alias);
    const running = await findActiveRotation(uow.trx, alias);
    if (running) return { job: running, created: false };
    const params: RotationParams = { alias };
    const job = await insertKeyJob(uow.trx, { id: randomUUID(), kind: ROTATE_ALIAS, params: { ...params } });
    if (!job) throw new Conflict(`a key job for alias '${alias}' could not be created`);
    await uow.enqueue('key-jobs', ROTATE_ALIAS, { job_id: job.id });
    return { job, created: true };
  });
}

const isActive = (job: KeyJobRow | undefined): job is KeyJobRow => !!job && (job.status === 'queued' || job.status === 'running');

// Creates the new DEK once (its id is stored in the job in the same transaction) and marks the
// job running. Undefined when the job is already finished.
export async function beginAliasRotation(s: KeyringServices, jobId: string): Promise<KeyJobRow | undefined> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!isActive(job)) return undefined;
    const params = job.params as unknown as RotationParams;
    if (params.new_dek_id) return job;
    const alias = await lockAlias(trx, params.alias);
    if (!alias) throw new NotFound('dek_alias', params.alias);
    const from = await getDek(trx, alias.dek_id);
    if (!from) throw new NotFound('dek', alias.dek_id);
    const dek = await createDek(s, from.envelope_key_id, trx);
    const next: RotationParams = { ...params, from_dek_id: from.id, new_dek_id: dek.id, phase: 'walk' };
    await setRotationState(trx, jobId, { ...next });
    await markKeyJobRunning(trx, jobId, await countSecretsToRotate(trx, params.alias, dek.id));
    return getKeyJob(trx, jobId);
  });
}

// Re-encrypts one batch of the current phase; returns the job row after it and whether the
// phase has nothing left.
export async function rotateNextBatch(s: KeyringServices, jobId: string, batchSize: number): Promise<{ job: KeyJobRow; phaseDone: boolean }> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!job) throw new NotFound('job', jobId);
    if (job.status !== 'running') return { job, phaseDone: true };
    const { alias, new_dek_id: newDekId, phase } = job.params as unknown as Required<RotationParams>;
    const sweep = phase === 'sweep';
    const window = sweep ? { since: job.started_at! } : { before: job.started_at! };
    const rows = await secretsToRotate(trx, alias, newDekId, job.cursor, batchSize, window);
    if (!rows.length) return { job, phaseDone: true };
    const rewritten: Parameters<typeof reencryptSecrets>[3] = [];
    const errors: KeyJobError[] = [];
    for (const r of rows) {
      let plain: string;
      try {
        plain = await decryptWithDek(s, r.dek_id, r.encrypted_secret, trx);
      } catch (err) {
        // A value that does not decrypt is this secret's error; anything else fails the batch.
        if (!(err instanceof DecryptError)) throw err;
        errors.push({ id: r.id, message: `secret does not decrypt with DEK '${r.dek_id}'` });
        continue;
      }
      rewritten.push({ id: r.id, old_dek_id: r.dek_id, old_ciphertext: r.encrypted_secret, ciphertext: await encryptWithDek(s, newDekId, plain, trx) });
    }
    const updated = await reencryptSecrets(trx, alias, newDekId, rewritten);
    await recordKeyJobProgress(trx, jobId, {
      done: updated.length,
      failed: errors.length,
      // The walk's total was counted at the start: secrets it lost to concurrent writes leave it
      // (they are written since the start, so the sweep takes them); what the sweep finds is added.
      total: sweep ? updated.length + errors.length : updated.length - rewritten.length,
      cursor: rows[rows.length - 1].id,
      errors,
    });
    return { job: (await getKeyJob(trx, jobId))!, phaseDone: false };
  });
}

// Points the alias at the new DEK (every process drops its cached view on commit) and moves the
// job to the sweep. The alias must still name the DEK the rotation started from (or already the
// new one, when a resumed job repeats this step).
export async function repointRotatedAlias(s: KeyringServices, jobId: string): Promise<void> {
  await s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!isActive(job)) return;
    const params = job.params as unknown as Required<RotationParams>;
    if (params.phase === 'sweep') return;
    const alias = await lockAlias(trx, params.alias);
    if (!alias) throw new NotFound('dek_alias', params.alias);
    if (alias.dek_id !== params.new_dek_id) {
      if (alias.dek_id !== params.from_dek_id) {
        throw new Conflict(`alias '${params.alias}' was pointed at DEK '${alias.dek_id}' during the rotation; it was left there`, { resource: 'dek_alias', id: params.alias });
      }
      await repointAlias(trx, params.alias, params.new_dek_id);
    }
    await setRotationState(trx, jobId, { ...params, phase: 'sweep' }, true);
  });
}

export async function finishAliasRotation(s: Pick<Services, 'db'>, jobId: string): Promise<KeyJobRow> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!job) throw new NotFound('job', jobId);
    if (isActive(job)) await finishKeyJob(trx, jobId, 'completed');
    return (await getKeyJob(trx, jobId))!;
  });
}

// Whether retrying cannot help: the alias or a DEK is gone, or the alias was moved meanwhile.
export const isPermanentRotationError = (err: unknown): boolean => err instanceof AppError && [404, 409, 500].includes(err.status);

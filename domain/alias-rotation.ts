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
// while the start (once it has made the new DEK) and the repoint lock the alias FOR UPDATE. So every write dated before
// started_at has committed before the walk begins, and every write with the old DEK has committed
// before the sweep begins; later writes already use the new DEK.
// Then 'credentials' and 'push-configs' re-encrypt the alias's bridge credentials and, for the
// push alias, the secrets of push notification configs: their writes hold the alias FOR SHARE
// too, so after the repoint what is left under the old DEK only shrinks, and one pass each takes it.
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Services } from './services.ts';
import { AppError, Conflict, NotFound } from './errors.ts';
import { inTransaction } from './unit-of-work.ts';
import { createDek, checkDekOpens, decryptWithDek, DecryptError, encryptWithDek, repointAlias, type KeyringServices } from './keyring.ts';
import { isLastingKmsRefusal, KeyUnusable } from './crypto/envelope-keys.ts';
import { aliasDekForWrite, getDek, lockAlias } from '../db/deks.ts';
import {
  addKeyJobTotal, findActiveRotation, getKeyJob, insertKeyJob, markKeyJobRunning, recordKeyJobProgress, restartKeyJobPass, setRotationState, settleKeyJobTotal,
  type KeyJobError, type KeyJobRow,
} from '../db/key-jobs.ts';
import { finishKeyJob, lockKeyJob, lockKeyJobNotingCancel, startedAs, type KeyJobStart } from './crypto/key-jobs.ts';
import { countSecretsToRotate, reencryptSecrets, secretsToRotate, type RotationCandidate } from '../db/secrets.ts';
import { secretPass } from './alias-rotation-passes.ts';
import { countCredentialsToRotate, credentialsToRotate, reencryptCredentials, type CredentialToRotate } from '../db/bridge.ts';
import type { Budget } from '../db/pagination.ts';
import { countPushConfigsToRotate, pushConfigsToRotate, reencryptPushConfigs } from '../db/push-configs.ts';
import { storedCredentialDef } from './bridge/catalog.ts';
import { openCredential, sealCredential } from './bridge/credentials.ts';
import { PUSH_ALIAS } from './push-config.ts';
import { endedElsewhere, isOpenKeyJob, ROTATE_ALIAS } from './key-job-states.ts';


export type Phase = 'walk' | 'sweep' | 'credentials' | 'push-configs';
// prepared_dek_id: the new DEK, made before the start takes the alias FOR UPDATE (beginAliasRotation),
// while the alias named prepared_from_dek_id.
interface RotationParams { alias: string; prepared_dek_id?: string; prepared_from_dek_id?: string; from_dek_id?: string; new_dek_id?: string; phase?: Phase }

// Starts a rotation, or returns the one already queued or running for the alias.
export async function startAliasRotation(s: Pick<Services, 'db' | 'outbox' | 'bus' | 'log'>, alias: string): Promise<{ job: KeyJobRow; created: boolean }> {
  return inTransaction(s, async (uow) => {
    // Counted now, as the start will count them, so a job still queued does not read as nothing to do;
    // before the alias lock, which every write under the alias waits for (a count of millions of
    // secrets takes a while), and not for a request that finds its rotation already there.
    const already = await findActiveRotation(uow.trx, alias);
    if (already) return { job: already, created: false };
    const total = await countSecretsToRotate(uow.trx, alias);
    // The alias row lock serialises concurrent requests for one alias.
    if (!(await lockAlias(uow.trx, alias))) throw new NotFound('dek_alias', alias);
    const running = await findActiveRotation(uow.trx, alias);
    if (running) return { job: running, created: false };
    const params: RotationParams = { alias };
    const job = await insertKeyJob(uow.trx, { id: randomUUID(), kind: ROTATE_ALIAS, params: { ...params }, total });
    if (!job) throw new Conflict(`a key job for alias '${alias}' could not be created`);
    await uow.enqueue('key-jobs', ROTATE_ALIAS, { job_id: job.id });
    return { job, created: true };
  });
}

// The DEK a new value of a secret staying under `alias` is encrypted with, the alias naming
// `aliasDekId` and the secret under `currentDekId`: a secret the alias's rotation has moved during its
// walk stays under the rotation's new DEK, so a write does not move it back for the sweep to move (and
// count) again. Any other goes under the alias's DEK, as every write does.
export async function dekForRewrite(db: Knex.Transaction, alias: string, aliasDekId: string, currentDekId: string): Promise<string> {
  if (currentDekId === aliasDekId) return aliasDekId;
  const rotation = (await findActiveRotation(db, alias))?.params as RotationParams | undefined;
  const moved = rotation?.phase === 'walk' && rotation.new_dek_id === currentDekId && rotation.from_dek_id === aliasDekId;
  return moved ? currentDekId : aliasDekId;
}

const isActive = (job: KeyJobRow | undefined): job is KeyJobRow => !!job && isOpenKeyJob(job.status);

// Creates the new DEK once (its id is stored in the job in the same transaction) and marks the
// job running. The DEK is made first, with the alias held shared as writes hold it: made under the
// FOR UPDATE below, its KMS call (15 s when KMS is slow) held up every write under the alias, each
// holding an API connection. The FOR UPDATE itself is brief: it makes every write stamped before
// started_at (this transaction's now()) commit before the walk begins (see the header).
export async function beginAliasRotation(s: KeyringServices, jobId: string): Promise<KeyJobStart> {
  const prepared = await s.db.transaction(async (trx): Promise<KeyJobStart> => {
    const { job, canceledHere } = await lockKeyJobNotingCancel(trx, jobId);
    const start = startedAs(job, canceledHere);
    if (start.state !== 'running') return start;
    const params = start.job.params as unknown as RotationParams;
    if (params.new_dek_id || params.prepared_dek_id) return start;
    const fromId = await aliasDekForWrite(trx, params.alias);
    if (!fromId) throw new NotFound('dek_alias', params.alias);
    const from = await getDek(trx, fromId);
    if (!from) throw new NotFound('dek', fromId);
    const dek = await createDek(s, from.envelope_key_id, trx);
    await setRotationState(trx, jobId, { ...params, prepared_dek_id: dek.id, prepared_from_dek_id: from.id });
    return start;
  });
  if (prepared.state !== 'running') return prepared;
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    // Open as the step above took it: ended since (a cancel, applied here or at once between the two).
    if (!isActive(job)) return startedAs(job, true);
    const params = job.params as unknown as RotationParams;
    if (params.new_dek_id) return startedAs(job);
    const alias = await lockAlias(trx, params.alias);
    if (!alias) throw new NotFound('dek_alias', params.alias);
    // Moved since the new DEK was made (a PUT that came in between): the operator's choice stands, as
    // for a move later in the rotation. (A DEK migration moves no alias: it is no move.)
    if (alias.dek_id !== params.prepared_from_dek_id) throw movedDuringRotation(params.alias, alias.dek_id);
    const next: RotationParams = { ...params, from_dek_id: alias.dek_id, new_dek_id: params.prepared_dek_id, phase: 'walk' };
    await setRotationState(trx, jobId, { ...next });
    await markKeyJobRunning(trx, jobId, await countSecretsToRotate(trx, params.alias, params.prepared_dek_id!));
    return startedAs(await getKeyJob(trx, jobId));
  });
}

// What a rotation re-encrypts, one kind of row per phase. A batch takes the next rows after the
// cursor (a row's `key`), re-encrypts each in memory and writes them back with a compare-and-set,
// so a row rewritten meanwhile keeps its newer value. A row that does not open under its old DEK
// (NotOpened), or that reseal finds Unrotatable, is its own error; any other failure fails the batch.
interface RotationStore<R, W> {
  /** The next rows of the phase after `cursor` (null: from the start). */
  next(trx: Knex.Transaction, job: KeyJobRow, params: Required<RotationParams>, cursor: string | null, batch: Budget): Promise<R[]>;
  count(trx: Knex.Transaction, params: Required<RotationParams>): Promise<number>;
  key(row: R): string;
  what(row: R): string;
  reseal(s: KeyringServices, row: R, newDekId: string, trx: Knex.Transaction): Promise<W>;
  /** Writes those still as read; returns how many were. */
  write(trx: Knex.Transaction, params: Required<RotationParams>, rows: W[]): Promise<number>;
}

// A row this release cannot re-encrypt, for the reason its message gives.
class Unrotatable extends Error {}

// A row whose value does not open under its old DEK: the value damaged, or that DEK not unwrapping or
// its envelope key unusable (a key file replaced or lost, a KMS key disabled or deleted). The row's error, not the job's: the others
// are still moved. Only the old side: the new DEK is checked before each batch (checkDekOpens), and
// failing there fails the batch.
class NotOpened extends Error {
  constructor(readonly reason?: string) { super(reason ?? 'does not decrypt'); }
}

async function openOld<T>(opening: Promise<T>): Promise<T> {
  try {
    return await opening;
  } catch (err) {
    if (err instanceof DecryptError) throw new NotOpened();
    // A KMS key store that is only disconnected for a while is KMS failing: the batch is retried.
    if (err instanceof KeyUnusable || isLastingKmsRefusal(err)) throw new NotOpened(err.message);
    throw err;
  }
}

const reencrypt = async (s: KeyringServices, fromDek: string, ciphertext: string, toDek: string, trx: Knex.Transaction) =>
  encryptWithDek(s, toDek, await openOld(decryptWithDek(s, fromDek, ciphertext, trx)), trx);

const secretStore: RotationStore<RotationCandidate, Parameters<typeof reencryptSecrets>[3][number]> = {
  next: (trx, job, p, cursor, batch) =>
    secretsToRotate(trx, p.alias, p.new_dek_id, secretPass(p.phase === 'sweep' ? 'sweep' : 'walk', job.started_at!, cursor), batch),
  count: (trx, p) => countSecretsToRotate(trx, p.alias, p.new_dek_id),
  key: (r) => r.id,
  what: (r) => `secret does not decrypt with DEK '${r.dek_id}'`,
  reseal: async (s, r, newDekId, trx) => ({
    id: r.id, old_dek_id: r.dek_id, old_ciphertext: r.encrypted_secret,
    ciphertext: await reencrypt(s, r.dek_id, r.encrypted_secret, newDekId, trx),
  }),
  write: async (trx, p, rows) => (await reencryptSecrets(trx, p.alias, p.new_dek_id, rows)).length,
};

const credentialStore: RotationStore<CredentialToRotate, Parameters<typeof reencryptCredentials>[2][number]> = {
  next: (trx, _job, p, cursor, batch) => credentialsToRotate(trx, p.alias, p.new_dek_id, cursor, batch),
  count: (trx, p) => countCredentialsToRotate(trx, p.alias, p.new_dek_id),
  key: (r) => r.id,
  what: (r) => `bridge credential does not decrypt with DEK '${r.dek_id}'`,
  reseal: async (s, r, newDekId, trx) => {
    const cc = storedCredentialDef(r.provider_controller_type_id, r.type_id);
    // Which members are sealed is the controller's to say: without it the value stays as it is, readable under its DEK.
    if (!cc) throw new Unrotatable(`bridge credential's controller '${r.type_id}' of provider '${r.provider_controller_type_id}' is not in this release's catalog: left under DEK '${r.dek_id}'`);
    const plain = await openOld(openCredential(s, cc, r, trx));
    return { id: r.id, old_dek_id: r.dek_id, old_value: r.value, value: await sealCredential(s, cc, r.kind, plain, newDekId, trx) };
  },
  write: (trx, p, rows) => reencryptCredentials(trx, p.new_dek_id, rows),
};

type PushRow = Awaited<ReturnType<typeof pushConfigsToRotate>>[number];
// Push configs are all sealed under one alias: other aliases have none.
const pushConfigStore: RotationStore<PushRow, Parameters<typeof reencryptPushConfigs>[2][number]> = {
  next: (trx, _job, p, cursor, batch) => (p.alias === PUSH_ALIAS
    ? pushConfigsToRotate(trx, p.new_dek_id, cursor === null ? null : { task_id: cursor.slice(0, 36), id: cursor.slice(37) }, batch)
    : Promise.resolve([])),
  count: (trx, p) => (p.alias === PUSH_ALIAS ? countPushConfigsToRotate(trx, p.new_dek_id) : Promise.resolve(0)),
  // A task id is a UUID, 36 characters: the config id follows the slash.
  key: (r) => `${r.task_id}/${r.id}`,
  what: (r) => `push notification config '${r.id}' of task ${r.task_id} does not decrypt with DEK '${r.secrets_dek_id}'`,
  reseal: async (s, r, newDekId, trx) => ({
    task_id: r.task_id, id: r.id, old_dek_id: r.secrets_dek_id, old_ciphertext: r.encrypted_secrets,
    ciphertext: await reencrypt(s, r.secrets_dek_id, r.encrypted_secrets, newDekId, trx),
  }),
  write: (trx, p, rows) => reencryptPushConfigs(trx, p.new_dek_id, rows),
};

// Each store has its own row types; a batch only ever combines one store's functions.
const STORES: Record<Phase, RotationStore<any, any>> = { walk: secretStore, sweep: secretStore, credentials: credentialStore, 'push-configs': pushConfigStore };

// What a batch holds past its first row, besides `batchSize` rows: secrets and credentials may be up
// to the body limit each, and a batch holds each several times over (read, decrypted, re-encrypted,
// sent back), so 500 of a megabyte would take gigabytes of a worker's heap.
const BATCH_MAX_BYTES = 8 * 1024 * 1024;

// Re-encrypts one batch of the current phase; returns the job row after it, and the phase when it
// has nothing left.
export async function rotateNextBatch(s: KeyringServices, jobId: string, batchSize: number): Promise<{ job: KeyJobRow; phaseDone?: Phase }> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!job) throw new NotFound('job', jobId);
    const params = job.params as unknown as Required<RotationParams>;
    if (job.status !== 'running') return { job, phaseDone: params.phase };
    // After the repoint the alias must still name the new DEK, held so until the batch commits: one
    // moved since is the operator's choice, and what was written under its new target is not ours
    // to pull back to this rotation's DEK.
    if (AFTER_REPOINT.includes(params.phase)) {
      const target = await aliasDekForWrite(trx, params.alias);
      if (target === undefined) throw new NotFound('dek_alias', params.alias);
      if (target !== params.new_dek_id) throw movedDuringRotation(params.alias, target);
    }
    const store = STORES[params.phase];
    const rows = await store.next(trx, job, params, job.cursor, { limit: batchSize, maxBytes: BATCH_MAX_BYTES });
    if (!rows.length) return { job, phaseDone: params.phase };
    // The new DEK first: most rows are under the alias's current DEK, on the envelope key the new one
    // was made under, so that key lost would otherwise fail each row's opening, each its own error, and
    // the job would complete and repoint the alias at a DEK nothing can open.
    await checkDekOpens(s, params.new_dek_id, trx);
    const rewritten: unknown[] = [];
    const errors: KeyJobError[] = [];
    for (const r of rows) {
      try {
        rewritten.push(await store.reseal(s, r, params.new_dek_id, trx));
      } catch (err) {
        if (err instanceof Unrotatable) errors.push({ id: store.key(r), message: err.message });
        else if (err instanceof NotOpened) errors.push({ id: store.key(r), message: err.reason ? `${store.what(r)}: ${err.reason}` : store.what(r) });
        else throw err;
      }
    }
    const updated = await store.write(trx, params, rewritten);
    await recordKeyJobProgress(trx, jobId, {
      done: updated,
      failed: errors.length,
      // A phase's rows were counted when it began (the sweep's at the repoint): rows it lost to
      // concurrent writes leave the total.
      total: updated - rewritten.length,
      cursor: store.key(rows[rows.length - 1]),
      errors,
    });
    return { job: (await getKeyJob(trx, jobId))! };
  });
}

const movedDuringRotation = (alias: string, dekId: string) =>
  new Conflict(`alias '${alias}' was pointed at DEK '${dekId}' during the rotation; it was left there`, { resource: 'dek_alias', id: alias });

// The phases after the repoint. Past the sweep, the alias's other rows, each kind in one pass:
// the repoint made every later write use the new DEK, so what is left under an older one can only shrink.
const AFTER_REPOINT: Phase[] = ['sweep', 'credentials', 'push-configs'];

// Moves a repointed rotation on from `finished`, the phase its caller found done, counting the next
// phase's rows into the total; false when none is left. A job run twice at once (a recovered copy,
// a lock that expired) has both copies find a phase done: only the first moves it on, and a copy
// that finds the job in a later phase runs that one, or a phase would be skipped.
export async function nextRotationPhase(s: Pick<Services, 'db'>, jobId: string, finished: Phase): Promise<boolean> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!isActive(job)) return false;
    const params = job.params as unknown as Required<RotationParams>;
    if (params.phase !== finished) return true;
    const at = AFTER_REPOINT.indexOf(params.phase);
    const next = at < 0 ? undefined : AFTER_REPOINT[at + 1];
    if (!next) return false;
    const moved = { ...params, phase: next };
    await setRotationState(trx, jobId, { ...moved }, true);
    await addKeyJobTotal(trx, jobId, await STORES[next].count(trx, moved));
    return true;
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
    // Done already (by this job before a crash, or by a copy running beside it): moving the job back
    // to the sweep would walk again what later phases hold.
    if (params.phase !== 'walk') return;
    const alias = await lockAlias(trx, params.alias);
    if (!alias) throw new NotFound('dek_alias', params.alias);
    if (alias.dek_id !== params.new_dek_id) {
      if (alias.dek_id !== params.from_dek_id) throw movedDuringRotation(params.alias, alias.dek_id);
      await repointAlias(trx, params.alias, params.new_dek_id);
    }
    // The total from here: what the walk moved or failed and what the sweep will take (written since
    // the start). Secrets deleted or rewritten before the walk reached them, still in the total
    // counted at the start, so leave it, and the sweep's are counted once.
    const sweep = await countSecretsToRotate(trx, params.alias, params.new_dek_id, secretPass('sweep', job.started_at!, null));
    await restartKeyJobPass(trx, jobId, { ...params, phase: 'sweep' }, sweep);
  });
}

// Completes the job; `endedElsewhere` when another worker had ended it (key-job-states.ts).
export async function finishAliasRotation(s: Pick<Services, 'db'>, jobId: string): Promise<{ job: KeyJobRow; endedElsewhere: boolean }> {
  return s.db.transaction(async (trx) => {
    const job = await lockKeyJob(trx, jobId);
    if (!job) throw new NotFound('job', jobId);
    const elsewhere = endedElsewhere(job.status);
    if (isActive(job)) {
      // Totals are counted as phases begin; rows deleted or rewritten by others before a pass
      // reached them left the selection. What was handled is the final count.
      await settleKeyJobTotal(trx, jobId);
      await finishKeyJob(trx, jobId, 'completed');
    }
    return { job: (await getKeyJob(trx, jobId))!, endedElsewhere: elsewhere };
  });
}

// Whether retrying cannot help: the alias or a DEK is gone, the alias was moved meanwhile, or the
// new DEK's key is unusable (a key file lost, a KMS key KMS refuses for a state that lasts until
// someone changes it).
export const isPermanentRotationError = (err: unknown): boolean =>
  isLastingKmsRefusal(err) || (err instanceof AppError && [404, 409, 500].includes(err.status));

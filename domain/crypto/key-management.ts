// Envelope key, DEK and alias operations behind the encryption API (and first-start bootstrap).
import type { Knex } from 'knex';
import type { Services } from '../services.ts';
import type { Tx } from '../../db/knex.ts';
import { Conflict, InvalidRequest, NotFound } from '../errors.ts';
import {
  anyEnvelopeKeys, countDeksOf, deleteUnusedEnvelopeKey, getEnvelopeKey, insertEnvelopeKey, listEnvelopeKeys, lockEnvelopeKeyShared, type EnvelopeKeyRow,
} from '../../db/envelope-keys.ts';
import {
  aliasInUse, deleteAlias, getAlias, getDek, insertAlias, listDeksOf, lockAlias, rewrapDek, type AliasRow, type DekRow,
} from '../../db/deks.ts';
import { checkFileName, checkKmsArn, createLocalKeyFile, localKeyFileExists } from './envelope-keys.ts';
import { findActiveRotation } from '../../db/key-jobs.ts';
import { createDek, envelopeKeyRow, forgetWrapper, freshWrapperFor, invalidateAfterCommit, invalidateKeyring, repointAlias, unwrapDek } from '../keyring.ts';

export interface EnvelopeKeyInput { type: 'local' | 'aws_kms'; file_name?: string; arn?: string; region?: string }
type S = Pick<Services, 'db' | 'cfg' | 'bus' | 'log'>;

export const DEFAULT_ALIAS = 'default';
export const BOOTSTRAP_KEY_FILE = 'default-envelope.key';

// Which members each kind takes: local keys a file name, KMS keys an ARN and its region.
function checkMembers(input: EnvelopeKeyInput): void {
  const wanted = input.type === 'local' ? ['file_name'] : ['arn', 'region'];
  const errors = (['file_name', 'arn', 'region'] as const).flatMap((k) => {
    if (wanted.includes(k) && input[k] === undefined) return [{ path: `body.${k}`, message: `is required for type ${input.type}` }];
    if (!wanted.includes(k) && input[k] !== undefined) return [{ path: `body.${k}`, message: `is not allowed for type ${input.type}` }];
    return [];
  });
  if (errors.length) throw new InvalidRequest(`Invalid body: ${errors[0].path} ${errors[0].message}`, errors);
}

export async function createEnvelopeKey(s: Pick<Services, 'db' | 'cfg'>, input: EnvelopeKeyInput, trx?: Tx): Promise<EnvelopeKeyRow> {
  const db = trx ?? s.db;
  checkMembers(input);
  let row: Omit<EnvelopeKeyRow, 'created_at'>;
  if (input.type === 'local') {
    const fileName = input.file_name!;
    checkFileName(fileName);
    if (await getEnvelopeKey(db, fileName)) throw new Conflict(`envelope key '${fileName}' already exists`, { resource: 'envelope_key', id: fileName });
    createLocalKeyFile(s.cfg.KEYS_DIR, fileName);
    row = { id: fileName, type: 'local', file_name: fileName, arn: null, region: null };
  } else {
    checkKmsArn(input.arn!, input.region!, s.cfg.AWS_KMS_ACCOUNTS);
    row = { id: input.arn!, type: 'aws_kms', file_name: null, arn: input.arn!, region: input.region! };
  }
  const out = await insertEnvelopeKey(db, row);
  if (!out) throw new Conflict(`envelope key '${row.id}' already exists`, { resource: 'envelope_key', id: row.id });
  return out;
}

export async function getEnvelopeKeyWithCount(db: Tx, id: string): Promise<EnvelopeKeyRow & { dek_count: number }> {
  const row = await envelopeKeyRow(db, id);
  return { ...row, dek_count: await countDeksOf(db, id) };
}

export { listEnvelopeKeys };

export async function deleteEnvelopeKey(s: S, id: string): Promise<void> {
  const outcome = await s.db.transaction((trx) => deleteUnusedEnvelopeKey(trx, id));
  if (outcome === 'missing') throw new NotFound('envelope_key', id);
  if (outcome === 'in_use') throw new Conflict(`envelope key '${id}' still wraps DEKs; migrate them first`, { resource: 'envelope_key', id });
  if (outcome === 'migration_target') throw new Conflict(`envelope key '${id}' is the target of a running DEK migration`, { resource: 'envelope_key', id });
  forgetWrapper(id);
  await invalidateKeyring(s, { all: true }, { envelope_key_id: id });
}

export async function createDekUnder(s: S, envelopeId: string, opts: { id?: string; encryptedDek?: string; encryptedDekField?: string }): Promise<DekRow> {
  return createDek(s, envelopeId, undefined, opts);
}

export async function listDeks(db: Tx, envelopeId: string, pageSize: number, token?: string) {
  await envelopeKeyRow(db, envelopeId);
  return listDeksOf(db, envelopeId, pageSize, token);
}

// Re-wraps one DEK under another envelope key in place: same id, same aliases, same plaintext.
export async function migrateDek(s: S, envelopeId: string, dekId: string, targetId: string): Promise<DekRow> {
  return s.db.transaction(async (trx) => {
    const dek = await getDek(trx, dekId);
    if (!dek || dek.envelope_key_id !== envelopeId) {
      // The path's envelope key first, as every route under it answers: a DEK under another key is not "not found" alone.
      await envelopeKeyRow(trx, envelopeId);
      throw new NotFound('dek', dekId, `under envelope key '${envelopeId}'`);
    }
    // Held until commit: a delete of the target waits and then finds the DEK under it (409).
    if (!(await lockEnvelopeKeyShared(trx, targetId))) throw new NotFound('envelope_key', targetId);
    if (targetId === envelopeId) throw new InvalidRequest('the DEK is already under this envelope key', [{ path: 'body.to_envelope_encryption_key_id', message: 'must differ from the current envelope key' }]);
    const plain = await unwrapDek(s, dek, trx);
    const wrapped = await (await freshWrapperFor(s, targetId, trx)).wrap(plain);
    const out = await rewrapDek(trx, dekId, envelopeId, targetId, wrapped);
    if (!out) throw new Conflict(`DEK '${dekId}' was migrated concurrently`, { resource: 'dek', id: dekId });
    invalidateAfterCommit(trx, { dek_ids: [dekId] }, s);
    return out;
  });
}

export async function createAlias(s: S, alias: string, dekId: string): Promise<AliasRow> {
  if (!(await getDek(s.db, dekId))) throw new NotFound('dek', dekId);
  const row = await insertAlias(s.db, alias, dekId);
  if (!row) throw new Conflict(`alias '${alias}' already exists`, { resource: 'dek_alias', id: alias });
  return row;
}

// An alias name first, then a DEK id.
export async function getDekByAliasOrId(db: Tx, aliasOrId: string): Promise<DekRow> {
  const alias = await getAlias(db, aliasOrId);
  const dek = await getDek(db, alias ? alias.dek_id : aliasOrId);
  if (!dek) throw new NotFound('dek_alias', aliasOrId);
  return dek;
}

export async function updateAliasTarget(s: S, alias: string, dekId: string): Promise<AliasRow> {
  return s.db.transaction((trx) => repointAlias(trx, alias, dekId));
}

export async function removeAlias(s: S, alias: string): Promise<void> {
  await s.db.transaction(async (trx) => {
    const row = await lockAlias(trx, alias);
    if (!row) throw new NotFound('dek_alias', alias);
    if (alias === DEFAULT_ALIAS) {
      throw new Conflict(`alias '${DEFAULT_ALIAS}' cannot be deleted: push notification configs are sealed under it and secrets without dek_alias use it; point it at another DEK instead`, { resource: 'dek_alias', id: alias });
    }
    if (await aliasInUse(trx, alias)) throw new Conflict(`alias '${alias}' is still used by secrets or bridge credentials`, { resource: 'dek_alias', id: alias });
    // A rotation's start locks the alias too: one accepted before this lock is seen here.
    const rotation = await findActiveRotation(trx, alias);
    if (rotation) throw new Conflict(`alias '${alias}' is being rotated (job ${rotation.id}); delete it once the job has ended`, { resource: 'job', id: rotation.id });
    await deleteAlias(trx, alias);
    invalidateAfterCommit(trx, { dek_ids: [row.dek_id] }, s);
  });
}

// First start of a fresh installation: a local envelope key and a DEK aliased `default`, so
// secrets work with no other step. Runs inside bootstrap's locked transaction. Whether the key file
// was made or adopted (copied into KEYS_DIR before the start, when moving an installation: the
// operator reads which in the log); undefined when there are envelope keys already.
export async function bootstrapKeys(s: Pick<Services, 'db' | 'cfg'>, trx: Knex.Transaction): Promise<'created' | 'adopted' | undefined> {
  if (await anyEnvelopeKeys(trx)) return undefined;
  const adopted = localKeyFileExists(s.cfg.KEYS_DIR, BOOTSTRAP_KEY_FILE);
  const kek = await createEnvelopeKey(s, { type: 'local', file_name: BOOTSTRAP_KEY_FILE }, trx);
  const dek = await createDek(s, kek.id, trx);
  await insertAlias(trx, DEFAULT_ALIAS, dek.id);
  return adopted ? 'adopted' : 'created';
}

// The keyring: envelope keys, DEKs and aliases as the rest of the service uses them. Unwrapped
// DEKs are cached per process for DEK_CACHE_TTL_MS; alias changes, DEK migrations and the deletion of
// a rotation's unused DEK invalidate the caches of every process through the event bus.
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import type { Services } from './services.ts';
import type { Tx } from '../db/knex.ts';
import { Conflict, InvalidRequest, NotFound } from './errors.ts';
import { getEnvelopeKey, localKeyFileNames, type EnvelopeKeyRow } from '../db/envelope-keys.ts';
import { aliasDekForWrite, dekDeletedAt, getAlias, getDek, insertDek, lockAlias, updateAlias, type AliasRow, type DekRow } from '../db/deks.ts';
import { DecryptError, KEY_BYTES, openBase64, sealBase64 } from './crypto/aes-gcm.ts';
import { KeyUnusable, readLocalKeyFile, wrapperForRow, type KeyWrapper } from './crypto/envelope-keys.ts';
import { TtlCache } from './crypto/ttl-cache.ts';
import { withTimeout } from './with-timeout.ts';

export { DecryptError };
export type KeyringServices = Pick<Services, 'db' | 'cfg' | 'bus'>;

const KEYRING_INVALIDATE = 'keyring-invalidate';
let ttlMs = 300_000;
const dekCache = new TtlCache<Buffer>(() => ttlMs);
const wrapperCache = new TtlCache<KeyWrapper>(() => ttlMs, 1000);
type Notifier = Pick<Services, 'bus' | 'log'>;
let processNotifier: Notifier | undefined;

// What a note may say: drop these DEKs, or drop everything (envelope keys changed).
export interface Invalidation { dek_ids?: string[]; all?: boolean }

function applyInvalidation(msg: Invalidation): void {
  if (Array.isArray(msg.dek_ids) && !msg.all) {
    for (const id of msg.dek_ids) if (typeof id === 'string') dekCache.delete(id);
    return;
  }
  dekCache.clear();
  wrapperCache.clear();
}

// Called once per process at start: takes the cache lifetime from config and listens for
// invalidations from other processes.
export async function startKeyringInvalidation(s: Pick<Services, 'bus' | 'cfg' | 'log'>): Promise<void> {
  ttlMs = s.cfg.DEK_CACHE_TTL_MS;
  processNotifier = s;
  await s.bus.subscribe(KEYRING_INVALIDATE, (msg) => applyInvalidation(msg as Invalidation));
}

// Drops this process's cached copies, then tells the others (through `s`, else the bus the process
// started with). Never throws: the change it follows has committed, so a note that cannot go out
// (Redis away, or silent past NOTE_WAIT_MS: a request waiting on it would wait DB_QUERY_TIMEOUT_MS)
// is logged, not reported as that change failing; the others' copies expire within DEK_CACHE_TTL_MS.
// `context`: fields for that log line.
const NOTE_WAIT_MS = 2000;
export async function invalidateKeyring(s: Notifier | undefined, msg: Invalidation, context: Record<string, unknown> = {}): Promise<void> {
  applyInvalidation(msg);
  const to = s ?? processNotifier;
  if (!to) return;
  try {
    await withTimeout(to.bus.publish(KEYRING_INVALIDATE, msg as Record<string, unknown>), NOTE_WAIT_MS);
  } catch (err) {
    to.log.warn({ ...context, invalidation: msg, err: { message: err instanceof Error ? err.message : String(err) } }, 'other processes could not be told to drop their cached DEKs (they expire within DEK_CACHE_TTL_MS)');
  }
}

// Invalidates once `trx` has committed (nothing to do if it rolls back).
export function invalidateAfterCommit(trx: Knex.Transaction, msg: Invalidation, s?: Notifier): void {
  trx.executionPromise.then(() => invalidateKeyring(s, msg), () => undefined);
}

export async function envelopeKeyRow(db: Tx, envelopeId: string): Promise<EnvelopeKeyRow> {
  const row = await getEnvelopeKey(db, envelopeId);
  if (!row) throw new NotFound('envelope_key', envelopeId);
  return row;
}

// For unwrapping: cached, as reads of DEKs are the hot path.
export async function wrapperFor(s: Pick<Services, 'db' | 'cfg'>, envelopeId: string, trx?: Tx): Promise<KeyWrapper> {
  return wrapperCache.get(envelopeId) ?? freshWrapperFor(s, envelopeId, trx);
}

// For wrapping new material under the key (a DEK made, imported or moved there): the key read now, so
// a local key file deleted since it was cached fails the write (KeyUnusable) instead of wrapping DEKs
// that nothing can unwrap once the cache is gone.
export async function freshWrapperFor(s: Pick<Services, 'db' | 'cfg'>, envelopeId: string, trx?: Tx): Promise<KeyWrapper> {
  const w = await wrapperForRow(await envelopeKeyRow(trx ?? s.db, envelopeId), s.cfg.KEYS_DIR, s.cfg.AWS_KMS_ENDPOINT);
  wrapperCache.set(envelopeId, w);
  return w;
}

export function forgetWrapper(envelopeId: string): void {
  wrapperCache.delete(envelopeId);
}

// A stored DEK that does not unwrap is damage on our side (its key file replaced by another, a KMS
// key that is not the one it was wrapped with, a changed row), never the fault of the request that
// meets it: 500, logged. Alias rotation lists the values under it as ones it could not move.
export class DekUnwrapFailed extends KeyUnusable {}

export async function unwrapDek(s: Pick<Services, 'db' | 'cfg'>, row: Pick<DekRow, 'id' | 'envelope_key_id' | 'encrypted_dek'>, trx?: Tx): Promise<Buffer> {
  const wrapper = await wrapperFor(s, row.envelope_key_id, trx);
  try {
    return await wrapper.unwrap(row.encrypted_dek);
  } catch (err) {
    if (err instanceof DecryptError) throw new DekUnwrapFailed(`DEK '${row.id}' does not unwrap with envelope key '${row.envelope_key_id}' (${err.message}): that key is not the one it was wrapped with`);
    throw err;
  }
}

async function loadDek(s: Pick<Services, 'db' | 'cfg'>, dekId: string, trx?: Tx): Promise<Buffer> {
  const row = await getDek(trx ?? s.db, dekId);
  if (!row) throw new NotFound('dek', dekId);
  return unwrapDek(s, row, trx);
}

// Unwraps under way outside transactions, by DEK: a page of list-decrypted opens many values of one
// DEK at once, and each missed the cache and unwrapped it again (500 KMS calls for one page).
const loading = new Map<string, Promise<Buffer>>();

async function dekKey(s: Pick<Services, 'db' | 'cfg'>, dekId: string, trx?: Tx): Promise<Buffer> {
  const cached = dekCache.get(dekId);
  if (cached) return cached;
  // Inside a transaction the DEK may be one it created, which no other caller sees yet: loaded alone.
  let pending = trx ? undefined : loading.get(dekId);
  if (!pending) {
    pending = loadDek(s, dekId, trx);
    if (!trx) {
      loading.set(dekId, pending);
      pending.then(() => loading.delete(dekId), () => loading.delete(dekId));
    }
  }
  const key = await pending;
  dekCache.set(dekId, key);
  return key;
}

// That the DEK opens now, its envelope key read afresh (a local file deleted since it was cached fails
// here, KeyUnusable), before values are written with it that nothing could open once caches expire.
export async function checkDekOpens(s: Pick<Services, 'db' | 'cfg'>, dekId: string, trx?: Tx): Promise<void> {
  const row = await getDek(trx ?? s.db, dekId);
  if (!row) throw new NotFound('dek', dekId);
  await freshWrapperFor(s, row.envelope_key_id, trx);
  await unwrapDek(s, row, trx);
}

// `purpose` is bound to the value as associated data: a value sealed for one purpose (a credential's
// member) does not open as another's (a secret's, which secret import would decrypt for a client).
export async function encryptWithDek(s: Pick<Services, 'db' | 'cfg'>, dekId: string, plaintext: string, trx?: Tx, purpose?: string): Promise<string> {
  return sealBase64(await dekKey(s, dekId, trx), Buffer.from(plaintext, 'utf8'), purpose === undefined ? undefined : Buffer.from(purpose));
}

// `purposes`: those the value may have been sealed for, tried in order (undefined: none).
async function openWithDek(s: Pick<Services, 'db' | 'cfg'>, dekId: string, ciphertext: string, trx?: Tx, purposes: readonly (string | undefined)[] = [undefined]): Promise<Buffer> {
  const key = await dekKey(s, dekId, trx);
  for (const [i, purpose] of purposes.entries()) {
    try {
      return openBase64(key, ciphertext, 'encrypted value', purpose === undefined ? undefined : Buffer.from(purpose));
    } catch (err) {
      if (!(err instanceof DecryptError) || i === purposes.length - 1) throw err;
    }
  }
  throw new DecryptError('encrypted value: no purpose to open it for');
}

export async function decryptWithDek(s: Pick<Services, 'db' | 'cfg'>, dekId: string, ciphertext: string, trx?: Tx, purposes?: readonly (string | undefined)[]): Promise<string> {
  return (await openWithDek(s, dekId, ciphertext, trx, purposes)).toString('utf8');
}

// ignoreBOM: a leading byte order mark is part of the value (the decoder would drop it by default).
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

// A value a client encrypted elsewhere (an import): one that does not decrypt with the DEK it names
// is a bad request naming the field, not damage on our side. So is a plaintext a write could not
// send: bytes that are not UTF-8 (decoding would replace them, storing another value than was sealed)
// or a NUL character (refused in every request body).
// `purpose`: what it must have been sealed for, and what to answer when it was sealed for none, as a
// secret's value is (undefined: sealed for none). Never a fallback to none: such a value could be a
// secret's ciphertext, which secret:read shows.
export async function decryptImported(s: Pick<Services, 'db' | 'cfg'>, dekId: string, ciphertext: string, path: string, trx?: Tx, purpose?: { aad: string; unbound: string }): Promise<string> {
  // `detail`: the field's message, where the summary names more than the field can (the DEK).
  const refuse = (why: string, detail = why) => new InvalidRequest(`${path.replace(/^body\./, '')} ${why}`, [{ path, message: detail }]);
  const opens = async (aad?: string) => {
    try {
      return await openWithDek(s, dekId, ciphertext, trx, [aad]);
    } catch (err) {
      if (err instanceof DecryptError) return undefined;
      throw err;
    }
  };
  const plain = await opens(purpose?.aad);
  if (!plain) {
    // Opened only to say why it is refused; its plaintext is dropped.
    if (purpose && await opens()) throw refuse(purpose.unbound);
    throw refuse(`does not decrypt with DEK '${dekId}'`, 'does not decrypt with this DEK');
  }
  let text: string;
  try {
    text = utf8.decode(plain);
  } catch {
    throw refuse('decrypts to bytes that are not UTF-8 text');
  }
  if (text.includes('\u0000')) throw refuse('decrypts to text with a NUL character');
  return text;
}

export async function resolveAlias(db: Tx, alias: string): Promise<string> {
  const row = await getAlias(db, alias);
  if (!row) throw new NotFound('dek_alias', alias);
  return row.dek_id;
}

// Runs a write in a transaction that holds the alias (shared) from reading its DEK to commit.
export async function writeUnderAlias<T>(s: KeyringServices, alias: string, write: (trx: Knex.Transaction, dekId: string) => Promise<T>): Promise<T> {
  return s.db.transaction(async (trx) => write(trx, await holdAliasDek(trx, alias)));
}

// The DEK an alias names, with the alias held (shared) until `trx` ends: a rotation's repoint
// waits for the write, so it never misses a value written with the old DEK.
export async function holdAliasDek(trx: Knex.Transaction, alias: string): Promise<string> {
  const dekId = await aliasDekForWrite(trx, alias);
  if (!dekId) throw new NotFound('dek_alias', alias);
  return dekId;
}

// A new DEK under an envelope key: generated, or imported from `encryptedDek`, which must
// unwrap with that key.
export async function createDek(s: Pick<Services, 'db' | 'cfg'>, envelopeId: string, trx?: Tx, opts: { id?: string; encryptedDek?: string; encryptedDekField?: string } = {}): Promise<DekRow> {
  const db = trx ?? s.db;
  const wrapper = await freshWrapperFor(s, envelopeId, db);
  // A taken id is refused before the key is unwrapped or generated: that may be a KMS call, and a
  // taken id is the answer (409) whatever the key material. The insert below checks again (races).
  if (opts.id !== undefined) {
    if (await getDek(db, opts.id)) throw dekExists(opts.id);
    await refuseDeletedDekId(db, opts.id);
  }
  let plain: Buffer;
  let wrapped: string;
  if (opts.encryptedDek !== undefined) {
    wrapped = opts.encryptedDek;
    try {
      plain = await wrapper.unwrap(wrapped);
    } catch (err) {
      if (err instanceof DecryptError) throw new InvalidRequest(`encrypted DEK does not unwrap with envelope key '${envelopeId}' (${err.message})`, [{ path: `body.${opts.encryptedDekField ?? 'encrypted_dek'}`, message: `does not unwrap with this envelope key: ${err.message}` }]);
      throw err;
    }
    if (plain.length !== KEY_BYTES) throw new InvalidRequest(`encrypted DEK is not a ${KEY_BYTES}-byte key`);
  } else {
    ({ plain, wrapped } = await wrapper.generate());
  }
  const id = opts.id ?? randomUUID();
  // In a transaction (a savepoint inside the caller's), so that a refused id leaves no DEK behind.
  const row = await db.transaction(async (t) => {
    const inserted = await insertDek(t, { id, envelope_key_id: envelopeId, encrypted_dek: wrapped });
    if (!inserted) {
      // Deleted since it was read above, or the id is taken.
      if (!(await getEnvelopeKey(t, envelopeId))) throw new NotFound('envelope_key', envelopeId);
      throw dekExists(id);
    }
    // Checked again after the insert, which waits for a delete of the id under way: its record has
    // committed by then.
    await refuseDeletedDekId(t, id);
    return inserted;
  });
  dekCache.set(id, plain);
  return row;
}

const dekExists = (id: string) => new Conflict(`DEK '${id}' already exists`, { resource: 'dek', id });

// A deleted DEK's key may still be cached under its id by a process that missed the note to drop
// it: that process would seal values with the old key as a new DEK's.
async function refuseDeletedDekId(db: Tx, id: string): Promise<void> {
  const deletedAt = await dekDeletedAt(db, id);
  if (deletedAt) throw new Conflict(`DEK id '${id}' was used by a DEK deleted at ${deletedAt.toISOString()}; the id of a deleted DEK is never used again: choose another`, { resource: 'dek', id, deleted_at: deletedAt.toISOString() });
}

// Points an alias at another DEK inside `trx`; every process drops its cached view on commit.
// One already naming that DEK is answered as it is: no write, so updated_at (which clients poll)
// and every process's cache stay as they are.
export async function repointAlias(trx: Knex.Transaction, alias: string, dekId: string): Promise<AliasRow> {
  // An alias already there is answered without its lock, which a rotation batch may hold (FOR SHARE)
  // for seconds. A move locks it and compares again: moves sent at once take turns, and those after
  // the first find the alias moved and change nothing (updated_at kept, no cache dropped).
  const seen = await getAlias(trx, alias);
  if (!seen) throw new NotFound('dek_alias', alias);
  if (!(await getDek(trx, dekId))) throw new NotFound('dek', dekId);
  if (seen.dek_id === dekId) return seen;
  const before = await lockAlias(trx, alias);
  if (!before) throw new NotFound('dek_alias', alias); // deleted meanwhile
  if (before.dek_id === dekId) return before;
  const row = (await updateAlias(trx, alias, dekId))!; // there: its row is locked
  invalidateAfterCommit(trx, { dek_ids: [before.dek_id, dekId] });
  return row;
}

// How many local envelope key files there are and how many this process cannot read (readiness: a
// host without KEYS_DIR's files cannot serve secrets).
export async function localKeyFilesHealth(s: Pick<Services, 'db' | 'cfg'>): Promise<{ total: number; unreadable: number }> {
  const names = await localKeyFileNames(s.db);
  const read = await Promise.allSettled(names.map((name) => readLocalKeyFile(s.cfg.KEYS_DIR, name)));
  return { total: names.length, unreadable: read.filter((r) => r.status === 'rejected').length };
}

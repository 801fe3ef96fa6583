// Secrets: values encrypted with the DEK their alias names at write time. Each secret keeps the
// id of the DEK that encrypted it, so reads never depend on where an alias points right now.
import { randomUUID } from 'node:crypto';
import type { Services } from './services.ts';
import { AppError, Conflict, NotFound } from './errors.ts';
import { DecryptError, decryptImported, decryptWithDek, DekUnwrapFailed, encryptWithDek, writeUnderAlias, type KeyringServices } from './keyring.ts';
import { KeyUnusable, KmsKeyUnusable } from './crypto/envelope-keys.ts';
import { DEFAULT_ALIAS } from './crypto/key-management.ts';
import { dekForRewrite } from './alias-rotation.ts';
import * as repo from '../db/secrets.ts';
import type { SecretRow } from '../db/secrets.ts';
import type { Page } from '../db/pagination.ts';
import type { DecryptedSecret, Secret, SecretDecryptErrorCode } from './shapes/secret.ts';

type ReadServices = Pick<Services, 'db' | 'cfg'>;

// Dates serialise to RFC 3339 with milliseconds; dek_id stays internal.
export function toSecret(r: SecretRow): Secret {
  return { id: r.id, key: r.key, encrypted_secret: r.encrypted_secret, dek_alias: r.dek_alias, created_at: r.created_at, updated_at: r.updated_at } as unknown as Secret;
}

const duplicate = (key: string) => new Conflict(`A secret with key '${key}' already exists`, { resource: 'secret', key });

export async function createSecret(s: KeyringServices, input: { key: string; raw_value: string; dek_alias?: string }): Promise<Secret> {
  const alias = input.dek_alias ?? DEFAULT_ALIAS;
  const row = await writeUnderAlias(s, alias, async (trx, dekId) => {
    const ciphertext = await encryptWithDek(s, dekId, input.raw_value, trx);
    return repo.insertSecret(trx, { id: randomUUID(), key: input.key, encrypted_secret: ciphertext, dek_id: dekId, dek_alias: alias });
  });
  if (!row) throw duplicate(input.key);
  return toSecret(row);
}

// Stores a value encrypted elsewhere (e.g. an export) under the alias. It must decrypt with the DEK
// the alias names, or with `data_encryption_key_id` (an export names the DEK a secret was written
// with, which may be older), so a value nobody can read is never stored; one sealed with another DEK
// is re-encrypted with the alias's, as every write is (an alias rotation relies on it). Keeps a given id.
export async function importSecret(
  s: KeyringServices, input: { id?: string; key: string; encrypted_value: string; dek_alias: string; data_encryption_key_id?: string },
): Promise<Secret> {
  // As Postgres answers it, so a refusal names the id as reads do.
  const id = input.id?.toLowerCase();
  const row = await writeUnderAlias(s, input.dek_alias, async (trx, dekId) => {
    const sealedWith = input.data_encryption_key_id ?? dekId;
    const plain = await decryptImported(s, sealedWith, input.encrypted_value, 'body.encrypted_value', trx);
    const encrypted = sealedWith === dekId ? input.encrypted_value : await encryptWithDek(s, dekId, plain, trx);
    return repo.insertSecret(trx, { id: id ?? randomUUID(), key: input.key, encrypted_secret: encrypted, dek_id: dekId, dek_alias: input.dek_alias });
  });
  // Either may be taken: the client is told which (the id when both are).
  if (!row) throw id !== undefined && await repo.getSecret(s.db, id) ? new Conflict(`A secret with id '${id}' already exists`, { resource: 'secret', id }) : duplicate(input.key);
  return toSecret(row);
}

export async function listSecrets(db: Services['db'], pageSize: number, token?: string): Promise<{ secrets: Secret[]; next_page_token?: string }> {
  const page = await repo.listSecrets(db, pageSize, token);
  return withMember(page, page.items.map(toSecret));
}

// A secret that does not open because of what is stored, or because KMS refuses its DEK's key for
// that key's state (disabled, deleted), is listed with decrypt_error instead of its value, so one
// damaged row or unusable key does not hide the rest of its page or the pages after it. KMS failing
// (502) or Postgres (503) fails the whole request, as it fails a read of one secret.
export async function listDecryptedSecrets(s: ReadServices & Pick<Services, 'log'>, pageSize: number, token?: string): Promise<{ secrets: DecryptedSecret[]; next_page_token?: string }> {
  const page = await repo.listSecrets(s.db, pageSize, token);
  const failed: { secret_id: string; dek_id: string; code: SecretDecryptErrorCode; message: string }[] = [];
  const secrets = await Promise.all(page.items.map(async (r): Promise<DecryptedSecret> => {
    const { encrypted_secret: _, ...rest } = toSecret(r);
    try {
      return { ...rest, decrypted_value: await decryptWithDek(s, r.dek_id, r.encrypted_secret) };
    } catch (err) {
      const fault = storedFault(r, err);
      if (!fault) throw err;
      failed.push({ secret_id: r.id, dek_id: r.dek_id, ...fault });
      return { ...rest, decrypt_error: fault };
    }
  }));
  if (failed.length) s.log.error({ secrets: failed }, `list-decrypted: ${failed.length} secret(s) of the page do not decrypt; listed without their values`);
  return withMember(page, secrets);
}

function withMember<T>(page: Page<unknown>, secrets: T[]): { secrets: T[]; next_page_token?: string } {
  return page.next_page_token ? { secrets, next_page_token: page.next_page_token } : { secrets };
}

export async function getSecret(db: Services['db'], id: string): Promise<Secret> {
  const row = await repo.getSecret(db, id);
  if (!row) throw new NotFound('secret', id);
  return toSecret(row);
}

export async function getSecretByKey(db: Services['db'], key: string): Promise<Secret> {
  const row = await repo.getSecretByKey(db, key);
  if (!row) throw noSecretWithKey(key);
  return toSecret(row);
}

// A key is not a secret's id: named as `key`, as the 409 on a taken key names it, so a client
// reading data.id never takes a key for an id.
export function noSecretWithKey(key: string): NotFound {
  return new NotFound('secret', { message: `secret with key '${key}' not found`, data: { key } });
}

// A new value, encrypted under the given alias or else the one the secret already uses.
// Without dek_alias the value stays under the secret's alias as it is when the write commits: the
// alias is read before the write (its DEK is held from the start), so a concurrent move to another
// alias is noticed under the row lock and the write starts over, rather than undoing the move.
const MOVED: unique symbol = Symbol('moved');
const UPDATE_TRIES = 5;

export async function updateSecret(s: KeyringServices, id: string, input: { raw_value: string; dek_alias?: string }): Promise<Secret> {
  for (let attempt = 1; ; attempt++) {
    const existing = await repo.getSecret(s.db, id);
    if (!existing) throw new NotFound('secret', id);
    const alias = input.dek_alias ?? existing.dek_alias;
    const row = await writeUnderAlias<SecretRow | typeof MOVED | undefined>(s, alias, async (trx, dekId) => {
      const current = await repo.getSecret(trx, id, true);
      if (!current) return undefined;
      if (input.dek_alias === undefined && current.dek_alias !== alias) return MOVED;
      const writeDekId = current.dek_alias === alias ? await dekForRewrite(trx, alias, dekId, current.dek_id) : dekId;
      const ciphertext = await encryptWithDek(s, writeDekId, input.raw_value, trx);
      return repo.updateSecret(trx, id, { encrypted_secret: ciphertext, dek_id: writeDekId, dek_alias: alias });
    }).catch(async (err): Promise<typeof MOVED> => {
      // The alias read first is gone: the secret may have moved off it meanwhile.
      if (input.dek_alias === undefined && err instanceof NotFound && (await repo.getSecret(s.db, id))?.dek_alias !== alias) return MOVED;
      throw err;
    });
    if (row === MOVED) {
      if (attempt < UPDATE_TRIES) continue;
      throw new Conflict(`Secret '${id}' kept moving between DEK aliases while it was written; try again`, { resource: 'secret', id });
    }
    if (!row) throw new NotFound('secret', id);
    return toSecret(row);
  }
}

export async function deleteSecret(db: Services['db'], id: string): Promise<void> {
  if (!(await repo.deleteSecret(db, id))) throw new NotFound('secret', id);
}

// What an agent's ctx.readSecret returns: the plaintext of the secret stored under `key`.
export async function readSecretValue(s: ReadServices, key: string): Promise<string> {
  const row = await repo.getSecretByKey(s.db, key);
  if (!row) throw noSecretWithKey(key);
  return decryptStored(s, row);
}

// A stored value that does not decrypt is damage on our side, not a bad request.
async function decryptStored(s: ReadServices, row: SecretRow): Promise<string> {
  try {
    return await decryptWithDek(s, row.dek_id, row.encrypted_secret);
  } catch (err) {
    if (err instanceof DecryptError) throw new AppError(500, 'internal', valueFault(row));
    throw err;
  }
}

const valueFault = (row: SecretRow) => `secret '${row.key}' does not decrypt with its DEK '${row.dek_id}'`;

// Why a secret does not open when the cause is what is stored (its value, its DEK's wrapped key, its
// envelope key's file), each a 500 on a read of that secret alone, or its KMS key's state (a 502
// there); undefined for anything else.
function storedFault(row: SecretRow, err: unknown): { code: SecretDecryptErrorCode; message: string } | undefined {
  if (err instanceof DecryptError) return { code: 'value_does_not_decrypt', message: valueFault(row) };
  if (err instanceof DekUnwrapFailed) return { code: 'dek_does_not_unwrap', message: err.message };
  if (err instanceof KeyUnusable) return { code: 'envelope_key_unusable', message: err.message };
  if (err instanceof KmsKeyUnusable) return { code: 'kms_key_unusable', message: `DEK '${row.dek_id}' cannot be unwrapped: ${err.message}` };
  return undefined;
}

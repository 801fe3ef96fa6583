// Credentials of provider instances: checked against their controller's schema, sensitive members
// encrypted with the DEK their alias names, decrypted only in memory when a function is invoked.
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { AppError, Conflict, InvalidRequest, NotFound } from '../errors.ts';
import { DecryptError, decryptImported, decryptWithDek, encryptWithDek, resolveAlias, writeUnderAlias, type KeyringServices } from '../keyring.ts';
import { DEFAULT_ALIAS } from '../crypto/key-management.ts';
import * as repo from '../../db/bridge.ts';
import type { CredentialKind, CredentialRow, ListedCredentialRow } from '../../db/bridge.ts';
import type { Page } from '../../db/pagination.ts';
import type { Credential, CreateCredentialRequest, ListedCredential } from '../shapes/bridge.ts';
import { checkAgainst, credentialDef, providerDef } from './catalog.ts';
import type { CredentialControllerDef, Plain } from './types.ts';

// OAuth user credentials are refreshed this long before they expire (SPEC.md section 7).
const REFRESH_AHEAD_MS = 5 * 60 * 1000;

export function toCredential(r: CredentialRow): Credential {
  return {
    id: r.id, type_id: r.type_id, dek_alias: r.dek_alias, metadata: r.metadata, value: r.value,
    ...(r.next_rotation_time ? { next_rotation_time: r.next_rotation_time } : {}),
    created_at: r.created_at, updated_at: r.updated_at,
  } as unknown as Credential;
}

function toListedCredential(r: ListedCredentialRow): ListedCredential {
  return {
    ...toCredential(r), kind: r.kind, provider_controller_type_id: r.provider_controller_type_id,
    provider_instance_ids: r.provider_instance_ids, provider_instance_count: r.provider_instance_count,
  };
}

// Every credential, newest first, with the instances that use it: one no instance uses (its instance
// create was refused, or never made) is found here and can be deleted, which frees its DEK alias.
export async function listCredentials(db: Knex, filter: { unused?: boolean; provider_controller_type_id?: string }, pageSize: number, token?: string): Promise<Page<ListedCredential>> {
  const page = await repo.listCredentials(db, filter, pageSize, token);
  return { ...page, items: page.items.map(toListedCredential) };
}

export async function getCredential(db: Knex, id: string): Promise<ListedCredential> {
  const row = await repo.getListedCredential(db, id);
  if (!row) throw new NotFound('credential', id);
  return toListedCredential(row);
}

// Only a credential no instance uses (409 naming those that do): an instance's credentials go with it (DELETE /provider/{id}).
export async function deleteCredential(db: Knex, id: string): Promise<void> {
  await db.transaction(async (trx) => {
    const use = await repo.lockedCredentialUse(trx, id);
    if (!use) throw new NotFound('credential', id);
    if (use.provider_instance_count > 0) {
      const more = use.provider_instance_count - use.provider_instance_ids.length;
      throw new Conflict(`Credential '${id}' is used by provider instance${use.provider_instance_count > 1 ? 's' : ''} ${use.provider_instance_ids.map((i) => `'${i}'`).join(', ')}${more ? ` and ${more} more` : ''}: `
        + 'delete those (DELETE /provider/{id} removes the credentials only it uses)', { resource: 'credential', id, ...use });
    }
    await repo.deleteCredential(trx, id);
  });
}

// The members of a credential of `kind` stored only sealed (an export carries them as ciphertexts).
export const sensitiveOf = (cc: CredentialControllerDef, kind: CredentialKind) => (kind === 'user' ? cc.sensitive.user : cc.sensitive.resource_server);

export async function createCredential(
  s: KeyringServices, kind: CredentialKind, providerTypeId: string, credentialTypeId: string, input: CreateCredentialRequest,
): Promise<Credential> {
  const cc = credentialDef(providerDef(providerTypeId), credentialTypeId);
  const checked = await checkedValue(s, cc, kind, input.value);
  const alias = input.dek_alias ?? DEFAULT_ALIAS;
  const row = await writeUnderAlias(s, alias, (trx, dekId) =>
    storeCredential(s, trx, { kind, providerTypeId, cc, plain: checked, metadata: input.metadata ?? {}, dekId, alias }));
  return toCredential(row);
}

// A credential exported elsewhere (GET /api/a2a/v1/definition), its sensitive members encrypted
// with the DEK `data_encryption_key_id` names, or else the one `dek_alias` names here (imported with
// the same key material): each must decrypt (400), the value is then checked like a new one and
// stored sealed anew under the alias, keeping the exported id when given (409 when taken).
export async function importCredential(
  s: KeyringServices, kind: CredentialKind, providerTypeId: string, credentialTypeId: string,
  input: CreateCredentialRequest & { id?: string; type_id?: string; data_encryption_key_id?: string },
): Promise<Credential> {
  const cc = credentialDef(providerDef(providerTypeId), credentialTypeId);
  if (input.type_id !== undefined && input.type_id !== cc.type_id) {
    throw new InvalidRequest(`body.type_id '${input.type_id}' is not the credential controller '${cc.type_id}' of the path`, [{ path: 'body.type_id', message: `must be ${cc.type_id}` }]);
  }
  // Exported sensitive members are ciphertexts: anything but a string is refused for what it is, not as one that does not decrypt.
  const notText = sensitiveOf(cc, kind).find((m) => input.value[m] !== undefined && typeof input.value[m] !== 'string');
  if (notText) throw new InvalidRequest(`body.value.${notText} must be a string (its ciphertext, as exported)`, [{ path: `body.value.${notText}`, message: 'must be a string' }]);
  const alias = input.dek_alias ?? DEFAULT_ALIAS;
  const sealedWith = input.data_encryption_key_id ?? await resolveAlias(s.db, alias);
  const plain = await mapSensitive(cc, kind, input.value, (member, v) => decryptImported(s, sealedWith, v, `body.value.${member}`, undefined, importableAs(member)));
  // Checked (which may resolve names) before the alias is held: holding it blocks a rotation's repoint.
  const checked = await checkedValue(s, cc, kind, plain);
  const row = await writeUnderAlias(s, alias, (trx, dekId) =>
    // As Postgres answers it, so a 409 names the id as reads do.
    storeCredential(s, trx, { id: input.id?.toLowerCase(), kind, providerTypeId, cc, plain: checked, metadata: input.metadata ?? {}, dekId, alias }));
  return toCredential(row);
}

// The value checked against the controller's schema for `kind` (400), then normalized.
async function checkedValue(s: KeyringServices, cc: CredentialControllerDef, kind: CredentialKind, value: Plain): Promise<Plain> {
  const schema = kind === 'user' ? cc.userCredential : cc.resourceServer;
  if (!schema) throw new InvalidRequest(`Credential controller '${cc.type_id}' has no user credential`, [{ path: 'path.credential_controller_type_id', message: 'has no user credential' }]);
  checkAgainst(schema, value, 'body.value');
  return cc.normalize ? cc.normalize(kind, value, { allowPrivate: s.cfg.BRIDGE_ALLOW_PRIVATE, timeoutMs: s.cfg.BRIDGE_TIMEOUT_MS }) : value;
}

// When a user credential that expires must be refreshed: REFRESH_AHEAD_MS before its expiry_time,
// or halfway there for a token that lives shorter (else it would be due at once, again and again).
export function nextRotationTime(cc: CredentialControllerDef, kind: CredentialKind, plain: Plain): Date | null {
  const expiry = kind === 'user' && typeof plain.expiry_time === 'string' && cc.requires_user_credential_refreshing ? Date.parse(plain.expiry_time) : NaN;
  if (Number.isNaN(expiry)) return null;
  return new Date(expiry - Math.min(REFRESH_AHEAD_MS, Math.max(0, (expiry - Date.now()) / 2)));
}

// Stores a checked credential value in `trx`, which holds `alias` (writeUnderAlias): its sensitive
// members sealed under the alias's DEK `dekId`. A given id that is taken is a 409.
export async function storeCredential(
  s: KeyringServices, trx: Knex.Transaction,
  c: { id?: string; kind: CredentialKind; providerTypeId: string; cc: CredentialControllerDef; plain: Plain; metadata: Record<string, unknown>; dekId: string; alias: string },
): Promise<CredentialRow> {
  const row = await repo.insertCredential(trx, {
    id: c.id ?? randomUUID(), kind: c.kind, provider_controller_type_id: c.providerTypeId, type_id: c.cc.type_id,
    value: await sealCredential(s, c.cc, c.kind, c.plain, c.dekId, trx), metadata: c.metadata,
    dek_id: c.dekId, dek_alias: c.alias, next_rotation_time: nextRotationTime(c.cc, c.kind, c.plain),
  });
  if (!row) throw new Conflict(`Credential '${c.id}' already exists`, { resource: 'credential', id: c.id });
  return row;
}

// A copy of a credential value with each sensitive member present replaced by `fn` of it.
async function mapSensitive(cc: CredentialControllerDef, kind: CredentialKind, value: Plain, fn: (member: string, v: string) => Promise<string>): Promise<Plain> {
  const out: Plain = { ...value };
  for (const member of sensitiveOf(cc, kind)) {
    if (out[member] !== undefined) out[member] = await fn(member, String(out[member]));
  }
  return out;
}

// Credential members are sealed for their purpose (AES-GCM associated data): their ciphertexts,
// which definition exports show, then do not open as secrets, which secret import would decrypt
// for a client, and credential values are never to be returned (SPEC section 7).
const sealedFor = (member: string) => `taskbridge:credential:${member}`;
// Members stored before purposes were bound open without one, until their alias is rotated or the
// credential written again (both seal them bound). Not so an import's: a member sealed for no purpose
// may be a secret's ciphertext, whose plaintext the credential would then send upstream.
const openableAs = (member: string) => [sealedFor(member), undefined];
const importableAs = (member: string) => ({
  aad: sealedFor(member),
  unbound: `is sealed without the associated data '${sealedFor(member)}' of a credential member, as a secret's value is: `
    + 'not imported. A credential stored before 2026-11-24 is exported so until its alias is rotated or it is written again: do that on the source and export it again',
});

// A credential value with its sensitive members encrypted under `dekId`.
export function sealCredential(s: KeyringServices, cc: CredentialControllerDef, kind: CredentialKind, plain: Plain, dekId: string, trx: Knex.Transaction): Promise<Plain> {
  return mapSensitive(cc, kind, plain, (member, v) => encryptWithDek(s, dekId, v, trx, sealedFor(member)));
}

// The credential's value with its sensitive members decrypted (DecryptError when one does not).
export function openCredential(s: Pick<KeyringServices, 'db' | 'cfg'>, cc: CredentialControllerDef, row: Pick<CredentialRow, 'kind' | 'value' | 'dek_id'>, trx?: Knex.Transaction): Promise<Plain> {
  return mapSensitive(cc, row.kind, row.value, (member, v) => decryptWithDek(s, row.dek_id, v, trx, openableAs(member)));
}

// The same for using the credential: a stored value that does not decrypt is damage on our side
// (500), not a bad request.
export async function unsealCredential(s: Pick<KeyringServices, 'db' | 'cfg'>, cc: CredentialControllerDef, row: CredentialRow, trx?: Knex.Transaction): Promise<Plain> {
  try {
    return await openCredential(s, cc, row, trx);
  } catch (err) {
    if (err instanceof DecryptError) throw new AppError(500, 'internal', `credential '${row.id}' does not decrypt with its DEK '${row.dek_id}'`);
    throw err;
  }
}

// The instance's resource server credential (client id and secret), decrypted; 400 when it has none.
export async function resourceServerCredential(s: Pick<KeyringServices, 'db' | 'cfg'>, cc: CredentialControllerDef, instance: repo.ProviderInstanceRow): Promise<{ row: repo.CredentialRow; plain: Plain }> {
  if (!instance.resource_server_credential_id) throw new InvalidRequest(`Provider instance '${instance.id}' has no resource server credential (client id and secret)`);
  const [row] = await repo.getCredentials(s.db, [instance.resource_server_credential_id]);
  // An instance's resource server credential goes only with the instance: it was deleted since it was read.
  if (!row) throw new NotFound('provider_instance', instance.id);
  return { row, plain: await unsealCredential(s, cc, row) };
}

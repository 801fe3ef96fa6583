// Whether an item of a definition export (GET /api/a2a/v1/definition) is already on an installation
// as the export has it: what re-applying an export (scripts/apply-definition.ts) skips, and what it
// reports as a conflict instead of overwriting. Each rule answers undefined when the item is the same,
// else what differs, in words that quote no value.
//
// Values sealed under a DEK (a secret's, a credential's sensitive members) cannot be compared by a
// reader holding no key material, and an import does not always store the exported ciphertext:
// a secret sealed with an older DEK than its alias names is re-encrypted under the alias's DEK
// (domain/secrets.ts), and a credential's sensitive members are always sealed afresh. Such a value
// counts as the same while the item has not been written since it was imported (created_at equals
// updated_at: an insert stamps both alike); one written since (a PUT, an alias rotation, a token
// refresh) differs.
import { isDeepStrictEqual } from 'node:util';
import type { Definition } from './shapes/definition.ts';
import type { Secret } from './shapes/secret.ts';
import type { Credential, ProviderInstanceDetail } from './shapes/bridge.ts';
import type { CredentialKind } from '../db/bridge.ts';
import { credentialDef, providerDef } from './bridge/catalog.ts';
import { sensitiveOf } from './bridge/credentials.ts';

export type DefinitionSecret = Definition['secrets'][number];
export type DefinitionProvider = Definition['providers'][number];
export type DefinitionCredential = NonNullable<DefinitionProvider['resource_server_credential']>;

const unwrittenSinceImport = (t: { created_at: string; updated_at: string }) => t.created_at === t.updated_at;

// The DEK each alias names in the export.
export function aliasTargets(def: Pick<Definition, 'envelope_keys'>): Map<string, string> {
  return new Map(def.envelope_keys.flatMap((k) => k.data_encryption_keys.flatMap((d) => d.aliases.map((a) => [a, d.id] as const))));
}

// `aliasDek`: the DEK the secret's alias names on the target (once the export's aliases are applied).
// An import seals a value sealed with another DEK afresh with that one: only a value sealed with it
// is stored as exported, and so comparable as ciphertext.
export function secretDifference(file: DefinitionSecret, target: Secret, aliasDek: string | undefined): string | undefined {
  if (target.key !== file.key) return `it has key '${target.key}'`;
  if (target.dek_alias !== file.dek_alias) return `it is under alias '${target.dek_alias}', not '${file.dek_alias}'`;
  if (target.encrypted_secret === file.encrypted_value) return undefined;
  const reEncryptedAtImport = file.data_encryption_key_id !== aliasDek;
  return reEncryptedAtImport && unwrittenSinceImport(target) ? undefined : 'its value differs';
}

export function credentialDifference(file: DefinitionCredential, target: Credential, providerTypeId: string, kind: CredentialKind): string | undefined {
  if (target.type_id !== file.type_id) return `it is a '${target.type_id}' credential, not '${file.type_id}'`;
  if (target.dek_alias !== file.dek_alias) return `it is under alias '${target.dek_alias}', not '${file.dek_alias}'`;
  if (!isDeepStrictEqual(target.metadata, file.metadata)) return 'its metadata differs';
  const sensitive = sensitiveOf(credentialDef(providerDef(providerTypeId), file.type_id), kind);
  const value = file.value as Record<string, unknown>;
  const theirs = target.value as Record<string, unknown>;
  for (const member of new Set([...Object.keys(value), ...Object.keys(theirs)])) {
    if (isDeepStrictEqual(value[member], theirs[member])) continue;
    const resealed = sensitive.includes(member) && typeof value[member] === 'string' && typeof theirs[member] === 'string' && unwrittenSinceImport(target);
    if (!resealed) return `its value's member '${member}' differs`;
  }
  return undefined;
}

// A status the API can set: refresh_failed is only ever set by a failed token refresh, which the
// target's worker does (or does not) itself, so an instance made active meets it.
export const settableStatus = (status: DefinitionProvider['status']) => (status === 'refresh_failed' ? 'active' : status);

// An instance the file has disabled that the target has as its create call made it (active, or
// brokering_initiated when it still needs its user credential brokered), unwritten since: an apply
// creates an instance (the call takes no status) and then disables it, so this is one whose disable
// did not happen (the run was cut, the PATCH failed). Applying again disables it. One written since
// (an admin's PATCH active) keeps its status: a conflict.
export const disableUnfinished = (file: DefinitionProvider, target: ProviderInstanceDetail) =>
  file.status === 'disabled' && (target.status === 'active' || target.status === 'brokering_initiated') && unwrittenSinceImport(target);

export function providerDifference(file: DefinitionProvider, target: ProviderInstanceDetail): string | undefined {
  for (const member of ['display_name', 'provider_controller_type_id', 'credential_controller_type_id'] as const) {
    if (target[member] !== file[member]) return `its ${member} differs`;
  }
  const sameStatus = target.status === file.status || target.status === settableStatus(file.status) || disableUnfinished(file, target);
  if (!sameStatus) return `it is ${target.status}, not ${file.status}`;
  if (target.resource_server_credential_id !== file.resource_server_credential?.id) return 'it has another resource server credential';
  if (target.user_credential_id !== file.user_credential?.id) return 'it has another user credential';
  if (!isDeepStrictEqual(target.return_on_successful_brokering, file.return_on_successful_brokering)) return 'its return_on_successful_brokering differs';
  return undefined;
}

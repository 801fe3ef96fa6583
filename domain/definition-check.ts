// Whether a definition export (GET /api/a2a/v1/definition) can be applied whole to an installation:
// every name it uses resolvable, in the file or on the target, and nothing listed twice otherwise.
// scripts/apply-definition.ts checks this before writing anything, so a hand-edited or malformed file
// is refused as a whole rather than applied in part. What only a write can reveal (a value that does
// not decrypt, a credential its controller's schema refuses) stays a failure of that item, as does a
// controller or function the target's catalog lacks (targetCannotMake): no fault of the file, but of
// the target's release (older than the source's, or one that removed it).
import { isDeepStrictEqual } from 'node:util';
import type { Definition } from './shapes/definition.ts';
import type { ProviderController } from './shapes/bridge.ts';
import { aliasTargets, type DefinitionCredential, type DefinitionProvider } from './definition-match.ts';

// What the target has that the file may name: its aliases and DEK ids among those the file names
// without listing them (definitionReferences).
export interface TargetNames { aliases: Set<string>; deks: Set<string> }
// The target's catalog (GET /api/bridge/v1/available-providers), by provider controller type id.
export type TargetCatalog = Map<string, Pick<ProviderController, 'type_id' | 'credential_controllers' | 'functions'>>;

// Names a problem is about, then the items that use it: a problem shared by many items is one line.
const NAMED_AT_MOST = 3;
export const naming = (users: string[]) => users.slice(0, NAMED_AT_MOST).join(', ') + (users.length > NAMED_AT_MOST ? ` and ${users.length - NAMED_AT_MOST} more` : '');

const credentialsOf = (def: Pick<Definition, 'providers'>) => def.providers.flatMap((p) =>
  ([['resource server', p.resource_server_credential], ['user', p.user_credential]] as const)
    .filter((e): e is readonly ['resource server' | 'user', DefinitionCredential] => e[1] !== undefined)
    .map(([kind, c]) => ({ c, p, name: `${kind} credential ${c.id} of provider ${p.id}` })));
const fileDeks = (def: Pick<Definition, 'envelope_keys'>) => new Set(def.envelope_keys.flatMap((k) => k.data_encryption_keys.map((d) => d.id)));

// The aliases and DEK ids the file's secrets and credentials name and it does not list: to be looked up on the target.
export function definitionReferences(def: Definition): { aliases: string[]; deks: string[] } {
  const aliases = aliasTargets(def);
  const deks = fileDeks(def);
  const sealed = [...def.secrets, ...credentialsOf(def).map((e) => e.c)];
  return {
    aliases: [...new Set(sealed.map((s) => s.dek_alias).filter((a) => !aliases.has(a)))],
    deks: [...new Set(sealed.map((s) => s.data_encryption_key_id).filter((d) => !deks.has(d)))],
  };
}

// One sentence per problem; none when the file can be applied.
export function definitionProblems(def: Definition, target: TargetNames): string[] {
  const problems: string[] = [];
  const grouped = new Map<string, string[]>();
  const note = (problem: string, user: string) => grouped.set(problem, [...(grouped.get(problem) ?? []), user]);

  const deks = new Set<string>();
  const aliasOf = new Map<string, string>();
  for (const d of def.envelope_keys.flatMap((k) => k.data_encryption_keys)) {
    if (deks.has(d.id)) problems.push(`DEK ${d.id} is listed twice`);
    deks.add(d.id);
    for (const a of d.aliases) {
      if (aliasOf.has(a) && aliasOf.get(a) !== d.id) problems.push(`alias '${a}' is listed on DEKs ${aliasOf.get(a)} and ${d.id}`);
      aliasOf.set(a, d.id);
    }
  }
  const sealedWith = (user: string, s: { dek_alias: string; data_encryption_key_id: string }) => {
    if (!aliasOf.has(s.dek_alias) && !target.aliases.has(s.dek_alias)) note(`dek_alias '${s.dek_alias}' is neither an alias of the file's DEKs nor one on the target`, user);
    if (!deks.has(s.data_encryption_key_id) && !target.deks.has(s.data_encryption_key_id)) note(`data_encryption_key_id '${s.data_encryption_key_id}' is neither a DEK of the file nor one on the target`, user);
  };

  // A secret listed twice alike is one secret (applied once); listed twice otherwise, one would overwrite the other.
  const secretById = new Map<string, Definition['secrets'][number]>();
  const idByKey = new Map<string, string>();
  for (const s of def.secrets) {
    const name = `secret ${s.key} (${s.id})`;
    const same = secretById.get(s.id);
    if (same && !isDeepStrictEqual(same, s)) problems.push(`secret ${s.id} is listed twice, differently`);
    const keyHolder = idByKey.get(s.key);
    if (keyHolder !== undefined && keyHolder !== s.id) problems.push(`key '${s.key}' is the key of two secrets, ${keyHolder} and ${s.id}`);
    secretById.set(s.id, s);
    idByKey.set(s.key, s.id);
    sealedWith(name, s);
  }

  const providerIds = new Set<string>();
  for (const p of def.providers) {
    if (providerIds.has(p.id)) problems.push(`provider ${p.id} is listed twice`);
    providerIds.add(p.id);
  }

  const credentialById = new Map<string, DefinitionCredential>();
  for (const { c, p, name } of credentialsOf(def)) {
    if (c.type_id !== p.credential_controller_type_id) problems.push(`${name} is a '${c.type_id}' credential, not '${p.credential_controller_type_id}' as its provider`);
    const same = credentialById.get(c.id);
    if (same && !isDeepStrictEqual(same, c)) problems.push(`credential ${c.id} is listed differently at two providers`);
    credentialById.set(c.id, c);
    sealedWith(name, c);
  }

  // As the API has it (a refresh token works only with the client it was issued to): a user
  // credential's instances share their resource server credential.
  const clientOfUser = new Map<string, { rs?: string; provider: string }>();
  for (const p of def.providers) {
    if (!p.user_credential) continue;
    const first = clientOfUser.get(p.user_credential.id);
    if (!first) clientOfUser.set(p.user_credential.id, { rs: p.resource_server_credential?.id, provider: p.id });
    else if (first.rs !== p.resource_server_credential?.id) {
      problems.push(`providers ${first.provider} and ${p.id} share user credential ${p.user_credential.id} with different resource server credentials (instances that share one need the same)`);
    }
  }

  for (const [problem, users] of grouped) problems.push(`${problem} (${naming(users)})`);
  return problems;
}

// Why the target cannot make a provider of the file (nor import its credentials), or, given `fn`, enable
// that function of it: what it names is not in the target's catalog. Undefined when it can.
export function targetCannotMake(p: Pick<DefinitionProvider, 'provider_controller_type_id' | 'credential_controller_type_id'>, catalog: TargetCatalog, fn?: string): string | undefined {
  const controller = catalog.get(p.provider_controller_type_id);
  if (!controller) return `provider_controller_type_id '${p.provider_controller_type_id}' is not in the target's catalog`;
  if (!controller.credential_controllers.some((c) => c.type_id === p.credential_controller_type_id)) {
    return `credential_controller_type_id '${p.credential_controller_type_id}' is not one of provider controller '${controller.type_id}' in the target's catalog`;
  }
  if (fn !== undefined && !controller.functions.some((c) => c.type_id === fn)) return `function '${fn}' is not one of provider controller '${controller.type_id}' in the target's catalog`;
  return undefined;
}

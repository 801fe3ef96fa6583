// The declarative export behind GET /api/a2a/v1/definition: the agent card, the envelope keys
// with the wrapped DEKs the configuration uses (by alias), and the secrets in encrypted form,
// so a fresh installation holding the same envelope keys can re-apply it through the import
// endpoints. Nothing is decrypted or unwrapped here. Providers come with their credentials,
// whose sensitive members are ciphertext under data_encryption_key_id.
//
// An installation's secrets and providers have no bound in number and may be up to the body limit
// each, so the document is written as it is read, batch by batch (db/definition.ts), as JSON text
// with the client's pace (backpressure): what the API holds is a batch, whatever the installation's size.
import type { Readable } from 'node:stream';
import type { Knex } from 'knex';
import { openDefinitionReader, type CredentialExportRow, type DefinitionReader, type DekExportRow, type EnvelopeKeyExportRow, type ProviderExportRow, type SecretExportRow } from '../db/definition.ts';
import type { Definition } from './shapes/definition.ts';
import type { Config } from './config.ts';
import type { Logger } from './logger.ts';
import { agentCard } from './a2a/agent-card.ts';
import { storedFunctionDef, storedProviderDef } from './bridge/catalog.ts';
import { elements, opened, snapshotStreams, StreamCut } from './json-stream.ts';

type Item<K extends keyof Definition> = NonNullable<Definition[K]> extends (infer T)[] ? T : never;

const iso = (d: Date) => d.toISOString();

const credential = (c: CredentialExportRow) => ({
  id: c.id, type_id: c.type_id, dek_alias: c.dek_alias, data_encryption_key_id: c.dek_id, metadata: c.metadata, value: c.value,
  ...(c.next_rotation_time ? { next_rotation_time: iso(c.next_rotation_time) } : {}),
});

const envelopeKey = (k: EnvelopeKeyExportRow): Omit<Item<'envelope_keys'>, 'data_encryption_keys'> => ({
  id: k.id,
  type: k.type as 'local' | 'aws_kms',
  ...(k.file_name ? { file_name: k.file_name } : {}),
  ...(k.arn ? { arn: k.arn } : {}),
  ...(k.region ? { region: k.region } : {}),
  created_at: iso(k.created_at),
});

const dek = (d: DekExportRow): Item<'envelope_keys'>['data_encryption_keys'][number] => ({
  id: d.id, encrypted_data_encryption_key: d.encrypted_dek, aliases: d.aliases, created_at: iso(d.created_at), updated_at: iso(d.updated_at),
});

const secret = (s: SecretExportRow): Item<'secrets'> => ({
  id: s.id, key: s.key, encrypted_value: s.encrypted_secret, dek_alias: s.dek_alias, data_encryption_key_id: s.dek_id,
  created_at: iso(s.created_at), updated_at: iso(s.updated_at),
});

// A function instance whose function (or provider) this release's catalog no longer has is left out, as
// the API's lists leave it out: no installation of this release could enable it, so no apply could make it.
// Why, when it is: the document's `omitted` tells its reader the file lacks it.
const uncatalogued = (p: ProviderExportRow, f: string): string | undefined => {
  if (!storedProviderDef(p.provider_controller_type_id)) return `provider controller '${p.provider_controller_type_id}' is not in this release's catalog`;
  if (!storedFunctionDef(p.provider_controller_type_id, f)) return `function '${f}' is not one of provider controller '${p.provider_controller_type_id}' in this release's catalog`;
  return undefined;
};

const provider = (p: ProviderExportRow, credentialById: Map<string, ReturnType<typeof credential>>, functions: string[]): Item<'providers'> => ({
  id: p.id, display_name: p.display_name, provider_controller_type_id: p.provider_controller_type_id,
  // An admin's disable is what a definition holds, over a refresh_failed it outlives (applied
  // elsewhere, the instance is to stay disabled, not become active).
  credential_controller_type_id: p.credential_controller_type_id, status: p.disabled_by_admin ? 'disabled' : p.status,
  ...(p.return_on_successful_brokering ? { return_on_successful_brokering: p.return_on_successful_brokering } : {}),
  ...(p.resource_server_credential_id ? { resource_server_credential: credentialById.get(p.resource_server_credential_id) } : {}),
  ...(p.user_credential_id ? { user_credential: credentialById.get(p.user_credential_id) } : {}),
  functions,
});

// The Definition document as JSON text, its members in the schema's order, as JSON.stringify would write it whole.
async function* definitionText(reader: DefinitionReader, cfg: Config, log: Logger): AsyncGenerator<string> {
  yield `${opened({ format: 'taskbridge-definition/v1', exported_at: new Date().toISOString(), agent_card: agentCard(cfg) })},"envelope_keys":[`;
  let comma = '';
  for await (const keys of reader.envelopeKeys()) {
    for (const k of keys) {
      yield `${comma}${opened(envelopeKey(k))},"data_encryption_keys":[`;
      yield* elements(reader.deks(k.id), (deks) => deks.map(dek));
      yield ']}';
      comma = ',';
    }
  }
  yield '],"secrets":[';
  yield* elements(reader.secrets(), (secrets) => secrets.map(secret));
  yield '],"providers":[';
  // Held until the providers are written: few (rows a release removal left), each a few names.
  const omitted: Item<'omitted'>[] = [];
  yield* elements(reader.providers(), ({ providers, credentials }) => {
    const credentialById = new Map(credentials.map((c) => [c.id, credential(c)]));
    return providers.map((p) => {
      const functions = p.functions.filter((f) => {
        const reason = uncatalogued(p, f);
        if (reason) omitted.push({ kind: 'function_instance', provider_id: p.id, provider_controller_type_id: p.provider_controller_type_id, function_controller_type_id: f, reason });
        return !reason;
      });
      return provider(p, credentialById, functions);
    });
  });
  yield `],"omitted":${JSON.stringify(omitted)}}`;
  if (omitted.length) log.warn({ left_out: omitted.length }, `definition export: ${omitted.length} function instance(s) left out (listed in its omitted): their provider or function is not in this release's catalog`);
}

// Exports this process writes at once (DEFINITION_EXPORTS_AT_ONCE): each holds a database connection
// for as long as its client takes to read it. An export is an occasional backup: one more is refused.
const definitionExports = snapshotStreams('definition export');

// The export as a JSON stream, once its snapshot has begun (a database out of reach fails here, before
// anything is answered). The snapshot ends when the stream closes: written whole, failed, destroyed as
// its client went away, or cut at DEFINITION_EXPORT_TIMEOUT_MS, which bounds how long a client reading
// slowly holds the connection (one that stops reading is cut sooner, at API_WRITE_STALL_MS).
export async function exportDefinition(db: Knex, cfg: Config, log: Logger): Promise<Readable> {
  const body = await definitionExports({ most: cfg.DEFINITION_EXPORTS_AT_ONCE, setting: 'DEFINITION_EXPORTS_AT_ONCE' }, () => openDefinitionReader(db), (reader) => definitionText(reader, cfg, log), log);
  const timeUp = new StreamCut('the definition export was not read whole within DEFINITION_EXPORT_TIMEOUT_MS');
  const timer = setTimeout(() => body.destroy(timeUp), cfg.DEFINITION_EXPORT_TIMEOUT_MS);
  body.once('close', () => {
    clearTimeout(timer);
    if (body.errored === timeUp) log.warn({ timeout_ms: cfg.DEFINITION_EXPORT_TIMEOUT_MS }, 'definition export cut: not read whole in time');
  });
  return body;
}

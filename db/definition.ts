// Read-only queries behind the definition export (domain/definition.ts). Each table group is read
// only when its migration has run, so the export works on a schema that predates it.
import type { Knex } from 'knex';
import type { Tx } from './knex.ts';
import type { CredentialRow, ProviderInstanceRow } from './bridge.ts';
import { inSnapshot } from './snapshot.ts';

export interface EnvelopeKeyExportRow { id: string; type: string; file_name: string | null; arn: string | null; region: string | null; created_at: Date }
export interface DekExportRow { id: string; envelope_key_id: string; encrypted_dek: string; aliases: string[]; created_at: Date; updated_at: Date }
export type CredentialExportRow = Pick<CredentialRow, 'id' | 'type_id' | 'value' | 'metadata' | 'dek_id' | 'dek_alias' | 'next_rotation_time'>;
export type ProviderExportRow = Omit<ProviderInstanceRow, 'created_at' | 'updated_at'> & { functions: string[] };
export interface SecretExportRow { id: string; key: string; encrypted_secret: string; dek_id: string; dek_alias: string; created_at: Date; updated_at: Date }

async function presentTables(db: Tx, names: string[]): Promise<Set<string>> {
  const { rows } = await db.raw(`select name from unnest(?::text[]) as name where to_regclass('public.' || name) is not null`, [names]);
  return new Set(rows.map((r: { name: string }) => r.name));
}

export interface DefinitionRows {
  envelopeKeys: EnvelopeKeyExportRow[]; deks: DekExportRow[]; secrets: SecretExportRow[]; providers: ProviderExportRow[]; credentials: CredentialExportRow[];
}

// All in one snapshot: an alias rotation or DEK migration between two of the reads would otherwise
// export a secret or credential under a DEK the export does not hold.
export async function definitionRows(db: Knex): Promise<DefinitionRows> {
  return inSnapshot(db, readRows);
}

async function readRows(db: Tx): Promise<DefinitionRows> {
  const present = await presentTables(db, ['envelope_keys', 'deks', 'dek_aliases', 'secrets', 'provider_instances']);
  const hasKeys = present.has('envelope_keys') && present.has('deks') && present.has('dek_aliases');
  const hasSecrets = present.has('secrets');
  const hasBridge = present.has('provider_instances');
  const envelopeKeys: EnvelopeKeyExportRow[] = hasKeys
    ? await db('envelope_keys').select('id', 'type', 'file_name', 'arn', 'region', 'created_at').orderBy([{ column: 'created_at' }, { column: 'id' }])
    : [];
  // The DEKs the configuration needs: those an alias points at or a secret or credential is encrypted with.
  const deks: DekExportRow[] = hasKeys
    ? (await db.raw(
      `select d.id, d.envelope_key_id, d.encrypted_dek, d.created_at, d.updated_at,
              coalesce(array_agg(a.alias order by a.alias) filter (where a.alias is not null), '{}') as aliases
         from deks d
         left join dek_aliases a on a.dek_id = d.id
        where exists (select 1 from dek_aliases x where x.dek_id = d.id)
              ${hasSecrets ? 'or exists (select 1 from secrets s where s.dek_id = d.id)' : ''}
              ${hasBridge ? 'or exists (select 1 from bridge_credentials c where c.dek_id = d.id)' : ''}
        group by d.id
        order by d.envelope_key_id, d.created_at, d.id`,
    )).rows
    : [];
  const secrets: SecretExportRow[] = hasSecrets
    ? await db('secrets').select('id', 'key', 'encrypted_secret', 'dek_id', 'dek_alias', 'created_at', 'updated_at').orderBy([{ column: 'key' }])
    : [];
  const providers: ProviderExportRow[] = hasBridge
    ? (await db.raw(
      `select p.id, p.display_name, p.provider_controller_type_id, p.credential_controller_type_id, p.status,
              p.return_on_successful_brokering, p.resource_server_credential_id, p.user_credential_id,
              coalesce(array_agg(f.function_controller_type_id order by f.function_controller_type_id)
                       filter (where f.function_controller_type_id is not null), '{}') as functions
         from provider_instances p
         left join function_instances f on f.provider_instance_id = p.id
        group by p.id
        order by p.id`,
    )).rows
    : [];
  const credentials: CredentialExportRow[] = hasBridge
    ? await db('bridge_credentials').select('id', 'type_id', 'value', 'metadata', 'dek_id', 'dek_alias', 'next_rotation_time')
      .whereIn('id', providers.flatMap((p) => [p.resource_server_credential_id, p.user_credential_id]).filter((c): c is string => c !== null))
    : [];
  return { envelopeKeys, deks, secrets, providers, credentials };
}

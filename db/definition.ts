// Read-only queries behind the definition export (domain/definition.ts), all in one snapshot held
// open while the export is written. Each table group is read only when its migration has run, so the
// export works on a schema that predates it. Lists are read in batches: secrets and credentials may
// be up to the body limit each and their number has no bound, so a batch is bounded by bytes too.
import type { Knex } from 'knex';
import { instanceWeightSql, type CredentialRow, type ProviderInstanceRow } from './bridge.ts';
import { PAGE_MAX_BYTES } from './pagination.ts';
import { holdSnapshot } from './snapshot.ts';

export interface EnvelopeKeyExportRow { id: string; type: string; file_name: string | null; arn: string | null; region: string | null; created_at: Date }
export interface DekExportRow { id: string; envelope_key_id: string; encrypted_dek: string; aliases: string[]; created_at: Date; updated_at: Date }
export type CredentialExportRow = Pick<CredentialRow, 'id' | 'type_id' | 'value' | 'metadata' | 'dek_id' | 'dek_alias' | 'next_rotation_time'>;
export type ProviderExportRow = Omit<ProviderInstanceRow, 'created_at' | 'updated_at'> & { functions: string[] };
export interface SecretExportRow { id: string; key: string; encrypted_secret: string; dek_id: string; dek_alias: string; created_at: Date; updated_at: Date }
// A batch of providers with the credentials they name (each once, however many of them name it).
export interface ProviderBatch { providers: ProviderExportRow[]; credentials: CredentialExportRow[] }

async function presentTables(db: Knex.Transaction, names: string[]): Promise<Set<string>> {
  const { rows } = await db.raw(`select name from unnest(?::text[]) as name where to_regclass('public.' || name) is not null`, [names]);
  return new Set(rows.map((r: { name: string }) => r.name));
}

// Rows a batch holds at most; past its first row it also ends once its rows' sizes reach PAGE_MAX_BYTES.
const BATCH_ROWS = 1000;

interface BatchedList {
  key: string[]; // qualified columns: unique, and the list's order (ascending)
  sizes: () => Knex.QueryBuilder; // the list's rows (filters only), to read their keys and sizes
  size: string; // SQL: what a row weighs in the export
  rows: () => Knex.QueryBuilder; // the select of the rows themselves (joins and grouping too)
}

// A list's rows in batches, in its order. The keys and sizes of the next BATCH_ROWS rows are read
// first, each size worked out once, and cut into batches; then each batch's rows by their key range,
// which the snapshot holds to the same rows. (Sizing the candidates of every batch afresh, as
// keysetPage does, would make each credential's JSON text again for every batch it waits through.)
async function* batches<Row>(trx: Knex.Transaction, list: BatchedList): AsyncGenerator<Row[]> {
  const tuple = (values: unknown[]) => `(${values.map(() => '?').join(', ')})`;
  const keys = `(${list.key.map(() => '??').join(', ')})`;
  const between = (from: unknown[], to: unknown[]) => list.rows().whereRaw(`${keys} >= ${tuple(from)} and ${keys} <= ${tuple(to)}`, [...list.key, ...from, ...list.key, ...to] as Knex.Value[])
    .orderBy(list.key.map((column) => ({ column })));
  const keyOf = (r: Record<string, unknown>) => list.key.map((_, i) => r[`k${i}`]);
  let after: unknown[] | undefined;
  for (;;) {
    const q = list.sizes().select(...list.key.map((c, i) => trx.raw('?? as ??', [c, `k${i}`])), trx.raw(`${list.size} as size`))
      .orderBy(list.key.map((column) => ({ column }))).limit(BATCH_ROWS);
    if (after) q.whereRaw(`${keys} > ${tuple(after)}`, [...list.key, ...after] as Knex.Value[]);
    const sized: Record<string, unknown>[] = await q;
    let first = 0;
    let bytes = 0;
    for (let i = 0; i < sized.length; i++) {
      bytes += Number(sized[i].size);
      if (bytes < PAGE_MAX_BYTES && i < sized.length - 1) continue;
      yield (await between(keyOf(sized[first]), keyOf(sized[i]))) as Row[];
      first = i + 1;
      bytes = 0;
    }
    if (sized.length < BATCH_ROWS) return;
    after = keyOf(sized[sized.length - 1]);
  }
}

export interface DefinitionReader {
  envelopeKeys(): AsyncGenerator<EnvelopeKeyExportRow[]>;
  // The DEKs of an envelope key the configuration needs: those an alias points at or a secret or credential is encrypted with.
  deks(envelopeKeyId: string): AsyncGenerator<DekExportRow[]>;
  secrets(): AsyncGenerator<SecretExportRow[]>;
  providers(): AsyncGenerator<ProviderBatch>;
  /** Ends the snapshot and releases its connection; call it once no read is under way. */
  end(): Promise<void>;
}

const nothing = async function* <T>(): AsyncGenerator<T> { /* the table group is not there yet */ };

// All in one snapshot: an alias rotation or DEK migration between two of the reads would otherwise
// export a secret or credential under a DEK the export does not hold. The snapshot is begun and
// first read here, so that a database out of reach fails the request before anything is answered.
export async function openDefinitionReader(db: Knex): Promise<DefinitionReader> {
  const { trx, first: present, end } = await holdSnapshot(db, (t) => presentTables(t, ['envelope_keys', 'deks', 'dek_aliases', 'secrets', 'provider_instances']));
  const hasKeys = present.has('envelope_keys') && present.has('deks') && present.has('dek_aliases');
  const hasSecrets = present.has('secrets');
  const hasBridge = present.has('provider_instances');
  const used = `(exists (select 1 from dek_aliases x where x.dek_id = d.id)
                 ${hasSecrets ? 'or exists (select 1 from secrets s where s.dek_id = d.id)' : ''}
                 ${hasBridge ? 'or exists (select 1 from bridge_credentials c where c.dek_id = d.id)' : ''})`;
  return {
    envelopeKeys: () => (hasKeys ? batches<EnvelopeKeyExportRow>(trx, {
      key: ['k.created_at', 'k.id'],
      sizes: () => trx('envelope_keys as k'),
      size: 'octet_length(concat(k.id, k.file_name, k.arn, k.region))',
      rows: () => trx('envelope_keys as k').select('k.id', 'k.type', 'k.file_name', 'k.arn', 'k.region', 'k.created_at'),
    }) : nothing()),
    deks: (envelopeKeyId) => batches<DekExportRow>(trx, {
      key: ['d.created_at', 'd.id'],
      sizes: () => trx('deks as d').where('d.envelope_key_id', envelopeKeyId).whereRaw(used),
      size: 'octet_length(d.encrypted_dek) + coalesce((select sum(octet_length(a.alias)) from dek_aliases a where a.dek_id = d.id), 0)',
      rows: () => trx('deks as d').where('d.envelope_key_id', envelopeKeyId).whereRaw(used)
        .select('d.id', 'd.envelope_key_id', 'd.encrypted_dek', 'd.created_at', 'd.updated_at',
          trx.raw(`coalesce(array_agg(a.alias order by a.alias) filter (where a.alias is not null), '{}') as aliases`))
        .leftJoin('dek_aliases as a', 'a.dek_id', 'd.id').groupBy('d.id'),
    }),
    secrets: () => (hasSecrets ? batches<SecretExportRow>(trx, {
      key: ['s.key'],
      sizes: () => trx('secrets as s'),
      size: 'octet_length(s.key) + octet_length(s.encrypted_secret)',
      rows: () => trx('secrets as s').select('s.id', 's.key', 's.encrypted_secret', 's.dek_id', 's.dek_alias', 's.created_at', 's.updated_at'),
    }) : nothing()),
    providers: () => (hasBridge ? providerBatches(trx, batches<ProviderExportRow>(trx, {
      key: ['p.id'],
      sizes: () => trx('provider_instances as p'),
      size: instanceWeightSql('p'), // a credential counted at each provider that embeds it
      rows: () => trx('provider_instances as p')
        .select('p.id', 'p.display_name', 'p.provider_controller_type_id', 'p.credential_controller_type_id', 'p.status', 'p.disabled_by_admin',
          'p.return_on_successful_brokering', 'p.resource_server_credential_id', 'p.user_credential_id',
          trx.raw(`coalesce(array_agg(f.function_controller_type_id order by f.function_controller_type_id)
                            filter (where f.function_controller_type_id is not null), '{}') as functions`))
        .leftJoin('function_instances as f', 'f.provider_instance_id', 'p.id').groupBy('p.id'),
    })) : nothing()),
    end,
  };
}

// Each batch of providers with the credentials it names, read for that batch only.
async function* providerBatches(trx: Knex.Transaction, providers: AsyncGenerator<ProviderExportRow[]>): AsyncGenerator<ProviderBatch> {
  for await (const batch of providers) {
    const ids = [...new Set(batch.flatMap((p) => [p.resource_server_credential_id, p.user_credential_id]).filter((c): c is string => c !== null))];
    const credentials: CredentialExportRow[] = ids.length
      ? await trx('bridge_credentials').select('id', 'type_id', 'value', 'metadata', 'dek_id', 'dek_alias', 'next_rotation_time').whereIn('id', ids)
      : [];
    yield { providers: batch, credentials };
  }
}

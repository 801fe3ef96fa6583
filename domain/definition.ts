// The declarative export behind GET /api/a2a/v1/definition: the agent card, the envelope keys
// with the wrapped DEKs the configuration uses (by alias), and the secrets in encrypted form,
// so a fresh installation holding the same envelope keys can re-apply it through the import
// endpoints. Nothing is decrypted or unwrapped here. Providers join the export once the bridge
// stores them.
import type { Tx } from '../db/knex.ts';
import { definitionRows } from '../db/definition.ts';
import type { Definition } from '../api/schemas/definition.ts';
import type { Config } from './config.ts';
import { agentCard } from './a2a/agent-card.ts';

const iso = (d: Date) => d.toISOString();

export async function exportDefinition(db: Tx, cfg: Config): Promise<Definition> {
  const { envelopeKeys, deks, secrets } = await definitionRows(db);
  return {
    format: 'taskbridge-definition/v1',
    exported_at: new Date().toISOString(),
    agent_card: agentCard(cfg) as unknown as Record<string, unknown>,
    envelope_keys: envelopeKeys.map((k) => ({
      id: k.id,
      type: k.type as 'local' | 'aws_kms',
      ...(k.file_name ? { file_name: k.file_name } : {}),
      ...(k.arn ? { arn: k.arn } : {}),
      ...(k.region ? { region: k.region } : {}),
      created_at: iso(k.created_at),
      data_encryption_keys: deks.filter((d) => d.envelope_key_id === k.id).map((d) => ({
        id: d.id, encrypted_data_encryption_key: d.encrypted_dek, aliases: d.aliases, created_at: iso(d.created_at), updated_at: iso(d.updated_at),
      })),
    })),
    secrets: secrets.map((s) => ({
      id: s.id, key: s.key, encrypted_value: s.encrypted_secret, dek_alias: s.dek_alias, data_encryption_key_id: s.dek_id,
      created_at: iso(s.created_at), updated_at: iso(s.updated_at),
    })),
    providers: [],
  };
}

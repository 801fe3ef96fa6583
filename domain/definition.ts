// The declarative export behind GET /api/a2a/v1/definition: the agent card, the envelope keys
// with the wrapped DEKs the configuration uses (by alias), and the secrets in encrypted form,
// so a fresh installation holding the same envelope keys can re-apply it through the import
// endpoints. Nothing is decrypted or unwrapped here. Providers come with their credentials,
// whose sensitive members are ciphertext under data_encryption_key_id.
import type { Knex } from 'knex';
import { definitionRows, type CredentialExportRow } from '../db/definition.ts';
import type { Definition } from '../api/schemas/definition.ts';
import type { Config } from './config.ts';
import { agentCard } from './a2a/agent-card.ts';

const iso = (d: Date) => d.toISOString();

const credential = (c: CredentialExportRow) => ({
  id: c.id, type_id: c.type_id, dek_alias: c.dek_alias, data_encryption_key_id: c.dek_id, metadata: c.metadata, value: c.value,
  ...(c.next_rotation_time ? { next_rotation_time: iso(c.next_rotation_time) } : {}),
});

export async function exportDefinition(db: Knex, cfg: Config): Promise<Definition> {
  const { envelopeKeys, deks, secrets, providers, credentials } = await definitionRows(db);
  const credentialById = new Map(credentials.map((c) => [c.id, credential(c)]));
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
    providers: providers.map((p) => ({
      id: p.id, display_name: p.display_name, provider_controller_type_id: p.provider_controller_type_id,
      credential_controller_type_id: p.credential_controller_type_id, status: p.status,
      ...(p.return_on_successful_brokering ? { return_on_successful_brokering: p.return_on_successful_brokering } : {}),
      ...(p.resource_server_credential_id ? { resource_server_credential: credentialById.get(p.resource_server_credential_id) } : {}),
      ...(p.user_credential_id ? { user_credential: credentialById.get(p.user_credential_id) } : {}),
      functions: p.functions,
    })),
  };
}

import { Type, type Static } from '@sinclair/typebox';
import { FreeObject, Timestamp } from './common.ts';
import { credentialFields, providerInstanceFields } from './bridge.ts';
import { EnvelopeKey } from './encryption.ts';

// GET /api/a2a/v1/definition. Key material appears only wrapped (DEKs under their envelope key)
// and secret values only encrypted (with the DEK named by data_encryption_key_id); each part
// maps onto an import endpoint of a fresh installation.
export const DefinitionDek = Type.Object({
  id: Type.String(),
  encrypted_data_encryption_key: Type.String({ description: 'base64, wrapped by the envelope key' }),
  aliases: Type.Array(Type.String()),
  created_at: Timestamp,
  updated_at: Timestamp,
});

export const DefinitionEnvelopeKey = Type.Composite([EnvelopeKey, Type.Object({ data_encryption_keys: Type.Array(DefinitionDek) })]);

export const DefinitionSecret = Type.Object({
  id: Type.String(),
  key: Type.String(),
  encrypted_value: Type.String({ description: 'base64 AES-256-GCM, encrypted with data_encryption_key_id' }),
  dek_alias: Type.String(),
  data_encryption_key_id: Type.String(),
  created_at: Timestamp,
  updated_at: Timestamp,
});

// value: an object, as every credential's is and its import takes (apply compares it member by member).
export const DefinitionCredential = Type.Object({ ...credentialFields, value: FreeObject, data_encryption_key_id: Type.String() },
  { description: 'sensitive members of value only as ciphertext under data_encryption_key_id' });

const { id, display_name, provider_controller_type_id, credential_controller_type_id, status, return_on_successful_brokering } = providerInstanceFields;
export const DefinitionProvider = Type.Object({
  id, display_name, provider_controller_type_id, credential_controller_type_id, status, return_on_successful_brokering,
  resource_server_credential: Type.Optional(DefinitionCredential),
  user_credential: Type.Optional(DefinitionCredential),
  functions: Type.Array(Type.String(), { description: 'enabled function controller type ids' }),
});

export const Definition = Type.Object({
  format: Type.Literal('taskbridge-definition/v1'),
  exported_at: Timestamp,
  agent_card: FreeObject,
  envelope_keys: Type.Array(DefinitionEnvelopeKey),
  secrets: Type.Array(DefinitionSecret),
  providers: Type.Array(DefinitionProvider),
}, { $id: 'Definition' });

export type Definition = Static<typeof Definition>;

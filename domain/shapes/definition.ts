import { Type, type Static } from '@sinclair/typebox';
import { FreeObject, Timestamp, Uuid } from './common.ts';
import { ControllerTypeId, credentialFields, providerInstanceFields } from './bridge.ts';
import { AliasName, DekId, EnvelopeKey } from './encryption.ts';
import { SecretKey } from './secret.ts';

// GET /api/a2a/v1/definition. Key material appears only wrapped (DEKs under their envelope key)
// and secret values only encrypted (with the DEK named by data_encryption_key_id); each part
// maps onto an import endpoint of a fresh installation. Names are of the shapes those endpoints take,
// so that the CLI refuses a hand-edited file whole before writing anything (scripts/apply-definition.ts).
// Ids and aliases as stored, as a secret's key is, an earlier release's too ('.' and '..', before such
// names were refused). Those two are never looked up (no URL can name them: dekNamed in
// scripts/apply-definition.ts) and their import or create is refused (NewDekId, NewAliasName): such an
// item is reported failed even on a target that has it, the installation the file came from included.
export const DefinitionDek = Type.Object({
  id: DekId,
  encrypted_data_encryption_key: Type.String({ description: 'base64, wrapped by the envelope key' }),
  aliases: Type.Array(AliasName),
  created_at: Timestamp,
  updated_at: Timestamp,
});

export const DefinitionEnvelopeKey = Type.Composite([EnvelopeKey, Type.Object({ data_encryption_keys: Type.Array(DefinitionDek) })]);

export const DefinitionSecret = Type.Object({
  id: Uuid,
  // Any key a secret may be stored with, an earlier release's too ('a/', before empty parts were
  // refused): the file lists stored secrets, which a target may have already (found there by id). One
  // it lacks is created by the import endpoint, whose NewSecretKey refuses such a key (that item fails).
  key: SecretKey,
  encrypted_value: Type.String({ description: 'base64 AES-256-GCM, encrypted with data_encryption_key_id' }),
  dek_alias: AliasName,
  data_encryption_key_id: DekId,
  created_at: Timestamp,
  updated_at: Timestamp,
});

// value: an object, as every credential's is and its import takes (apply compares it member by member).
export const DefinitionCredential = Type.Object({ ...credentialFields, type_id: ControllerTypeId, value: FreeObject, data_encryption_key_id: DekId },
  { description: 'sensitive members of value only as ciphertext under data_encryption_key_id' });

const { id, display_name, status, return_on_successful_brokering } = providerInstanceFields;
export const DefinitionProvider = Type.Object({
  id, display_name, provider_controller_type_id: ControllerTypeId, credential_controller_type_id: ControllerTypeId, status, return_on_successful_brokering,
  resource_server_credential: Type.Optional(DefinitionCredential),
  user_credential: Type.Optional(DefinitionCredential),
  functions: Type.Array(ControllerTypeId, { description: 'enabled function controller type ids' }),
});

// What the export could not express, so its reader knows the file lacks it (apply reports and skips it).
// Names as stored, of no pattern: a retired controller's may be of a shape today's are not, and an
// apply must not refuse the file over what it skips.
export const DefinitionOmission = Type.Object({
  kind: Type.Literal('function_instance'),
  provider_id: Type.String(),
  provider_controller_type_id: Type.String(),
  function_controller_type_id: Type.String(),
  reason: Type.String({ description: "why it is left out, e.g. its provider or function is not in this release's catalog" }),
});

export const Definition = Type.Object({
  format: Type.Literal('taskbridge-definition/v1'),
  exported_at: Timestamp,
  agent_card: FreeObject,
  envelope_keys: Type.Array(DefinitionEnvelopeKey),
  secrets: Type.Array(DefinitionSecret),
  providers: Type.Array(DefinitionProvider),
  // Optional: an export of an earlier release has none.
  omitted: Type.Optional(Type.Array(DefinitionOmission, { description: 'what the export left out, and why; written last, after every provider was read' })),
}, { $id: 'Definition' });

export type Definition = Static<typeof Definition>;

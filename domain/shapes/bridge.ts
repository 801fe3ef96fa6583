// Bridge shapes (seed: ProviderInstance, FunctionInstance, *Controller, Credential; SPEC.md section 7).
import { Type, type Static } from '@sinclair/typebox';
import { Body, FreeObject, HttpUrl, NoControlChars, Timestamp, IdempotencyKey, Uuid } from './common.ts';
import { AliasName } from './encryption.ts';
import { worded } from '../schema-check.ts';
import { HEADER_TOKEN_OR_EMPTY_PATTERN } from '../bridge/credential-controllers.ts';
import { CREDENTIAL_USERS_SHOWN } from '../../db/bridge.ts';
import { PROVIDER_STATUSES } from '../bridge/types.ts';

export const ProviderInstanceId = Type.String({ pattern: worded('^[A-Za-z0-9_-]{1,64}$', 'must be 1 to 64 of A-Z a-z 0-9 _ -'), description: '1..64 of A-Z a-z 0-9 _ -' });
export const ControllerTypeId = Type.String({ pattern: worded('^[a-z0-9_]{1,64}$', 'must be 1 to 64 of a-z 0-9 _') });
export const ProviderStatus = Type.Union(PROVIDER_STATUSES.map((s) => Type.Literal(s)));

export const ReturnAddress = Type.Object({
  type: Type.Literal('url'),
  url: HttpUrl,
}, { additionalProperties: false });

// What every controller in the catalog says of itself.
const controllerFields = { type_id: Type.String(), name: Type.String(), documentation: Type.String() };
// A stored provider instance still shows a provider or credential controller a release removed from
// the catalog, as a stand-in that says so (domain/bridge/catalog.ts describeStoredProvider).
const retired = Type.Optional(Type.Literal(true, {
  description: 'present only on a stand-in for a controller this release\'s catalog no longer has, which a stored provider instance names: it offers nothing, and the instance can be read, disabled and deleted, not used',
}));

export const FunctionController = Type.Object({
  ...controllerFields,
  categories: Type.Array(Type.String()),
  parameters: FreeObject,
  output: FreeObject,
}, { $id: 'FunctionController' });
export type FunctionController = Static<typeof FunctionController>;

export const CredentialController = Type.Object({
  ...controllerFields,
  requires_brokering: Type.Boolean(),
  requires_resource_server_credential_refreshing: Type.Boolean(),
  requires_user_credential_refreshing: Type.Boolean(),
  configuration_schema: Type.Object({ resource_server: FreeObject, user_credential: FreeObject }),
  retired,
}, { $id: 'CredentialController' });
export type CredentialController = Static<typeof CredentialController>;

export const ProviderController = Type.Object({
  ...controllerFields,
  categories: Type.Array(Type.String()),
  credential_controllers: Type.Array(CredentialController),
  functions: Type.Array(FunctionController),
  retired,
}, { $id: 'ProviderController' });
export type ProviderController = Static<typeof ProviderController>;

// Also the definition export's credential and provider shapes (definition.ts).
export const credentialFields = {
  id: Uuid,
  type_id: Type.String({ description: 'the credential controller' }),
  dek_alias: AliasName,
  metadata: FreeObject,
  value: Type.Unknown({ description: 'the configuration; sensitive members only as ciphertext under the DEK' }),
  next_rotation_time: Type.Optional(Timestamp),
};

export const Credential = Type.Object({
  ...credentialFields,
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'Credential' });
export type Credential = Static<typeof Credential>;

// As GET /credential lists it: with what it is for and the instances that use it.
export const ListedCredential = Type.Object({
  ...credentialFields,
  kind: Type.Union([Type.Literal('resource_server'), Type.Literal('user')]),
  provider_controller_type_id: Type.String(),
  provider_instance_ids: Type.Array(ProviderInstanceId, {
    maxItems: CREDENTIAL_USERS_SHOWN, description: `the provider instances that use it, in id order: the first ${CREDENTIAL_USERS_SHOWN} (provider_instance_count says how many)`,
  }),
  provider_instance_count: Type.Integer({ minimum: 0, description: 'how many provider instances use it; 0: none, so DELETE /credential/{credential_id} removes it' }),
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'ListedCredential' });
export type ListedCredential = Static<typeof ListedCredential>;

export const FunctionInstance = Type.Object({
  function_controller_type_id: Type.String(),
  provider_controller_type_id: Type.String(),
  provider_instance_id: Type.String(),
  controller: FunctionController,
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'FunctionInstance' });
export type FunctionInstance = Static<typeof FunctionInstance>;

export const providerInstanceFields = {
  id: ProviderInstanceId,
  display_name: Type.String(),
  provider_controller_type_id: Type.String(),
  credential_controller_type_id: Type.String(),
  status: ProviderStatus,
  disabled_by_admin: Type.Boolean({ description: "set by PATCH status disabled, cleared by PATCH status active: kept through a refresh_failed status, so brokering again makes the instance disabled, not active" }),
  resource_server_credential_id: Type.Optional(Uuid),
  user_credential_id: Type.Optional(Uuid),
  return_on_successful_brokering: Type.Optional(ReturnAddress),
  created_at: Timestamp,
  updated_at: Timestamp,
};
export const ProviderInstance = Type.Object(providerInstanceFields, { $id: 'ProviderInstance' });
export type ProviderInstance = Static<typeof ProviderInstance>;

// As listed and fetched one by one: with its controllers, enabled functions and credentials.
export const ProviderInstanceDetail = Type.Object({
  ...providerInstanceFields,
  controller: ProviderController,
  credential_controller: CredentialController,
  functions: Type.Array(FunctionInstance),
  resource_server_credential: Type.Optional(Credential),
  user_credential: Type.Optional(Credential),
}, { $id: 'ProviderInstanceDetail' });
export type ProviderInstanceDetail = Static<typeof ProviderInstanceDetail>;

export const GroupedByFunction = Type.Object({
  function_controller: FunctionController,
  provider_controller: ProviderController,
  provider_instances: Type.Array(Type.Object({
    provider_instance: ProviderInstance,
    resource_server_credential: Type.Optional(Credential),
    user_credential: Type.Optional(Credential),
  })),
});

export const InvokeResult = Type.Union([
  Type.Object({ type: Type.Literal('success') }, { additionalProperties: true }),
  Type.Object({ type: Type.Literal('error'), message: Type.String() }),
], { $id: 'InvokeResult' });
export type InvokeResult = { type: 'success'; [k: string]: unknown } | { type: 'error'; message: string };

export const ControllerParams = Type.Object({ provider_controller_type_id: ControllerTypeId, credential_controller_type_id: ControllerTypeId });
export const ProviderParams = Type.Object({ provider_instance_id: ProviderInstanceId });
export const CredentialParams = Type.Object({ credential_id: Uuid });
export const FunctionParams = Type.Object({ provider_instance_id: ProviderInstanceId, function_controller_type_id: ControllerTypeId });

export const CreateCredentialRequest = Body({
  value: FreeObject,
  metadata: Type.Optional(FreeObject),
  dek_alias: Type.Optional(AliasName),
});
export type CreateCredentialRequest = Static<typeof CreateCredentialRequest>;

// A credential as the definition export lists it: sensitive members as ciphertexts.
export const ImportCredentialRequest = Body({
  id: Type.Optional(Uuid),
  type_id: Type.Optional(Type.String({ description: 'the credential controller; must be the one of the path' })),
  value: FreeObject,
  metadata: Type.Optional(FreeObject),
  dek_alias: Type.Optional(AliasName),
  data_encryption_key_id: Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'the DEK the value is encrypted with; default: the one dek_alias names' })),
  next_rotation_time: Type.Optional(Type.Union([Timestamp, Type.Null()], { description: 'ignored: computed from the value' })),
});

export const CreateProviderInstanceRequest = Body({
  provider_instance_id: Type.Optional(ProviderInstanceId),
  display_name: Type.String({ minLength: 1, maxLength: 256, pattern: NoControlChars }),
  resource_server_credential_id: Type.Optional(Uuid),
  user_credential_id: Type.Optional(Uuid),
  return_on_successful_brokering: Type.Optional(ReturnAddress),
});
export type CreateProviderInstanceRequest = Static<typeof CreateProviderInstanceRequest>;

export const UpdateProviderInstanceRequest = Body({
  display_name: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: NoControlChars })),
  status: Type.Optional(Type.Union([Type.Literal('active'), Type.Literal('disabled')])),
});
export type UpdateProviderInstanceRequest = Static<typeof UpdateProviderInstanceRequest>;

export const InvokeFunctionRequest = Body({ params: FreeObject, idempotency_key: Type.Optional(IdempotencyKey) });
export const AgentInvokeOptions = Type.Object({ idempotencyKey: Type.Optional(IdempotencyKey) }, { additionalProperties: false });

export const ProviderListQuery = {
  status: Type.Optional(ProviderStatus),
  provider_controller_type_id: Type.Optional(ControllerTypeId),
};
export const CredentialListQuery = {
  unused: Type.Optional(Type.Boolean({ description: 'true: only the credentials no provider instance uses (those DELETE takes); false: only those in use' })),
  provider_controller_type_id: Type.Optional(ControllerTypeId),
};
export const GroupedListQuery = {
  provider_controller_type_id: Type.Optional(ControllerTypeId),
  function_category: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: NoControlChars })),
};

export const BrokerRequest = Body({ provider_instance_id: ProviderInstanceId });

export const BrokerState = Type.Object({
  type: Type.Literal('broker_state'),
  id: Uuid,
  provider_instance_id: ProviderInstanceId,
  provider_controller_type_id: Type.String(),
  credential_controller_type_id: Type.String(),
  metadata: FreeObject,
  action: Type.Object({ Redirect: Type.Object({ url: Type.String({ description: 'the provider\'s authorize URL, to send the user to' }) }) }),
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'BrokerState' });
export type BrokerState = Static<typeof BrokerState>;

// The callback's answer when brokering is complete and the instance names no return address.
export const BrokeredUserCredential = Type.Object({
  type: Type.Literal('user_credential'),
  ...credentialFields,
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'BrokeredUserCredential' });

// Providers add members of their own (Google: scope, authuser, prompt); they are ignored.
export const OAuthCallbackQuery = Type.Object({
  state: Type.Optional(Type.String({ maxLength: 512 })),
  // As a user credential holds it: one it could not hold is refused before it is redeemed, leaving the state usable.
  code: Type.Optional(Type.String({ maxLength: 4096, pattern: HEADER_TOKEN_OR_EMPTY_PATTERN })),
  error: Type.Optional(Type.String({ maxLength: 256 })),
  error_description: Type.Optional(Type.String({ maxLength: 2048 })),
}, { additionalProperties: true });

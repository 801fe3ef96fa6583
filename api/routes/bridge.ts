import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { clientGone } from '../client-gone.ts';
import { ErrorBody, FreeObject, kmsErrors, NoInput, PageQuery, Paginated, requestErrors, resourceErrors, Success } from '../../domain/shapes/common.ts';
import {
  BrokeredUserCredential, BrokerRequest, BrokerState, ControllerParams, CreateCredentialRequest, CreateProviderInstanceRequest, Credential, CredentialListQuery, CredentialParams,
  FunctionInstance, FunctionParams, GroupedByFunction, GroupedListQuery, ImportCredentialRequest, InvokeFunctionRequest, InvokeResult, ListedCredential, ProviderController, ProviderInstance, ProviderInstanceDetail,
  OAuthCallbackQuery, ProviderInstanceId, ProviderListQuery, ProviderParams, UpdateProviderInstanceRequest,
} from '../../domain/shapes/bridge.ts';
import { completeBrokering, startBrokering } from '../../domain/bridge/brokering.ts';
import { listProviders } from '../../domain/bridge/catalog.ts';
import { createCredential, deleteCredential, getCredential, importCredential, listCredentials } from '../../domain/bridge/credentials.ts';
import * as instances from '../../domain/bridge/provider-instances.ts';
import * as functions from '../../domain/bridge/functions.ts';
import { functionInstancesOpenApi } from '../../domain/bridge/function-openapi.ts';

const tag = 'bridge';
const available = '/api/bridge/v1/available-providers/:provider_controller_type_id/available-credentials/:credential_controller_type_id';
const provider = '/api/bridge/v1/provider/:provider_instance_id';
const fn = `${provider}/function/:function_controller_type_id`;

const credentialRoute = (kind: 'resource_server' | 'user', path: string, operationId: string, what: string) => defineRoute({
  method: 'post', path, operationId, tag, scope: 'bridge:write',
  summary: `Store a ${what}: checked against the credential controller's schema, sensitive members encrypted with the DEK of dek_alias (default: default)`,
  params: ControllerParams, body: CreateCredentialRequest,
  responses: { 201: Credential, ...resourceErrors, ...kmsErrors },
}, async ({ params, body, services }) => createCredential(services, kind, params.provider_controller_type_id, params.credential_controller_type_id, body));

// secret:decrypt too: an import puts a ciphertext's plaintext to use.
const importRoute = (kind: 'resource_server' | 'user', path: string, operationId: string, what: string) => defineRoute({
  method: 'post', path, operationId, tag, scope: ['bridge:write', 'secret:decrypt'],
  summary: `Import a ${what} as GET /api/a2a/v1/definition exports it: its sensitive members must decrypt with data_encryption_key_id, or the DEK of dek_alias (default: default), sealed as credential members (400 for one sealed as a secret is, without associated data); `
    + 'keeps the exported id when given',
  params: ControllerParams, body: ImportCredentialRequest,
  responses: { 201: Credential, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
}, async ({ params, body, services }) => importCredential(services, kind, params.provider_controller_type_id, params.credential_controller_type_id, body));

// Fixed paths (/provider/grouped-by-function) are registered before /provider/:provider_instance_id.
export const bridgeRoutes = [
  defineRoute({
    method: 'get', path: '/api/bridge/v1/available-providers', operationId: 'list-available-providers', tag, scope: 'bridge:read',
    summary: 'The provider controllers this service knows, with their credential controllers and functions, in type_id order',
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(ProviderController), ...requestErrors },
  }, async ({ query }) => listProviders(query.page_size!, query.next_page_token)),

  credentialRoute('resource_server', `${available}/credential/resource-server`, 'create-resource-server-credential', 'resource server credential'),
  credentialRoute('user', `${available}/credential/user-credential`, 'create-user-credential', 'user credential (e.g. OAuth tokens obtained elsewhere)'),
  importRoute('resource_server', `${available}/credential/resource-server/import`, 'import-resource-server-credential', 'resource server credential'),
  importRoute('user', `${available}/credential/user-credential/import`, 'import-user-credential', 'user credential'),

  defineRoute({
    method: 'get', path: '/api/bridge/v1/credential', operationId: 'list-credentials', tag, scope: 'bridge:read',
    summary: 'List resource server and user credentials, newest first (secret members encrypted), each with the provider instances that use it; unused=true finds those none uses',
    query: Type.Object({ ...PageQuery, ...CredentialListQuery }),
    responses: { 200: Paginated(ListedCredential), ...requestErrors },
  }, async ({ query, services }) => listCredentials(services.db, query, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'get', path: '/api/bridge/v1/credential/:credential_id', operationId: 'get-credential', tag, scope: 'bridge:read',
    summary: 'A credential as the list shows it (secret members encrypted), with the provider instances that use it',
    params: CredentialParams,
    responses: { 200: ListedCredential, ...resourceErrors },
  }, async ({ params, services }) => getCredential(services.db, params.credential_id)),

  defineRoute({
    method: 'delete', path: '/api/bridge/v1/credential/:credential_id', operationId: 'delete-credential', tag, scope: 'bridge:write',
    summary: 'Delete a credential no provider instance uses (409 naming those that do)',
    params: CredentialParams,
    responses: { 200: Success, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, services }) => {
    await deleteCredential(services.db, params.credential_id);
    return { success: true };
  }),

  defineRoute({
    method: 'post', path: `${available}/credential/user-credential/broker`, operationId: 'broker-user-credential', tag, scope: 'bridge:write',
    summary: 'Start OAuth authorization-code brokering for a provider instance: send the user to action.Redirect.url (state single use, 10 minutes; PKCE S256)',
    params: ControllerParams, body: BrokerRequest,
    // 502 too: the authorize URL needs the resource server credential decrypted.
    responses: { 200: BrokerState, ...resourceErrors, ...kmsErrors },
  }, async ({ params, body, services, log }) => startBrokering({ ...services, log }, params.provider_controller_type_id, params.credential_controller_type_id, body.provider_instance_id)),

  defineRoute({
    // No HEAD: the router would answer it with this GET, and redeem the single-use state (link prefetchers send HEAD).
    method: 'get', path: '/api/bridge/v1/generic-oauth-callback', operationId: 'generic-oauth-callback', tag, scope: null, noHead: true, noStore: true,
    summary: 'Where the provider sends the user back: exchanges the code, stores the user credential (encrypted), makes the instance active; '
      + 'answers with the credential, or 303 to the instance\'s return_on_successful_brokering URL',
    query: OAuthCallbackQuery,
    // 500 and 503 too: it reads and writes Postgres without the key check that implies them elsewhere (api/openapi.ts);
    // 409 as on any write, which api/openapi.ts implies only for methods other than GET.
    responses: { 200: BrokeredUserCredential, 303: null, 400: ErrorBody, 404: ErrorBody, 405: ErrorBody, 409: ErrorBody, 410: ErrorBody, 500: ErrorBody, 502: ErrorBody, 503: ErrorBody },
  }, async ({ query, ctx, services, log }) => {
    const outcome = await completeBrokering({ ...services, log }, query);
    if (outcome.type === 'user_credential') return { type: 'user_credential', ...outcome.credential };
    ctx.status = 303;
    ctx.redirect(outcome.url);
    return undefined;
  }),

  defineRoute({
    method: 'post', path: available, operationId: 'create-provider-instance', tag, scope: 'bridge:write',
    summary: 'Create a provider instance; active when it has every credential its controller needs, else brokering_initiated',
    params: ControllerParams, body: CreateProviderInstanceRequest,
    responses: { 201: ProviderInstance, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, body, services }) => instances.createProviderInstance(services.db, params.provider_controller_type_id, params.credential_controller_type_id, body)),

  defineRoute({
    method: 'get', path: '/api/bridge/v1/provider', operationId: 'list-provider-instances', tag, scope: 'bridge:read',
    summary: 'List provider instances, newest first, with controllers, enabled functions and credentials (secret members encrypted)',
    query: Type.Object({ ...PageQuery, ...ProviderListQuery }),
    responses: { 200: Paginated(ProviderInstanceDetail), ...requestErrors },
  }, async ({ query, services, log }) => instances.listProviderInstances(services.db, log, query, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'get', path: '/api/bridge/v1/provider/grouped-by-function', operationId: 'list-providers-grouped-by-function', tag, scope: 'bridge:read',
    summary: 'One item per function controller, with the provider instances that enabled it and their credentials (secret members encrypted); a function whose instances fill a page goes on as the first item of the next',
    query: Type.Object({ ...PageQuery, ...GroupedListQuery }),
    responses: { 200: Paginated(GroupedByFunction), ...requestErrors },
  }, async ({ query, services }) => functions.listGroupedByFunction(services.db, query, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'get', path: provider, operationId: 'get-provider-instance', tag, scope: 'bridge:read',
    summary: 'A provider instance with its controllers, enabled functions and credentials (secret members encrypted)',
    params: ProviderParams,
    responses: { 200: ProviderInstanceDetail, ...resourceErrors },
  }, async ({ params, services, log }) => instances.getProviderInstance(services.db, log, params.provider_instance_id)),

  defineRoute({
    method: 'patch', path: provider, operationId: 'update-provider-instance', tag, scope: 'bridge:write',
    summary: 'Rename a provider instance, or set it disabled or (back to) active',
    params: ProviderParams, body: UpdateProviderInstanceRequest,
    responses: { 200: ProviderInstance, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, body, services }) => instances.updateProviderInstance(services.db, params.provider_instance_id, body)),

  defineRoute({
    method: 'delete', path: provider, operationId: 'delete-provider-instance', tag, scope: 'bridge:write',
    summary: 'Delete a provider instance with its function instances and the credentials no other instance uses',
    params: ProviderParams,
    responses: { 200: Success, ...resourceErrors },
  }, async ({ params, services }) => {
    await instances.deleteProviderInstance(services.db, params.provider_instance_id);
    return { success: true };
  }),

  defineRoute({
    method: 'post', path: `${fn}/enable`, operationId: 'enable-function', tag, scope: 'bridge:write',
    summary: 'Enable a function of the provider on this instance',
    params: FunctionParams,
    body: NoInput,
    responses: { 201: FunctionInstance, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, services }) => functions.enableFunction(services.db, params.provider_instance_id, params.function_controller_type_id)),

  defineRoute({
    method: 'post', path: `${fn}/disable`, operationId: 'disable-function', tag, scope: 'bridge:write',
    summary: 'Disable an enabled function',
    params: FunctionParams,
    body: NoInput,
    responses: { 200: Success, ...resourceErrors },
  }, async ({ params, services }) => {
    await functions.disableFunction(services.db, params.provider_instance_id, params.function_controller_type_id);
    return { success: true };
  }),

  defineRoute({
    method: 'post', path: `${fn}/invoke`, operationId: 'invoke-function', tag, scope: 'bridge:invoke',
    summary: 'Invoke an enabled function: success with its output, or error with the provider\'s refusal',
    params: FunctionParams, body: InvokeFunctionRequest,
    responses: { 200: InvokeResult, ...resourceErrors, 409: ErrorBody, 502: ErrorBody },
  }, async ({ params, body, services, ctx, log }) =>
    // A client that hangs up abandons the provider call too, rather than holding it for BRIDGE_TIMEOUT_MS.
    functions.invokeFunction(services, params.provider_instance_id, params.function_controller_type_id, body.params, { signal: clientGone(ctx), log, idempotencyKey: body.idempotency_key })),

  defineRoute({
    method: 'get', path: '/api/bridge/v1/function-instances', operationId: 'list-function-instances', tag, scope: 'bridge:read',
    summary: 'List enabled functions, newest first',
    query: Type.Object({ ...PageQuery, provider_instance_id: Type.Optional(ProviderInstanceId) }),
    responses: { 200: Paginated(FunctionInstance), ...requestErrors },
  }, async ({ query, services, log }) => functions.listFunctionInstances(services.db, log, query, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'get', path: '/api/bridge/v1/function-instances/openapi.json', operationId: 'function-instances-openapi', tag, scope: 'bridge:read',
    summary: 'An OpenAPI 3.1 document with one invoke operation per enabled function instance',
    responses: { 200: FreeObject, 401: ErrorBody, 403: ErrorBody },
  }, async ({ services, log }) => functionInstancesOpenApi(services.db, services.cfg.PUBLIC_URL, log)),
];

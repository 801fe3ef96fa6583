import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { ErrorBody, kmsErrors, PageQuery, Paginated, requestErrors, resourceErrors, Success } from '../../domain/shapes/common.ts';
import { CreateSecretRequest, DecryptedSecret, ImportSecretRequest, Secret, SecretIdParams, SecretKeyParams, UpdateSecretRequest } from '../../domain/shapes/secret.ts';
import * as secrets from '../../domain/secrets.ts';

const tag = 'secret';

// Fixed paths (/import, /list-decrypted, /key/...) are registered before /:secret_id.
export const secretRoutes = [
  defineRoute({
    method: 'post', path: '/api/secret/v1', operationId: 'create-secret', tag, scope: 'secret:write',
    summary: 'Store a secret, encrypted with the DEK its alias names (default alias: default)',
    body: CreateSecretRequest,
    responses: { 201: Secret, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ body, services }) => secrets.createSecret(services, body)),

  defineRoute({
    method: 'post', path: '/api/secret/v1/import', operationId: 'import-secret', tag, scope: 'secret:write',
    summary: 'Store a value already encrypted with the DEK the alias names; it must decrypt',
    body: ImportSecretRequest,
    responses: { 201: Secret, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ body, services }) => secrets.importSecret(services, body)),

  defineRoute({
    method: 'get', path: '/api/secret/v1', operationId: 'list-secrets', tag, scope: 'secret:read',
    summary: 'List secrets, newest first, with encrypted values only',
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(Secret, 'secrets'), ...requestErrors },
  }, async ({ query, services }) => secrets.listSecrets(services.db, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'get', path: '/api/secret/v1/list-decrypted', operationId: 'list-decrypted-secrets', tag, scope: 'secret:decrypt',
    summary: 'List secrets, newest first, with their decrypted values (decrypt_error instead for one that cannot be opened)',
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(DecryptedSecret, 'secrets'), ...requestErrors, ...kmsErrors },
  }, async ({ query, services, log }) => secrets.listDecryptedSecrets({ ...services, log }, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'get', path: '/api/secret/v1/key/:key', operationId: 'get-secret-by-key', tag, scope: 'secret:read',
    summary: 'Get a secret by its key name (a "/" in the key is sent as %2F)',
    params: SecretKeyParams,
    responses: { 200: Secret, ...resourceErrors },
  }, async ({ params, services }) => secrets.getSecretByKey(services.db, params.key)),

  defineRoute({
    method: 'get', path: '/api/secret/v1/:secret_id', operationId: 'get-secret', tag, scope: 'secret:read',
    summary: 'Get a secret by id',
    params: SecretIdParams,
    responses: { 200: Secret, ...resourceErrors },
  }, async ({ params, services }) => secrets.getSecret(services.db, params.secret_id)),

  defineRoute({
    method: 'put', path: '/api/secret/v1/:secret_id', operationId: 'update-secret', tag, scope: 'secret:write',
    summary: 'Replace a secret\'s value, re-encrypted under the given alias or its current one',
    params: SecretIdParams, body: UpdateSecretRequest,
    // 409: the secret kept moving between aliases (rotations) while it was written.
    responses: { 200: Secret, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ params, body, services }) => secrets.updateSecret(services, params.secret_id, body)),

  defineRoute({
    method: 'delete', path: '/api/secret/v1/:secret_id', operationId: 'delete-secret', tag, scope: 'secret:write',
    summary: 'Delete a secret',
    params: SecretIdParams,
    responses: { 200: Success, ...resourceErrors },
  }, async ({ params, services }) => {
    await secrets.deleteSecret(services.db, params.secret_id);
    return { success: true };
  }),
];

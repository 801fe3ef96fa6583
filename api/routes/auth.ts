import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { ErrorBody, PageQuery, Paginated, requestErrors, Success, Uuid } from '../../domain/shapes/common.ts';
import { ApiKey, CreateApiKeyRequest, CreatedApiKey } from '../../domain/shapes/auth.ts';
import { createApiKey, revokeApiKey } from '../../domain/api-keys.ts';
import { listActive } from '../../db/api-keys.ts';
import { forgetApiKey } from '../middleware/auth.ts';

const tag = 'auth';

export const authRoutes = [
  defineRoute({
    method: 'post', path: '/api/auth/v1/api-key', operationId: 'create-api-key', tag, scope: 'admin',
    summary: 'Create an API key; the key is returned only in this response',
    body: CreateApiKeyRequest,
    responses: { 201: CreatedApiKey, ...requestErrors },
  }, async ({ body, services }) => createApiKey(services.db, body.name, body.scopes)),

  defineRoute({
    method: 'get', path: '/api/auth/v1/api-key', operationId: 'list-api-keys', tag, scope: 'admin',
    summary: 'List active API keys, newest first (never the keys themselves)',
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(ApiKey), ...requestErrors },
  }, async ({ query, services }) => listActive(services.db, query.page_size!, query.next_page_token)),

  defineRoute({
    method: 'delete', path: '/api/auth/v1/api-key/:id', operationId: 'revoke-api-key', tag, scope: 'admin',
    summary: 'Revoke an API key',
    params: Type.Object({ id: Uuid }),
    responses: { 200: Success, ...requestErrors, 404: ErrorBody },
  }, async ({ params, services }) => {
    await revokeApiKey(services.db, params.id);
    forgetApiKey(params.id);
    return { success: true };
  }),
];

import { defineRoute } from '../route.ts';
import { ErrorBody } from '../../domain/shapes/common.ts';
import { Definition } from '../../domain/shapes/definition.ts';
import { exportDefinition } from '../../domain/definition.ts';

export const a2aDefinitionRoutes = [
  defineRoute({
    method: 'get', path: '/api/a2a/v1/definition', operationId: 'a2a-definition', tag: 'a2a', scope: 'a2a',
    summary: 'Export the declarative configuration: agent card, envelope keys with wrapped DEKs by alias, encrypted secrets, providers',
    responses: { 200: Definition, 401: ErrorBody, 403: ErrorBody },
  }, async ({ services, log }) => exportDefinition(services.db, services.cfg, log)),
];

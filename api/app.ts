import Koa from 'koa';
import Router from '@koa/router';
import type { Services } from '../domain/services.ts';
import { errorHandler } from './middleware/errors.ts';
import { requestId } from './middleware/request-id.ts';
import { mount, type Route } from './route.ts';
import { buildOpenApi } from './openapi.ts';
import { taskRoutes } from './routes/task.ts';
import { authRoutes } from './routes/auth.ts';
import { internalRoutes } from './routes/internal.ts';
import { encryptionRoutes } from './routes/encryption.ts';
import { secretRoutes } from './routes/secret.ts';
import { rotationRoutes } from './routes/rotation.ts';
import { a2aRoutes } from './routes/a2a.ts';
import { a2aDefinitionRoutes } from './routes/a2a-definition.ts';
import { defineRoute } from './route.ts';
import { ErrorBody, FreeObject } from './schemas/common.ts';
import { Type } from '@sinclair/typebox';
import { createMetrics } from './metrics.ts';
import { queueDashboard } from './queue-dashboard.ts';

export const allRoutes: Route[] = [...internalRoutes, ...authRoutes, ...taskRoutes, ...encryptionRoutes, ...rotationRoutes, ...secretRoutes, ...a2aRoutes, ...a2aDefinitionRoutes];

export function createApp(services: Services): Koa {
  const app = new Koa({ proxy: true });
  const openapi = buildOpenApi(allRoutes, { version: process.env.npm_package_version ?? '0.1.0', serverUrl: services.cfg.PUBLIC_URL });
  const openapiRoute = defineRoute({
    method: 'get', path: '/api/openapi.json', operationId: 'openapi', tag: '_internal', scope: null,
    summary: 'This OpenAPI 3.1 document', responses: { 200: FreeObject },
  }, async () => openapi);
  const metrics = createMetrics(services);
  const metricsRoute = defineRoute({
    method: 'get', path: '/metrics', operationId: 'metrics', tag: '_internal', scope: 'internal',
    summary: 'Prometheus metrics', responses: { 200: Type.String(), 401: ErrorBody, 403: ErrorBody },
  }, async ({ ctx }) => {
    ctx.type = metrics.registry.contentType;
    ctx.body = await metrics.registry.metrics();
  });
  const router = new Router();
  mount(router, [...allRoutes, openapiRoute, metricsRoute], services);
  app.use(requestId(services.log));
  app.use(metrics.middleware);
  app.use(errorHandler());
  app.use(queueDashboard(services));
  app.use(router.routes());
  app.use(router.allowedMethods());
  app.on('error', (err) => services.log.debug({ err: { message: (err as Error).message } }, 'koa error'));
  return app;
}

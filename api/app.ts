import Koa from 'koa';
import Router from '@koa/router';
import type { Services } from '../domain/services.ts';
import { errorHandler } from './middleware/errors.ts';
import { requestId } from './middleware/request-id.ts';
import { accessLog } from './middleware/access-log.ts';
import { fixedPathMethods, mount, slashedParameter, type Route } from './route.ts';
import { buildOpenApi } from './openapi.ts';
import { taskRoutes } from './routes/task.ts';
import { authRoutes } from './routes/auth.ts';
import { internalRoutes } from './routes/internal.ts';
import { encryptionRoutes } from './routes/encryption.ts';
import { secretRoutes } from './routes/secret.ts';
import { rotationRoutes } from './routes/rotation.ts';
import { a2aRoutes } from './routes/a2a.ts';
import { a2aDefinitionRoutes } from './routes/a2a-definition.ts';
import { bridgeRoutes } from './routes/bridge.ts';
import { mcpRoutes } from './routes/mcp.ts';
import { defineRoute } from './route.ts';
import { AnyQuery, FreeObject } from '../domain/shapes/common.ts';
import { metricsMiddleware, metricsRoutes } from './metrics.ts';
import { queueDashboard } from './queue-dashboard.ts';
import { SERVICE_VERSION } from '../domain/version.ts';
import { InvalidRequest } from '../domain/errors.ts';

// The document describes allRoutes, itself included: built on first request, once per process.
const openapiDocs = new WeakMap<Services, Record<string, unknown>>();
const openapiRoute = defineRoute({
  method: 'get', path: '/api/openapi.json', operationId: 'openapi', tag: '_internal', scope: null,
  summary: 'This OpenAPI 3.1 document', query: AnyQuery, responses: { 200: FreeObject },
}, async ({ services }) => {
  let doc = openapiDocs.get(services);
  if (!doc) openapiDocs.set(services, (doc = buildOpenApi(allRoutes, { version: SERVICE_VERSION, serverUrl: services.cfg.PUBLIC_URL })));
  return doc;
});

export const allRoutes: Route[] = [
  ...internalRoutes, ...metricsRoutes, openapiRoute, ...authRoutes, ...taskRoutes, ...encryptionRoutes, ...rotationRoutes,
  ...secretRoutes, ...bridgeRoutes, ...mcpRoutes, ...a2aRoutes, ...a2aDefinitionRoutes,
];

// HTTP/1.1 requires a Host header (RFC 9112 section 3.2); api/main.ts turns Node's bodiless check off for this one.
const requireHost: Koa.Middleware = async (ctx, next) => {
  if (ctx.req.httpVersion === '1.1' && ctx.req.headers.host === undefined) {
    throw new InvalidRequest('An HTTP/1.1 request must carry a Host header', [{ path: 'header.host', message: 'is required' }]);
  }
  await next();
};

// An absolute-form request target Node's parser passes but that is no URL (`POST http://[::1/x`):
// Koa's ctx.path throws wherever it is read, and every route answered a bare 500.
const requireReadableTarget: Koa.Middleware = async (ctx, next) => {
  try {
    void ctx.path;
  } catch {
    throw new InvalidRequest('The request target is not a valid URL (send a path, /api/...)', [{ path: 'target', message: 'is not a valid URL' }]);
  }
  await next();
};

export function createApp(services: Services): Koa {
  // Behind N proxies the client's address is the Nth entry of X-Forwarded-For from the right: those
  // before it are the client's own, whatever it chose to send.
  const app = new Koa({ proxy: services.cfg.TRUST_PROXY > 0, maxIpsCount: services.cfg.TRUST_PROXY });
  // Paths match as SPEC writes them (lower case), as fixedPathMethods matches them: a router matching
  // without case took '/API/SECRET/V1/IMPORT' as a secret id, 'provider/Grouped-By-Function' as the
  // grouped list rather than that instance, and answered fixed paths past fixedPathMethods' 405s.
  const router = new Router({ sensitive: true });
  mount(router, allRoutes, services);
  app.use(requestId(services.log));
  app.use(accessLog());
  app.use(metricsMiddleware(services));
  app.use(errorHandler(slashedParameter(allRoutes)));
  app.use(requireHost);
  app.use(requireReadableTarget);
  app.use(queueDashboard(services));
  app.use(fixedPathMethods(allRoutes));
  app.use(router.routes());
  app.use(router.allowedMethods());
  app.on('error', (err) => services.log.debug({ err: { message: (err as Error).message } }, 'koa error'));
  return app;
}

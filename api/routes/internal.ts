import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { AnyQuery, ErrorBody, FreeObject, NoInput } from '../../domain/shapes/common.ts';
import { publicConfig } from '../../domain/config.ts';
import { QUEUE_NAMES, oldestWaitingAgeMs, queueConcurrency, queueJobCounts } from '../../queues/names.ts';
import { SERVICE_VERSION } from '../../domain/version.ts';
import { generateBridgeClient } from '../../domain/bridge/codegen.ts';
import { checkReadiness } from '../../domain/readiness.ts';

const tag = '_internal';

export const internalRoutes = [
  defineRoute({
    method: 'get', path: '/_internal/v1/health', operationId: 'health', tag, scope: null,
    summary: 'Liveness: 200 while the process runs',
    query: AnyQuery,
    responses: { 200: Type.Object({ status: Type.Literal('ok') }) },
  }, async () => ({ status: 'ok' as const })),

  defineRoute({
    method: 'get', path: '/_internal/v1/ready', operationId: 'ready', tag, scope: null,
    summary: 'Readiness: 200 when Postgres and Redis answer and this process can read its local envelope key files, else 503 naming what failed (or that it is shutting down)',
    query: AnyQuery,
    responses: { 200: Type.Object({ status: Type.Literal('ready'), checks: FreeObject }), 503: ErrorBody },
  }, async ({ services }) => checkReadiness(services)),

  defineRoute({
    method: 'get', path: '/_internal/v1/runtime_config', operationId: 'runtime-config', tag, scope: 'internal',
    summary: 'The effective configuration, without secrets',
    responses: { 200: FreeObject, 401: ErrorBody, 403: ErrorBody },
  }, async ({ services }) => ({
    version: SERVICE_VERSION,
    queues: Object.entries(queueConcurrency(services.cfg)).map(([name, concurrency]) => ({ name, concurrency })),
    config: publicConfig(services.cfg),
  })),

  defineRoute({
    method: 'get', path: '/_internal/v1/queues', operationId: 'queue-stats', tag, scope: 'internal',
    summary: 'Per queue: job counts and the age of the oldest waiting job',
    responses: { 200: FreeObject, 401: ErrorBody, 403: ErrorBody },
  }, async ({ services }) => {
    const out: Record<string, unknown> = {};
    for (const name of QUEUE_NAMES) {
      const q = services.queues[name];
      const counts = await queueJobCounts(q, services.redis);
      out[name] = { ...counts, oldest_waiting_age_ms: await oldestWaitingAgeMs(q) };
    }
    return { queues: out };
  }),

  defineRoute({
    method: 'post', path: '/_internal/v1/trigger_codegen', operationId: 'trigger-codegen', tag, scope: 'internal', readOnly: true,
    summary: 'Generate a typed TypeScript client for the enabled bridge function instances (files returned, not written)',
    body: NoInput,
    responses: {
      200: Type.Object({ message: Type.String(), files: Type.Array(Type.Object({ path: Type.String(), content: Type.String() })) }),
      401: ErrorBody, 403: ErrorBody,
    },
  }, async ({ services, log }) => generateBridgeClient(services.db, log)),
];

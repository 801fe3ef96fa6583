// Prometheus metrics of an API process: HTTP latency by route and status, plus queue depths, the
// outbox backlog, key job progress and provider instances by status read at scrape time (they are shared state, the same from any process),
// and what the workers record in Redis (queues/worker-metrics.ts): job durations and outcomes, enqueue lag, credential refreshes.
import type { Middleware } from 'koa';
import { Type } from '@sinclair/typebox';
import { defineRoute } from './route.ts';
import { ErrorBody } from './schemas/common.ts';
import { Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Services } from '../domain/services.ts';
import { QUEUE_NAMES } from '../queues/names.ts';
import { listActiveKeyJobs } from '../db/key-jobs.ts';
import { countProviderInstancesByStatus } from '../db/bridge.ts';
import { registerWorkerMetrics } from '../queues/worker-metrics.ts';

function createMetrics(services: Services) {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const http = new Histogram({
    name: 'taskbridge_http_request_duration_seconds',
    help: 'HTTP request latency by route and status',
    labelNames: ['method', 'route', 'status'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
    registers: [registry],
  });
  new Gauge({
    name: 'taskbridge_queue_jobs',
    help: 'BullMQ jobs per queue and state',
    labelNames: ['queue', 'state'],
    registers: [registry],
    async collect() {
      for (const name of QUEUE_NAMES) {
        const counts = await services.queues[name].getJobCounts('waiting', 'active', 'delayed', 'completed', 'failed');
        for (const [state, n] of Object.entries(counts)) this.set({ queue: name, state }, n);
      }
    },
  });
  new Gauge({
    name: 'taskbridge_outbox_pending',
    help: 'Jobs committed to the outbox and not yet handed to Redis',
    registers: [registry],
    async collect() {
      const [{ n }] = await services.db('outbox').count({ n: '*' });
      this.set(Number(n));
    },
  });

  new Gauge({
    name: 'taskbridge_key_job_items',
    help: 'Items of key jobs under way (DEK migrations, alias rotations): total, done and failed',
    labelNames: ['job_id', 'kind', 'count'],
    registers: [registry],
    async collect() {
      this.reset();
      for (const j of await listActiveKeyJobs(services.db)) {
        for (const count of ['total', 'done', 'failed'] as const) this.set({ job_id: j.id, kind: j.kind, count }, j[count]);
      }
    },
  });

  new Gauge({
    name: 'taskbridge_provider_instances',
    help: 'Bridge provider instances by status (refresh_failed: a credential refresh gave up; needs brokering again)',
    labelNames: ['status'],
    registers: [registry],
    async collect() {
      const rows = await countProviderInstancesByStatus(services.db);
      for (const status of ['brokering_initiated', 'active', 'disabled', 'refresh_failed']) this.set({ status }, rows[status] ?? 0);
    },
  });

  registerWorkerMetrics(registry, services.redis, services.cfg.QUEUE_PREFIX);

  const middleware: Middleware = async (ctx, next) => {
    const end = http.startTimer();
    try {
      await next();
    } finally {
      end({ method: ctx.method, route: (ctx as { _matchedRoute?: string })._matchedRoute ?? 'unmatched', status: String(ctx.status) });
    }
  };
  return { registry, middleware };
}

// One registry per process (per Services), shared by the middleware and the route.
const registries = new WeakMap<Services, ReturnType<typeof createMetrics>>();
function metricsOf(services: Services) {
  let m = registries.get(services);
  if (!m) registries.set(services, (m = createMetrics(services)));
  return m;
}

export const metricsMiddleware = (services: Services): Middleware => metricsOf(services).middleware;

export const metricsRoutes = [
  defineRoute({
    method: 'get', path: '/metrics', operationId: 'metrics', tag: '_internal', scope: 'internal',
    summary: 'Prometheus metrics', responseType: 'text/plain', responses: { 200: Type.String(), 401: ErrorBody, 403: ErrorBody },
  }, async ({ ctx, services }) => {
    const { registry } = metricsOf(services);
    ctx.type = registry.contentType;
    ctx.body = await registry.metrics();
  }),
];

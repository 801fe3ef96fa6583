// Prometheus metrics of an API process: HTTP latency by route and status, plus queue depths, the
// outbox backlog, key job progress and provider instances by status read at scrape time (they are shared state, the same from any process),
// and what the workers record in Redis (queues/worker-metrics.ts): job durations and outcomes, enqueue lag, credential refreshes.
// A metric whose source (Postgres or Redis) is down or silent is left out of that scrape, and the
// rest is still answered: HTTP latency and the outbox backlog are what an operator watches in an outage.
import type { Middleware } from 'koa';
import { Type } from '@sinclair/typebox';
import { defineRoute } from './route.ts';
import { AnyQuery, ErrorBody } from '../domain/shapes/common.ts';
import { Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Queue } from 'bullmq';
import type { Services } from '../domain/services.ts';
import { PROVIDER_STATUSES } from '../domain/bridge/types.ts';
import { QUEUE_NAMES, oldestWaitingAgeMs, queueJobCounts, queueWorkerCount } from '../queues/names.ts';
import { streamCounts } from './a2a-stream-quota.ts';
import { listActiveKeyJobs } from '../db/key-jobs.ts';
import { countProviderInstancesByStatus } from '../db/bridge.ts';
import { countOutbox, oldestOutboxAgeSeconds } from '../db/outbox.ts';
import { registerWorkerMetrics } from '../queues/worker-metrics.ts';
import { withTimeout } from '../domain/with-timeout.ts';
import { throttledWarn } from '../domain/throttled-warn.ts';
import { matchedRoute, statusSent } from './middleware/access-log.ts';

const SOURCE_TIMEOUT_MS = 2000;

type Source = 'postgres' | 'redis';

// What `read` gives for a scrape, or undefined (logged) when its source cannot answer in time.
// Logged at warn once a minute at most per source (throttledWarn): an outage left out all of a
// source's metrics (8 of Redis) at every scrape, a warn line each.
function sourceReader(services: Services) {
  const msg = 'metric left out of the scrape: its source did not answer';
  const warn = { postgres: throttledWarn(services.log, msg), redis: throttledWarn(services.log, msg) };
  return async <T>(service: Source, metric: string, read: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await withTimeout(read(), SOURCE_TIMEOUT_MS);
    } catch (err) {
      warn[service]({ metric, service, reason: (err as Error).message });
      return undefined;
    }
  };
}

function createMetrics(services: Services) {
  const readSource = sourceReader(services);
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
      this.reset();
      const all = await readSource('redis', 'taskbridge_queue_jobs', () =>
        Promise.all(QUEUE_NAMES.map(async (name) => [name, await queueJobCounts(services.queues[name], services.redis)] as const)));
      for (const [name, counts] of all ?? []) for (const [state, n] of Object.entries(counts)) this.set({ queue: name, state }, n);
    },
  });
  // One value per queue, read from Redis at scrape time (absent while Redis cannot answer).
  const queueGauge = (name: string, help: string, read: (queue: Queue) => Promise<number>) => new Gauge({
    name, help, labelNames: ['queue'], registers: [registry],
    async collect() {
      this.reset();
      const all = await readSource('redis', name, () => Promise.all(QUEUE_NAMES.map(async (q) => [q, await read(services.queues[q])] as const)));
      for (const [queue, n] of all ?? []) this.set({ queue }, n);
    },
  });
  queueGauge('taskbridge_queue_paused', 'Whether a queue is paused (1: workers take none of its jobs; resume it from the queue dashboard)',
    async (q) => ((await q.isPaused()) ? 1 : 0));
  queueGauge('taskbridge_queue_oldest_waiting_seconds', 'Age of the oldest job waiting per queue (0: none waits); grows when workers fall behind or are gone',
    async (q) => ((await oldestWaitingAgeMs(q)) ?? 0) / 1000);
  queueGauge('taskbridge_queue_workers', 'Worker connections taking jobs per queue (each worker process holds one per queue; 0: none runs)',
    (q) => queueWorkerCount(q, services.redis.options.db ?? 0));
  // One value read from Postgres at scrape time; absent (not 0) while it cannot answer, so that an
  // unknown backlog is not read as none.
  const sourcedGauge = (name: string, help: string, read: () => Promise<number>) => new Gauge({
    name, help, registers: [registry],
    async collect() {
      const n = await readSource('postgres', name, read);
      if (n !== undefined) this.set(n);
      else this.remove();
    },
  });
  sourcedGauge('taskbridge_outbox_pending', 'Jobs committed to the outbox and not yet handed to Redis', () => countOutbox(services.db));
  sourcedGauge('taskbridge_outbox_oldest_seconds', 'Age of the oldest job in the outbox (0: none); grows while Redis is down or the relay is stuck',
    () => oldestOutboxAgeSeconds(services.db));

  new Gauge({
    name: 'taskbridge_key_job_items',
    help: 'Items of key jobs under way (DEK migrations, alias rotations): total, done and failed',
    labelNames: ['job_id', 'kind', 'count'],
    registers: [registry],
    async collect() {
      this.reset();
      for (const j of await readSource('postgres', 'taskbridge_key_job_items', () => listActiveKeyJobs(services.db)) ?? []) {
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
      this.reset();
      const rows = await readSource('postgres', 'taskbridge_provider_instances', () => countProviderInstancesByStatus(services.db));
      if (!rows) return;
      for (const status of PROVIDER_STATUSES) this.set({ status }, rows[status] ?? 0);
    },
  });

  // This process's Postgres pool (tarn, through knex): requests wait for a connection when all are used.
  const pool = () => (services.db.client as { pool?: { numUsed(): number; numFree(): number; numPendingAcquires(): number; max: number } }).pool;
  new Gauge({
    name: 'taskbridge_db_pool_connections',
    help: "Connections of this process's Postgres pool: used (in a statement or transaction), free, and max (the pool's size)",
    labelNames: ['state'],
    registers: [registry],
    collect() {
      const p = pool();
      if (!p) return;
      this.set({ state: 'used' }, p.numUsed());
      this.set({ state: 'free' }, p.numFree());
      this.set({ state: 'max' }, p.max);
    },
  });
  new Gauge({
    name: 'taskbridge_db_pool_waiting',
    help: "Requests of this process waiting for a connection of its Postgres pool (above 0: the pool is exhausted)",
    registers: [registry],
    collect() {
      const p = pool();
      if (p) this.set(p.numPendingAcquires());
    },
  });
  new Gauge({
    name: 'taskbridge_a2a_streams_open',
    help: 'A2A streams (message/stream, tasks/resubscribe) open on this process',
    registers: [registry],
    collect() { this.set(streamCounts().open); },
  });
  new Gauge({
    name: 'taskbridge_a2a_streams_per_key_max',
    help: 'The most A2A streams any one API key holds open on this process (refused with 429 at A2A_STREAMS_PER_KEY)',
    registers: [registry],
    collect() { this.set(streamCounts().mostPerKey); },
  });

  registerWorkerMetrics(registry, services.redis, services.cfg.QUEUE_PREFIX, (name, read) => readSource('redis', name, read));

  const middleware: Middleware = async (ctx, next) => {
    const end = http.startTimer();
    try {
      await next();
    } finally {
      end({ method: ctx.method, route: matchedRoute(ctx), status: String(statusSent(ctx)) });
    }
  };
  return { registry, middleware, http };
}

// One registry per process (per Services), shared by the middleware and the route.
const registries = new WeakMap<Services, ReturnType<typeof createMetrics>>();
function metricsOf(services: Services) {
  let m = registries.get(services);
  if (!m) registries.set(services, (m = createMetrics(services)));
  return m;
}

export const metricsMiddleware = (services: Services): Middleware => metricsOf(services).middleware;

// An answer written on the socket by api/client-errors.ts, for a request that never reached Koa: the
// labels are bounded there (a fixed route, a method Node's parser knows or a fixed one), never the path.
export type HttpAnswer = { method: string; route: string; status: number; seconds: number };
export const countHttpAnswer = (services: Services) => ({ method, route, status, seconds }: HttpAnswer): void =>
  metricsOf(services).http.observe({ method, route, status: String(status) }, seconds);

export const metricsRoutes = [
  defineRoute({
    method: 'get', path: '/metrics', operationId: 'metrics', tag: '_internal', scope: 'internal',
    summary: 'Prometheus metrics', query: AnyQuery, responseType: 'text/plain', responses: { 200: Type.String(), 401: ErrorBody, 403: ErrorBody },
  }, async ({ ctx, services }) => {
    const { registry } = metricsOf(services);
    ctx.type = registry.contentType;
    ctx.body = await registry.metrics();
  }),
];

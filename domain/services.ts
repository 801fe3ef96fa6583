// The composition root shared by the API and worker processes: every handle a domain function
// may need, created once per process from the validated config.
import type { Knex } from 'knex';
import type { Redis } from 'ioredis';
import type { Config } from './config.ts';
import { createLogger, type Logger } from './logger.ts';
import { createDb } from '../db/knex.ts';
import { createTaskStatements, type TaskStatements } from '../db/tasks.ts';
import { createRedis } from '../queues/connection.ts';
import { EventBus } from '../queues/events.ts';
import { createQueues, OutboxRelay, type Queues } from '../queues/outbox-relay.ts';
import { FleetCounts } from '../queues/fleet-counts.ts';
import { StreamPlaces } from '../queues/stream-places.ts';
import { createReadinessDb } from './readiness.ts';

export interface Services {
  cfg: Config;
  log: Logger;
  db: Knex;
  /** GET /_internal/v1/ready's own connection to Postgres (none until the first probe). */
  readinessDb: Knex;
  redis: Redis;
  queues: Queues;
  outbox: OutboxRelay;
  bus: EventBus;
  /** Task intake, the agent runtime's status changes and run states: concurrent calls share statements. */
  taskStatements: TaskStatements;
  /** Request limits counted across the API processes (syncs only once a limit uses it). */
  fleetCounts: FleetCounts;
  /** A2A stream places per API key, counted across the API processes (A2A_STREAMS_PER_KEY). */
  streamPlaces: StreamPlaces;
  /** Set by the API process on SIGTERM: its readiness answers 503 from then on. */
  stopping: boolean;
  close(): Promise<void>;
}

export function createServices(cfg: Config, role: 'api' | 'worker' | 'cli', log: Logger = createLogger(cfg.LOG_LEVEL, role, { buffered: role !== 'cli' })): Services {
  const db = createDb(cfg.DATABASE_URL, { min: 0, max: role === 'cli' ? 2 : 20 }, { queryTimeoutMs: cfg.DB_QUERY_TIMEOUT_MS, log });
  const readinessDb = createReadinessDb(cfg, log);
  const redis = createRedis(cfg.REDIS_URL, 'producer', cfg.DB_QUERY_TIMEOUT_MS);
  const sub = createRedis(cfg.REDIS_URL, 'subscriber');
  for (const r of [redis, sub]) r.on('error', (err) => log.debug({ err: { message: err.message } }, 'redis connection error'));
  const queues = createQueues(cfg, redis);
  for (const q of Object.values(queues)) q.on('error', (err) => log.debug({ err: { message: err.message } }, 'queue error'));
  const outbox = new OutboxRelay(db, queues, log, cfg.OUTBOX_SWEEP_MS);
  const bus = new EventBus(redis, sub, cfg.QUEUE_PREFIX, log);
  const fleetCounts = new FleetCounts(redis, cfg.QUEUE_PREFIX, log);
  const streamPlaces = new StreamPlaces(redis, cfg.QUEUE_PREFIX, cfg.A2A_STREAM_LEASE_MS, log);
  return {
    cfg, log, db, readinessDb, redis, queues, outbox, bus, fleetCounts, streamPlaces, stopping: false,
    taskStatements: createTaskStatements(db),
    async close() {
      outbox.stop();
      fleetCounts.stop();
      await streamPlaces.stop();
      await Promise.allSettled(Object.values(queues).map((q) => q.close()));
      redis.disconnect();
      sub.disconnect();
      await Promise.all([db.destroy(), readinessDb.destroy()]);
    },
  };
}

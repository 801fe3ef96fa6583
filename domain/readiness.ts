// Whether this process can serve (GET /_internal/v1/ready): Postgres and Redis answer, and it can
// read its local envelope key files. Not one of those readable means this host lacks KEYS_DIR (a
// deploy mistake), and it alone is kept out of rotation; some missing is reported but stays ready:
// a lost file is the same on every host, and tasks and A2A do not need it.
// Postgres is asked on a connection of its own (readinessDb), not one of the request pool's: with
// that pool taken by requests, a probe waiting its turn would read a busy instance as Postgres
// down, and a load balancer would pull it out of rotation and overload the rest.
import type { Knex } from 'knex';
import type { Services } from './services.ts';
import type { Config } from './config.ts';
import { createDb, type DbLog } from '../db/knex.ts';
import { NotReady } from './errors.ts';
import { localKeyFilesHealth } from './keyring.ts';
import { withTimeout } from './with-timeout.ts';

export const PROBE_TIMEOUT_MS = 2000;

/** The readiness probe's pool of one connection: made at the first probe; one that failed is replaced at the next. */
export function createReadinessDb(cfg: Pick<Config, 'DATABASE_URL'>, log: DbLog): Knex {
  return createDb(cfg.DATABASE_URL, { min: 0, max: 1 }, {
    queryTimeoutMs: PROBE_TIMEOUT_MS, connectTimeoutMs: PROBE_TIMEOUT_MS, acquireTimeoutMs: PROBE_TIMEOUT_MS,
    applicationName: 'taskbridge ready', log,
  });
}

export interface Readiness { status: 'ready'; checks: { postgres: 'ok'; redis: 'ok'; keys: string } }

// Probes share a check: those that come while one runs get its outcome, and so do those in the
// REUSE_MS after it ended. A check each, queued on the one connection, ran past PROBE_TIMEOUT_MS
// once load balancers and keep-alive clients probed by the hundred, and every instance answered 503.
const REUSE_MS = 1000;
const lastChecks = new WeakMap<Knex, { outcome: Promise<Readiness>; endedAt?: number }>();

/** The checks when ready; else throws NotReady (a 503) naming what failed (`data.failed`). Shutting down is told at once, never a check's outcome. */
export async function checkReadiness(s: Pick<Services, 'readinessDb' | 'redis' | 'cfg' | 'stopping'>): Promise<Readiness> {
  if (s.stopping) throw new NotReady('Not ready: shutting down', { failed: ['stopping'] });
  const last = lastChecks.get(s.readinessDb);
  if (last && (last.endedAt === undefined || Date.now() - last.endedAt < REUSE_MS)) return last.outcome;
  const check = { outcome: runChecks(s), endedAt: undefined as number | undefined };
  const ended = () => { check.endedAt = Date.now(); };
  check.outcome.then(ended, ended);
  lastChecks.set(s.readinessDb, check);
  return check.outcome;
}

/** Whether Postgres answers `select 1` now, within PROBE_TIMEOUT_MS, on the readiness connection. */
export function postgresAnswers(s: Pick<Services, 'readinessDb'>): Promise<boolean> {
  return withTimeout(s.readinessDb.raw('select 1'), PROBE_TIMEOUT_MS).then(() => true, () => false);
}

async function runChecks(s: Pick<Services, 'readinessDb' | 'redis' | 'cfg'>): Promise<Readiness> {
  const [pg, redis, keys] = await Promise.allSettled([
    withTimeout(s.readinessDb.raw('select 1'), PROBE_TIMEOUT_MS),
    withTimeout(s.redis.ping(), PROBE_TIMEOUT_MS),
    withTimeout(localKeyFilesHealth({ db: s.readinessDb, cfg: s.cfg }), PROBE_TIMEOUT_MS),
  ]);
  const unreachable = [...(pg.status === 'rejected' ? ['postgres'] : []), ...(redis.status === 'rejected' ? ['redis'] : [])];
  const files = keys.status === 'fulfilled' ? keys.value : undefined;
  const noKeys = files !== undefined && files.total > 0 && files.unreadable === files.total;
  if (unreachable.length || noKeys) {
    const why = [...(unreachable.length ? [`${unreachable.join(' and ')} unreachable`] : []), ...(noKeys ? ['no local envelope key file in KEYS_DIR can be read'] : [])];
    throw new NotReady(`Not ready: ${why.join('; ')}`, { failed: [...unreachable, ...(noKeys ? ['keys'] : [])] });
  }
  const keyCheck = !files ? 'unknown' : files.unreadable ? `${files.unreadable} of ${files.total} local envelope key files unreadable` : 'ok';
  return { status: 'ready', checks: { postgres: 'ok', redis: 'ok', keys: keyCheck } };
}

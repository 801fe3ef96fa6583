// Start-up of the api and worker processes: they wait for Postgres and Redis, then for the schema to
// have this release's migrations (a process started before the release step would fail its
// statements on missing columns), saying so every few seconds with the address and the variable that
// names it, and give up after STARTUP_TIMEOUT_MS (0: never) with one line saying why, instead of a
// silent hang (Redis) or a stack trace (Postgres). A Redis database Redis does not have, or a login
// Postgres or Redis refuses (a wrong password, a database it does not have), is a bad configuration,
// which no wait mends: a ConfigError. Once up, they say if Postgres applies another statement_timeout
// than DB_QUERY_TIMEOUT_MS (a pooler dropping the startup parameter).
import { setTimeout as sleep } from 'node:timers/promises';
import { ReplyError } from 'ioredis';
import type { Services } from './services.ts';
import { withTimeout } from './with-timeout.ts';
import { redactUrl } from './logger.ts';
import { ConfigError } from './config.ts';
import { migrationState, statementTimeoutMs } from '../db/knex.ts';
import { loginRefused, redisLoginRefused } from './errors.ts';

const PROBE_TIMEOUT_MS = 2000;
const WARN_EVERY_MS = 5000;

export async function waitForBackingServices(s: Pick<Services, 'cfg' | 'db' | 'redis' | 'log'>): Promise<void> {
  const started = Date.now();
  const limit = s.cfg.STARTUP_TIMEOUT_MS;
  // The producer connection refuses commands until it is ready (it does not queue them), and says
  // why it is not in 'error' events.
  let redisError: Error | undefined;
  const onRedisError = (err: Error) => { redisError = err; };
  s.redis.on('error', onRedisError);
  const redisReady = async () => {
    if (s.redis.status !== 'ready') throw redisLoginRefusal(redisError) ?? redisError ?? new Error(`connection ${s.redis.status}`);
    await s.redis.ping().catch((err: unknown) => { throw redisLoginRefusal(err) ?? err; });
    // ioredis selects REDIS_URL's database on connecting, yet becomes ready when Redis refuses it (an
    // index past its `databases`, cluster mode) and works in database 0: selected again here, a refusal ends the start.
    const db = s.redis.options.db ?? 0;
    if (db) {
      await s.redis.select(db).catch((err: unknown) => {
        throw err instanceof ReplyError ? new ConfigError([['REDIS_URL', `Redis refuses database ${db}: ${(err as Error).message}`]]) : err;
      });
    }
  };
  // A login the server refuses, as the setting naming it (its password masked) and the server's reason.
  const refusedLogin = (name: 'DATABASE_URL' | 'REDIS_URL', server: string, err: unknown) =>
    new ConfigError([[name, `${server} at ${redactUrl(s.cfg[name])} refuses this login: ${(err as Error).message}`]]);
  const redisLoginRefusal = (err: unknown) => (redisLoginRefused(err) ? refusedLogin('REDIS_URL', 'Redis', err) : undefined);
  const postgresReady = () => s.db.raw('select 1').catch((err: unknown) => {
    throw loginRefused(err) ? refusedLogin('DATABASE_URL', 'Postgres', err) : err;
  });
  const schemaCurrent = async () => {
    const missing = (await migrationState(s.db)).unapplied;
    if (missing.length) throw new Error(`migrations not applied: ${missing.join(', ')} (the release step, npm run migrate, applies them)`);
  };
  const services = [
    { name: 'Postgres', variable: 'DATABASE_URL', url: s.cfg.DATABASE_URL, probe: postgresReady, unready: 'unreachable', ready: 'reached' },
    { name: 'Redis', variable: 'REDIS_URL', url: s.cfg.REDIS_URL, probe: redisReady, unready: 'unreachable', ready: 'reached' },
    { name: 'the schema', variable: 'DATABASE_URL', url: s.cfg.DATABASE_URL, probe: schemaCurrent, unready: 'behind this release', ready: 'up to date' },
  ];
  try {
    for (const { name, variable, url, probe, unready, ready } of services) {
      // A connection being made is not worth a warning: the first comes after WARN_EVERY_MS.
      let warnedAt = Date.now();
      let warned = false;
      for (;;) {
        try {
          await withTimeout(probe(), PROBE_TIMEOUT_MS);
          if (warned) s.log.info({ service: name }, `${name} ${ready}`);
          break;
        } catch (err) {
          if (err instanceof ConfigError) throw err;
          const why = (err as Error).message;
          const where = { service: name, variable, url: redactUrl(url), reason: why };
          if (limit && Date.now() - started >= limit) {
            s.log.fatal(where, `${name} ${unready} at ${where.url} (${variable}) for ${limit} ms: ${why}; giving up`);
            process.exit(1);
          }
          if (Date.now() - warnedAt >= WARN_EVERY_MS) {
            s.log.warn(where, `waiting for ${name} at ${where.url} (${variable}): ${why}`);
            warnedAt = Date.now();
            warned = true;
          }
          await sleep(250);
        }
      }
    }
  } finally {
    s.redis.off('error', onRedisError);
  }
  await warnOfStatementTimeout(s);
}

// Said once at start, as nothing else shows it: a statement_timeout the connections do not get
// leaves statements running without bound (or cut at another bound) with no error anywhere.
async function warnOfStatementTimeout(s: Pick<Services, 'cfg' | 'db' | 'log'>): Promise<void> {
  // A diagnosis only: Postgres gone again since it was reached does not stop the start here.
  const applied = await withTimeout(statementTimeoutMs(s.db), PROBE_TIMEOUT_MS).catch((err: Error) => {
    s.log.debug({ err: { message: err.message } }, 'could not read the statement_timeout Postgres applies');
    return undefined;
  });
  if (applied === undefined) return;
  const configured = s.cfg.DB_QUERY_TIMEOUT_MS;
  if (applied === configured) return;
  s.log.warn({ statement_timeout_ms: applied, db_query_timeout_ms: configured },
    `Postgres applies statement_timeout ${applied} ms (0: none) to this process's statements, not DB_QUERY_TIMEOUT_MS (${configured} ms): a pooler between (PgBouncer's ignore_startup_parameters) drops it, or the role, the database or DATABASE_URL's options set another; set it on the role too (ALTER ROLE ... SET statement_timeout), see README.md, Deploying`);
}

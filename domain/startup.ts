// Start-up of the api and worker processes: they wait for Postgres and Redis, saying so every few
// seconds with the address and the variable that names it, and give up after STARTUP_TIMEOUT_MS
// with one line saying why, instead of a silent hang (Redis) or a stack trace (Postgres).
import { setTimeout as sleep } from 'node:timers/promises';
import type { Services } from './services.ts';

const PROBE_TIMEOUT_MS = 2000;
const WARN_EVERY_MS = 5000;

export const withTimeout = <T>(p: Promise<T>, ms: number): Promise<T> =>
  Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms).unref())]);

// A service URL as it may be logged: without its password.
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparsable URL)';
  }
}

export async function waitForBackingServices(s: Pick<Services, 'cfg' | 'db' | 'redis' | 'log'>): Promise<void> {
  const deadline = Date.now() + s.cfg.STARTUP_TIMEOUT_MS;
  // The producer connection fails fast while it is down; why it is down comes as 'error' events.
  let redisError: Error | undefined;
  const onRedisError = (err: Error) => { redisError = err; };
  s.redis.on('error', onRedisError);
  const services = [
    { name: 'Postgres', variable: 'DATABASE_URL', url: s.cfg.DATABASE_URL, probe: () => s.db.raw('select 1'), cause: (err: Error) => err },
    { name: 'Redis', variable: 'REDIS_URL', url: s.cfg.REDIS_URL, probe: () => s.redis.ping(), cause: (err: Error) => redisError ?? err },
  ];
  try {
    for (const { name, variable, url, probe, cause } of services) {
      let warnedAt = 0;
      for (;;) {
        try {
          await withTimeout(probe(), PROBE_TIMEOUT_MS);
          if (warnedAt) s.log.info({ service: name }, `${name} reached`);
          break;
        } catch (err) {
          const why = cause(err as Error).message;
          const where = { service: name, variable, url: redactUrl(url), reason: why };
          if (Date.now() >= deadline) {
            s.log.fatal(where, `${name} unreachable at ${where.url} (${variable}) for ${s.cfg.STARTUP_TIMEOUT_MS} ms: ${why}; giving up`);
            process.exit(1);
          }
          if (Date.now() - warnedAt >= WARN_EVERY_MS) {
            s.log.warn(where, `waiting for ${name} at ${where.url} (${variable}): ${why}`);
            warnedAt = Date.now();
          }
          await sleep(250);
        }
      }
    }
  } finally {
    s.redis.off('error', onRedisError);
  }
}

// Whether this process can serve (GET /_internal/v1/ready): Postgres and Redis answer, and it can
// read its local envelope key files. Not one of those readable means this host lacks KEYS_DIR (a
// deploy mistake), and it alone is kept out of rotation; some missing is reported but stays ready:
// a lost file is the same on every host, and tasks and A2A do not need it.
import type { Services } from './services.ts';
import { Unavailable } from './errors.ts';
import { localKeyFilesHealth } from './keyring.ts';
import { withTimeout } from './with-timeout.ts';

const PROBE_TIMEOUT_MS = 2000;

export interface Readiness { status: 'ready'; checks: { postgres: 'ok'; redis: 'ok'; keys: string } }

/** The checks when ready; else throws Unavailable naming what failed (`data.failed`). */
export async function checkReadiness(s: Pick<Services, 'db' | 'redis' | 'cfg'>): Promise<Readiness> {
  const [pg, redis, keys] = await Promise.allSettled([
    withTimeout(s.db.raw('select 1'), PROBE_TIMEOUT_MS),
    withTimeout(s.redis.ping(), PROBE_TIMEOUT_MS),
    withTimeout(localKeyFilesHealth(s), PROBE_TIMEOUT_MS),
  ]);
  const unreachable = [...(pg.status === 'rejected' ? ['postgres'] : []), ...(redis.status === 'rejected' ? ['redis'] : [])];
  const files = keys.status === 'fulfilled' ? keys.value : undefined;
  const noKeys = files !== undefined && files.total > 0 && files.unreadable === files.total;
  if (unreachable.length || noKeys) {
    const why = [...(unreachable.length ? [`${unreachable.join(' and ')} unreachable`] : []), ...(noKeys ? ['no local envelope key file in KEYS_DIR can be read'] : [])];
    throw new Unavailable(`Not ready: ${why.join('; ')}`, { failed: [...unreachable, ...(noKeys ? ['keys'] : [])] });
  }
  const keyCheck = !files ? 'unknown' : files.unreadable ? `${files.unreadable} of ${files.total} local envelope key files unreadable` : 'ok';
  return { status: 'ready', checks: { postgres: 'ok', redis: 'ok', keys: keyCheck } };
}

// First-start work shared by every process kind: idempotent, serialised by an advisory lock so
// several processes starting together do it once.
import fs from 'node:fs';
import path from 'node:path';
import type { Services } from './services.ts';
import { anyKeys } from '../db/api-keys.ts';
import { advisoryXactLock } from '../db/advisory-locks.ts';
import { createApiKey } from './api-keys.ts';
import { BOOTSTRAP_KEY_FILE, bootstrapKeys } from './crypto/key-management.ts';
import { ConfigError } from './config.ts';

const BOOTSTRAP_LOCK = 'taskbridge:bootstrap';

// A directory this process cannot create or write (a read-only or wrongly owned volume, a file in
// the way) is said as the setting to fix, as a bad configuration is, not as the file system's stack.
export async function writingTo<T>(setting: 'DATA_DIR' | 'KEYS_DIR', dir: string, write: () => Promise<T> | T): Promise<T> {
  try {
    return await write();
  } catch (err) {
    const { code, syscall, path: where } = (err ?? {}) as NodeJS.ErrnoException;
    if (typeof code !== 'string' || typeof syscall !== 'string' || typeof where !== 'string' || !where.startsWith(dir)) throw err;
    throw new ConfigError([[setting, `${dir} cannot be used (${code} on ${syscall} of ${where}): it must be a directory this process can create and write`]]);
  }
}

// The envelope key first: a KEYS_DIR that fails then leaves no admin key file behind naming a key
// the rolled-back transaction never stored. (A key file left by a failure after it is adopted next time.)
export async function bootstrap(s: Pick<Services, 'db' | 'cfg' | 'log'>): Promise<void> {
  await s.db.transaction(async (trx) => {
    await advisoryXactLock(trx, BOOTSTRAP_LOCK);
    const keys = await writingTo('KEYS_DIR', s.cfg.KEYS_DIR, () => bootstrapKeys(s, trx));
    // Only on a fresh installation: revoking every key must not mint a new one at the next start.
    if (!s.cfg.ADMIN_API_KEY && !(await anyKeys(trx))) {
      const created = await createApiKey(trx, 'bootstrap admin', ['admin']);
      const file = path.join(s.cfg.DATA_DIR, 'admin-api-key');
      await writingTo('DATA_DIR', s.cfg.DATA_DIR, () => {
        fs.mkdirSync(s.cfg.DATA_DIR, { recursive: true, mode: 0o700 });
        // Never through a symlink; an existing file is made owner-only too.
        const fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_TRUNC | fs.constants.O_NOFOLLOW, 0o600);
        try {
          fs.fchmodSync(fd, 0o600);
          fs.writeSync(fd, created.key + '\n');
        } finally {
          fs.closeSync(fd);
        }
      });
      s.log.warn({ file }, 'created the first admin API key; it is stored in this file, readable only by its owner');
    }
    if (keys === 'created') s.log.info({ keys_dir: s.cfg.KEYS_DIR }, 'created the first local envelope key and the DEK aliased "default"');
    if (keys === 'adopted') s.log.info({ keys_dir: s.cfg.KEYS_DIR, file: BOOTSTRAP_KEY_FILE }, 'adopted the key file found in KEYS_DIR as the first local envelope key, and created the DEK aliased "default"');
  });
}

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

// What a path is, said for one that is not a regular file.
function kindOf(st: fs.Stats): string {
  if (st.isDirectory()) return 'a directory';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isSocket()) return 'a socket';
  if (st.isSymbolicLink()) return 'a symbolic link';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  return 'something other than a regular file';
}

const notAKeyFile = (file: string, st: fs.Stats) =>
  new ConfigError([['DATA_DIR', `${file} is ${kindOf(st)}, not an admin API key file: move it out of the way`]]);

// link() failing for these, of a regular file to a name in its own directory, says the file system
// has no hard links (SMB/Azure Files, some FUSE).
const NO_HARD_LINKS = ['EPERM', 'ENOTSUP', 'ENOSYS', 'EXDEV'];

// An admin key file found where a fresh database's key is to go (DATA_DIR kept for a new database,
// or shared by two installations) holds no key of this database, but perhaps the only copy of
// another's: it is moved to the first free `<file>.previous-N`, made owner-only, and that name
// returned. A hard link then an unlink, as rename would replace an earlier such file; neither
// follows a symlink. Anything there but a regular file (a directory, a FIFO, a symlink) is refused
// untouched: it holds no key, and opening a FIFO would wait for a writer (O_NONBLOCK, should one
// appear between the lstat and the open; fstat then checks what was opened).
function setAside(file: string): string | undefined {
  const seen = fs.lstatSync(file, { throwIfNoEntry: false });
  if (!seen) return undefined;
  if (!seen.isFile()) throw notAKeyFile(file, seen);
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  try {
    const opened = fs.fstatSync(fd);
    if (!opened.isFile()) throw notAKeyFile(file, opened);
    fs.fchmodSync(fd, 0o600);
  } finally {
    fs.closeSync(fd);
  }
  for (let n = 1; ; n++) {
    const previous = `${file}.previous-${n}`;
    try {
      fs.linkSync(file, previous);
    } catch (err) {
      const { code } = err as NodeJS.ErrnoException;
      if (code === 'EEXIST') continue;
      if (!NO_HARD_LINKS.includes(code ?? '')) throw err;
      // No hard links: a rename onto a name seen free just before. A file made at that name in
      // between (only by another installation sharing DATA_DIR, setting its own key aside at that
      // instant: the advisory lock serialises this database's processes) would be replaced.
      if (fs.lstatSync(previous, { throwIfNoEntry: false })) continue;
      fs.renameSync(file, previous);
      return previous;
    }
    fs.unlinkSync(file);
    return previous;
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
        const previous = setAside(file);
        if (previous) s.log.warn({ file, previous }, 'this database has no API keys, yet DATA_DIR held an admin API key file: it was moved aside, not overwritten, as it may be the only copy of another database\'s admin key');
        // Never through a symlink, nor into a file that appeared since.
        const fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
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

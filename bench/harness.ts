// What the benches share: a stack of their own (local Postgres and Redis under a temporary
// directory, the schema migrated, processes spawned with a fresh admin key), a keep-alive HTTP
// load loop and percentiles.
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
import { createDb, migrateLatest } from '../db/knex.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const say = (m: string) => console.error(`[bench] ${m}`);

export interface Stack {
  db: Knex;
  adminKey: string;
  redisUrl: string;
  /** Spawns a repository file under the stack's environment; resolves once `isReady` holds (polled), rejects if it exits first. */
  spawnReady(file: string, extraEnv: NodeJS.ProcessEnv, isReady: () => Promise<unknown>): Promise<void>;
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

  function spawnReady(file: string, extraEnv: NodeJS.ProcessEnv, isReady: () => Promise<unknown>): Promise<void> {
    const profile = process.env.BENCH_PROFILE_DIR ? ['--cpu-prof', `--cpu-prof-dir=${path.resolve(process.env.BENCH_PROFILE_DIR)}`] : [];
    const child = spawn(process.execPath, [...profile, '--import', 'tsx', path.join(root, file)], { cwd: root, env: { ...env, ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
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

  return { db, adminKey, redisUrl: redis.url, spawnReady, cleanup };
}

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

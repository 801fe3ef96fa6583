// Starts real API and worker processes against the test Postgres and Redis, and talks to them
// over HTTP like any client.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { createDb, type Db } from '../../db/knex.ts';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ADMIN_KEY = 'test-admin-key-0123456789abcdef';

export function requireEnv(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run the tests with "npm test"`);
  return v;
}

export function testEnv(overrides: Record<string, string | undefined> = {}): Record<string, string> {
  const dataDir = path.join(requireEnv('TEST_DATA_DIR'), `stack-${randomUUID().slice(0, 8)}`);
  fs.mkdirSync(dataDir, { recursive: true });
  const env: Record<string, string | undefined> = {
    ...process.env,
    NODE_ENV: 'test',
    DATABASE_URL: requireEnv('DATABASE_URL'),
    REDIS_URL: requireEnv('REDIS_URL'),
    ADMIN_API_KEY: ADMIN_KEY,
    DATA_DIR: dataDir,
    QUEUE_PREFIX: `{tb-${randomUUID().slice(0, 8)}}`,
    LOG_LEVEL: 'info',
    PORT: '0',
    WORKER_LOCK_MS: '2000',
    WORKER_STALLED_CHECK_MS: '1000',
    AGENT_BACKOFF_MS: '100',
    OUTBOX_SWEEP_MS: '300',
    A2A_BLOCKING_TIMEOUT_MS: '10000',
    ...overrides,
  };
  return Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined)) as Record<string, string>;
}

export interface Proc {
  child: ChildProcess;
  logs: string[];
  stop(): Promise<void>;
  kill(signal?: NodeJS.Signals): Promise<void>;
}

// API and worker processes running, each with its start's number. One started while a test file
// ran, and still running (not being stopped) when the next file's first test begins, was left behind:
// on the shared Postgres its outbox sweeper and job recovery would take rows meant for later stacks.
// It is killed then, and the run fails at its end naming the file.
const running = new Map<ChildProcess, number>();
let spawned = 0;
let lastEnded: { file: string; spawned: number } | undefined;
const leaks: string[] = [];
afterEach(function () {
  if (this.currentTest?.file) lastEnded = { file: path.relative(ROOT, this.currentTest.file), spawned };
});
beforeEach(function () {
  const file = this.currentTest?.file && path.relative(ROOT, this.currentTest.file);
  if (!lastEnded || !file || lastEnded.file === file) return;
  for (const [child, n] of running) {
    if (child.killed || n > lastEnded.spawned) continue;
    leaks.push(`${lastEnded.file}: pid ${child.pid} still running when ${file} began`);
    child.kill('SIGKILL');
  }
});
after(() => {
  if (leaks.length) throw new Error(`API or worker processes left running by their test files:\n${leaks.join('\n')}`);
});

function spawnProc(file: string, env: Record<string, string>, readyLine: RegExp, timeoutMs = 30000): Promise<Proc & { ready: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, file)], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  running.set(child, ++spawned);
  const logs: string[] = [];
  const exited = new Promise<void>((resolve) => child.once('exit', () => {
    running.delete(child);
    resolve();
  }));
  const kill = async (signal: NodeJS.Signals = 'SIGKILL') => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    await exited;
  };
  const stop = async () => {
    const t = setTimeout(() => child.kill('SIGKILL'), 15000);
    await kill('SIGTERM');
    clearTimeout(t);
  };
  return new Promise((resolve, reject) => {
    let buf = '';
    let done = false;
    const onData = (b: Buffer) => {
      buf += b.toString();
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        logs.push(line);
        if (process.env.TEST_VERBOSE) console.error(`[${path.basename(file)}] ${line}`);
        if (!done && readyLine.test(line)) {
          done = true;
          resolve({ child, logs, stop, kill, ready: line });
        }
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => {
      if (!done) { done = true; reject(new Error(`${file} exited with ${code} before it was ready:\n${logs.slice(-20).join('\n')}`)); }
    });
    setTimeout(() => {
      if (!done) { done = true; child.kill('SIGKILL'); reject(new Error(`${file} not ready in ${timeoutMs} ms:\n${logs.slice(-20).join('\n')}`)); }
    }, timeoutMs).unref();
  });
}

export async function startApi(env: Record<string, string>): Promise<Proc & { url: string }> {
  const p = await spawnProc('api/main.ts', env, /"msg":"api listening"/);
  const port = JSON.parse(p.ready).port as number;
  return { ...p, url: `http://127.0.0.1:${port}` };
}

export async function startWorker(env: Record<string, string>): Promise<Proc> {
  return spawnProc('workers/main.ts', env, /"msg":"worker started"/);
}

export interface Response<T = any> { status: number; body: T; headers: Headers; text: string }

// An error answer as SPEC.md section 1 shapes it: JSON {message, data: {code}}.
export function assertError(r: Response, status: number, code: string) {
  assert.equal(r.status, status, r.text);
  assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
  assert.equal(typeof r.body.message, 'string');
  assert.ok(r.body.message.length > 0);
  assert.equal(r.body.data.code, code, r.text);
}

// A 404 naming what was not found, as clients match it: data {code, resource, id}.
export function assertNotFound(r: Response, resource: string, id: string) {
  assertError(r, 404, 'not_found');
  assert.deepEqual(r.body.data, { code: 'not_found', resource, id }, r.text);
}

// A BullMQ handle on one of the stack's queues (to pause it, look at or add jobs), on a connection of
// its own; `close` closes both.
export function openQueue(env: Record<string, string>, name: string): { queue: Queue; close(): Promise<void> } {
  const connection = new Redis(env.REDIS_URL, { maxRetriesPerRequest: null });
  const queue = new Queue(name, { connection, prefix: env.QUEUE_PREFIX });
  return {
    queue,
    async close() {
      await queue.close();
      connection.disconnect();
    },
  };
}

// Runs `use` with such a handle, closed after.
export async function withQueue<T>(env: Record<string, string>, name: string, use: (queue: Queue) => Promise<T>): Promise<T> {
  const handle = openQueue(env, name);
  try {
    return await use(handle.queue);
  } finally {
    await handle.close();
  }
}

// Asks a key job's cancel while its row is held, as a batch of a worker holds it: answered 202 with
// the job still as it was (queued or running), the cancel left for the job's next step to apply.
// The job as that answer shows it.
export async function cancelWhileRowHeld(client: Client, jobId: string, status: 'queued' | 'running' = 'queued'): Promise<any> {
  const batch = await testDb().transaction();
  try {
    await batch('key_jobs').where({ id: jobId }).forUpdate().first();
    const asked = await client.post(`/api/encryption/v1/job/${jobId}/cancel`);
    assert.deepEqual([asked.status, asked.body.status], [202, status], asked.text);
    return asked.body;
  } finally {
    await batch.rollback();
  }
}

export class Client {
  constructor(readonly baseUrl: string, public key: string | undefined = ADMIN_KEY) {}

  async request<T = any>(method: string, url: string, body?: unknown, init: { headers?: Record<string, string>; raw?: string | Uint8Array } = {}): Promise<Response<T>> {
    const headers: Record<string, string> = { ...(this.key ? { authorization: `Bearer ${this.key}` } : {}), ...init.headers };
    let payload: string | Uint8Array | undefined = init.raw;
    if (body !== undefined) {
      payload = JSON.stringify(body);
      headers['content-type'] ??= 'application/json';
    }
    const res = await fetch(this.baseUrl + url, { method, headers, body: payload });
    const text = await res.text();
    let parsed: unknown = text;
    try { parsed = text ? JSON.parse(text) : undefined; } catch { /* not JSON */ }
    return { status: res.status, body: parsed as T, headers: res.headers, text };
  }

  get<T = any>(url: string) { return this.request<T>('GET', url); }
  post<T = any>(url: string, body?: unknown) { return this.request<T>('POST', url, body); }
  put<T = any>(url: string, body?: unknown) { return this.request<T>('PUT', url, body); }
  patch<T = any>(url: string, body?: unknown) { return this.request<T>('PATCH', url, body); }
  delete<T = any>(url: string) { return this.request<T>('DELETE', url); }
  as(key: string | undefined): Client {
    const c = new Client(this.baseUrl);
    c.key = key; // undefined means no Authorization header, not the admin default
    return c;
  }
}

export interface Stack { env: Record<string, string>; api: Proc & { url: string }; workers: Proc[]; client: Client; stop(): Promise<void> }

export async function startStack(overrides: Record<string, string | undefined> = {}, opts: { workers?: number } = {}): Promise<Stack> {
  const env = testEnv(overrides);
  const starting = [startApi(env), ...Array.from({ length: opts.workers ?? 1 }, () => startWorker(env))];
  const outcomes = await Promise.allSettled(starting);
  const failed = outcomes.find((o) => o.status === 'rejected');
  if (failed) {
    // The processes that did start would otherwise outlive the test run.
    await Promise.all(outcomes.map((o) => (o.status === 'fulfilled' ? o.value.stop() : undefined)));
    throw failed.reason;
  }
  const [api, ...workers] = outcomes.map((o) => (o as PromiseFulfilledResult<Proc>).value) as [Proc & { url: string }, ...Proc[]];
  const stack: Stack = {
    env, api, workers, client: new Client(api.url),
    async stop() { await Promise.all([api.stop(), ...stack.workers.map((w) => w.stop())]); },
  };
  return stack;
}

let sharedDb: Db | undefined;
export function testDb(): Db {
  sharedDb ??= createDb(requireEnv('DATABASE_URL'), { min: 0, max: 5 });
  return sharedDb;
}

// How many statements on the test database whose text is like `like` (ignoring case) wait for a lock
// another transaction holds: what a test waits for before it lets the holder go, rather than a sleep.
// The statement it means, not any: a stray waiter (a job of an earlier test) must not pass for it.
export async function lockWaits(like: string): Promise<number> {
  const { rows } = await testDb().raw(`select count(*)::int as n from pg_stat_activity
                                       where datname = current_database() and wait_event_type = 'Lock' and query ilike ?`, [like]);
  return rows[0].n;
}

// The schema's tables, but the migrations'.
async function appTables(db: Db): Promise<string[]> {
  const { rows } = await db.raw(`select tablename from pg_tables where schemaname = 'public' and tablename not like 'knex_migrations%' order by 1`);
  return rows.map((r: { tablename: string }) => r.tablename);
}

// Empties every table (but the migrations') so a test file starts from a known state.
export async function resetDb(): Promise<void> {
  const db = testDb();
  const tables = await appTables(db);
  if (tables.length) await db.raw(`truncate ${tables.map((t) => `"${t}"`).join(', ')} cascade`);
}

// Rows per table (but the migrations' and `except`), in one statement: what a refused request must
// leave as it was. Of the test database unless `db` names another.
export async function tableRowCounts(except: string[] = [], db: Db = testDb()): Promise<Record<string, number>> {
  const tables = (await appTables(db)).filter((t) => !except.includes(t));
  const { rows } = await db.raw(tables.map((t) => `select '${t}' as t, count(*)::int as n from "${t}"`).join(' union all '));
  return Object.fromEntries(rows.map((r: { t: string; n: number }) => [r.t, r.n]));
}

// Mocha hooks: `vars` set in process.env for the describe's tests, and put back as they were after
// them, since every later stack takes its environment from process.env (testEnv).
export function useProcessEnv(vars: Record<string, string>): void {
  const saved = new Map<string, string | undefined>();
  before(() => {
    for (const [name, value] of Object.entries(vars)) {
      saved.set(name, process.env[name]);
      process.env[name] = value;
    }
  });
  after(() => {
    for (const [name, value] of saved) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  });
}

// The stack of the calling describe: a before hook empties the database and starts it, an after hook
// stops it. What it returns reads through to that stack once started, so the describe's tests use it
// as they would the stack itself. Mocha runs hooks in the order they are registered: a before hook
// registered after this call may use the stack, an after hook runs once it has stopped.
export function useStack(...args: Parameters<typeof startStack>): Stack {
  return useStarted(() => startStack(...args), async (stack) => stack?.stop());
}

// Mocha hooks: `start` runs on a reset database before the describe's tests, `stop` after them (given
// no stack when the start failed). The stack answered stands for the one started, once it has started.
export function useStarted(start: () => Promise<Stack>, stop: (stack: Stack | undefined) => Promise<void>): Stack {
  let started: Stack | undefined;
  before(async () => {
    await resetDb();
    started = await start();
  });
  after(async () => stop(started));
  const stack = () => {
    assert.ok(started, 'the stack starts in a before hook: use it in hooks and tests, not while describing');
    return started;
  };
  return {
    get env() { return stack().env; },
    get api() { return stack().api; },
    get workers() { return stack().workers; },
    set workers(workers) { stack().workers = workers; }, // tests drop the workers they stopped
    get client() { return stack().client; },
    stop: () => stack().stop(),
  };
}

// The API's log lines up to and including the request line of `last`: lines come out in the order
// they were written, so once that one has arrived every earlier line has too. Request lines only
// unless `all`.
export async function requestLogsThrough(stack: Stack, last: { headers: Headers }, opts: { all?: boolean } = {}): Promise<string[]> {
  const id = last.headers.get('x-request-id');
  assert.ok(id, 'the response carries X-Request-Id');
  await waitFor(async () => stack.api.logs.some((l) => l.includes(`"req_id":"${id}"`) && l.includes('"msg":"request"')), `the log line of request ${id}`);
  return opts.all ? [...stack.api.logs] : stack.api.logs.filter((l) => l.includes('"msg":"request"'));
}

// A request on a raw socket that reads none of the answer: the API writes what the socket buffers
// hold, then waits on the client.
export function unreadAnswer(api: string, method: 'GET' | 'POST', url: string): net.Socket {
  const socket = net.connect(Number(new URL(api).port), '127.0.0.1', () => {
    socket.write(`${method} ${url} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Length: 0\r\n\r\n`);
  });
  socket.pause();
  socket.on('error', () => undefined);
  return socket;
}

// Whether the API has closed its end of such a socket's connection (the test API listens on
// 127.0.0.1), which the client cannot see while it reads nothing: the FIN waits behind the unread
// answer. Linux's TCP table shows the API's end in FIN_WAIT1 (04) from its close for as long as it
// still has bytes to send, then FIN_WAIT2, TIME_WAIT or CLOSING once the client has read them.
export function apiEndClosed(api: string, socket: net.Socket): boolean {
  const address = (port: number) => `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  const [local, remote] = [address(Number(new URL(api).port)), socket.localPort ? address(socket.localPort) : ''];
  return fs.readFileSync('/proc/net/tcp', 'utf8').split('\n').some((line) => {
    const [, from, to, state] = line.trim().split(/\s+/);
    return from === local && to === remote && ['04', '05', '06', '0B'].includes(state);
  });
}

// What such a socket receives from now until the connection closes, as latin1 text.
export function readUntilClosed(socket: net.Socket): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    socket.on('data', (b: Buffer) => chunks.push(b));
    socket.once('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    socket.resume();
  });
}

export async function waitFor<T>(fn: () => Promise<T | undefined | null | false>, what: string, timeoutMs = 20000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) { last = e; }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await sleep(everyMs);
  }
}

export const textMessage = (text: string, role: 'user' | 'agent' = 'user') => ({ role, parts: [{ type: 'text-part', text }] });
// The densest message there may be (MAX_JSON_VALUES): 99,990 empty objects, 300 kB of text and some
// 3.5 MB once parsed, numbered `n` in its data part.
export const denseMessage = (n: number, role: 'user' | 'agent' = 'user') => ({ role, parts: [{ type: 'data-part', data: { n, a: new Array(99_990).fill({}) } }] });

// The statuses a task went through, oldest first, read from its timeline.
export async function statusesOf(client: Client, taskId: string): Promise<string[]> {
  const tl = await client.get(`/api/task/v1/${taskId}/timeline?order=asc`);
  return tl.body.items.filter((i: any) => i.event_payload.type === 'task-status-update').map((i: any) => i.event_payload.status);
}

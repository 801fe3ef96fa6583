// `npm run bench:reads`: read endpoints against a bare Koa "hello" server (bench/hello-server.ts).
// Starts a real stack (local Postgres with normal durability, Redis, the API; no worker: nothing
// here writes), seeds BENCH_TASKS (10,000) tasks with SQL, each with 3 messages and a timeline of
// 6 items, then in BENCH_ROUNDS (3) rounds loads, with BENCH_CONNECTIONS (32) keep-alive clients for
// BENCH_SECONDS (5) each, every endpoint of ours and right after it the hello server (the same
// Node, client, connections and headers), so that a noisy neighbour weighs on both sides of a ratio:
//   GET /_internal/v1/health (the floor: routing, validation and the middleware, no Postgres),
//   GET /api/task/v1/{id} (a random seeded task), GET /api/task/v1?page_size=50,
//   GET /api/task/v1/{id}/timeline (a random seeded task), A2A tasks/get of a random seeded task, and bench/bare-pg-server.ts's GET task
//   (its two statements with no service code: Postgres's share of a read).
// Prints req/s, p50/p99 and the ratio to hello per round and for the round with the median ratio,
// against the target: GET task at >= 0.5 of the bare Koa + pg server (README explains why that one).
// BENCH_LOG_LEVEL (warn) sets the API's log level; BENCH_ENDPOINTS picks endpoints (below).
import os from 'node:os';
import { freePort } from '../scripts/local-services.ts';
import { answers, httpClient, load, median, pct, say, seedTasks, startStack, type LoadResult } from './harness.ts';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const TASKS = Number(process.env.BENCH_TASKS ?? 10_000);
const MESSAGES = 3;
const WARMUP_SECONDS = 2;
// Of the bare Koa + pg server's rate: our service code may at most double what a read costs.
const TARGET_RATIO = 0.5;
// BENCH_ENDPOINTS=task,list: only those (health, task, bare, list, timeline, a2a), e.g. to profile one.
interface Target { key: string; name: string; url: () => string; body?: () => string }
const ONLY = process.env.BENCH_ENDPOINTS?.split(',').map((k) => k.trim());

const stack = await startStack('reads', { logLevel: 'warn' });
const client = httpClient(CONNECTIONS);
try {
  say(`seeding ${TASKS.toLocaleString('en')} tasks with ${MESSAGES} messages each`);
  await seedTasks(stack.db, 0, TASKS, MESSAGES);
  const ids: string[] = (await stack.db('tasks').select('id')).map((r: { id: string }) => r.id);
  const [apiPort, helloPort, barePort] = [await freePort(), await freePort(), await freePort()];
  const api = `http://127.0.0.1:${apiPort}`;
  const hello = `http://127.0.0.1:${helloPort}/`;
  const bare = `http://127.0.0.1:${barePort}`;
  await Promise.all([
    stack.spawnReady('api/main.ts', { PORT: String(apiPort) }, answers(`${api}/_internal/v1/ready`)),
    stack.spawnReady('bench/hello-server.ts', { PORT: String(helloPort) }, answers(hello)),
    stack.spawnReady('bench/bare-pg-server.ts', { PORT: String(barePort) }, answers(`${bare}/`)),
  ]);

  const headers = { authorization: `Bearer ${stack.adminKey}` };
  const anyId = () => ids[Math.floor(Math.random() * ids.length)];
  // A2A tasks/get: a JSON-RPC POST, answered 200 with `error` when it fails.
  const tasksGet = () => JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id: anyId() } });
  const endpoints: Target[] = [
    { key: 'health', name: 'health', url: () => `${api}/_internal/v1/health` },
    { key: 'task', name: 'get task', url: () => `${api}/api/task/v1/${anyId()}` },
    { key: 'bare', name: 'bare pg, get task', url: () => `${bare}/task/${anyId()}` },
    { key: 'list', name: 'list tasks, 50', url: () => `${api}/api/task/v1?page_size=50` },
    { key: 'timeline', name: 'task timeline', url: () => `${api}/api/task/v1/${anyId()}/timeline` },
    { key: 'a2a', name: 'A2A tasks/get', url: () => `${api}/api/a2a/v1`, body: tasksGet },
  ].filter((e) => !ONLY || ONLY.includes(e.key));
  const helloTarget: Target = { key: 'hello', name: 'hello', url: () => hello };
  const run = (target: Target, seconds: number) => load(seconds, CONNECTIONS, async () => {
    const res = await client.request(target.url(), { headers, ...(target.body ? { method: 'POST', body: target.body() } : {}) });
    if (res.status !== 200 || (target.body && res.body.includes('"error"'))) throw new Error(`HTTP ${res.status} ${res.body.slice(0, 300)}`);
  });

  say(`warming up (${WARMUP_SECONDS} s per endpoint and hello)`);
  for (const e of endpoints) await run(e, WARMUP_SECONDS);
  await run(helloTarget, WARMUP_SECONDS);

  interface Pair { ours: LoadResult; hello: LoadResult; ratio: number }
  const rate = (r: LoadResult) => r.ok / (r.elapsedMs / 1000);
  const pairs = new Map<string, Pair[]>(endpoints.map((e) => [e.name, []]));
  for (let r = 1; r <= ROUNDS; r++) {
    for (const e of endpoints) {
      say(`round ${r}/${ROUNDS}: ${e.name}, then hello, ${CONNECTIONS} connections for ${SECONDS} s each`);
      const ours = await run(e, SECONDS);
      const base = await run(helloTarget, SECONDS);
      if (ours.firstError) throw new Error(`${e.name}: ${ours.errors} errors, the first: ${ours.firstError}`);
      if (base.firstError) throw new Error(`hello: ${base.errors} errors, the first: ${base.firstError}`);
      pairs.get(e.name)!.push({ ours, hello: base, ratio: rate(ours) / rate(base) });
    }
  }

  const ms = (v: number) => v.toFixed(2).padStart(8);
  const line = (label: string, p: Pair) => console.log(`  ${label.padEnd(34)}${rate(p.ours).toFixed(0).padStart(9)}${ms(pct(p.ours.latencies, 50))}${ms(pct(p.ours.latencies, 99))}` +
    `${rate(p.hello).toFixed(0).padStart(9)}${ms(pct(p.hello.latencies, 50))}${ms(pct(p.hello.latencies, 99))}${p.ratio.toFixed(2).padStart(7)}`);
  console.log(`\nRead endpoints vs a bare Koa hello server: ${CONNECTIONS} keep-alive connections, ${ROUNDS} rounds of ${SECONDS} s each side, ` +
    `${TASKS.toLocaleString('en')} tasks with ${MESSAGES} messages and ${MESSAGES + 3} timeline items each, ${os.cpus().length} CPUs, 1 API process`);
  console.log(`  ${''.padEnd(34)}${'ours/s'.padStart(9)}${'p50 ms'.padStart(8)}${'p99 ms'.padStart(8)}${'hello/s'.padStart(9)}${'p50 ms'.padStart(8)}${'p99 ms'.padStart(8)}${'ratio'.padStart(7)}`);
  for (const e of endpoints) {
    const ps = pairs.get(e.name)!;
    ps.forEach((p, i) => line(`${e.name}, round ${i + 1}`, p));
    const mid = ps.find((p) => p.ratio === median(ps.map((q) => q.ratio)))!;
    line(`${e.name}, median round`, mid);
  }
  const [ours, floor] = [pairs.get('get task'), pairs.get('bare pg, get task')];
  if (ours && floor) {
    const ratios = ours.map((p, i) => rate(p.ours) / rate(floor[i].ours));
    const mid = median(ratios);
    console.log(`  get task against the bare Koa + pg server (its two statements, no service code), rounds: ${ratios.map((r) => r.toFixed(2)).join(' / ')}, median ${mid.toFixed(2)}`);
    console.log(`  target ("a solid fraction" of hello): get task >= ${TARGET_RATIO} of the bare Koa + pg server, whose ratio to hello is what Postgres leaves any read here: ${mid >= TARGET_RATIO ? 'met' : 'NOT met'}`);
  }
} finally {
  client.destroy();
  await stack.cleanup();
}

// `npm run bench:pages`: what a page of a keyset-paginated list costs at 1,000 rows and at
// 1,000,000. Starts a real stack (local Postgres without fsync: the bench only reads what it seeds,
// Redis, the API), seeds 1,000 tasks (each in a context of its own; 10% failed) with SQL and
// measures, then grows the tables to BENCH_ROWS (1,000,000) in the same run and measures again.
// Measured, page_size 50, one request at a time over one keep-alive connection (latency, not
// throughput), BENCH_REQUESTS (300) times each, the measures taken in turn so that noise from a
// shared machine spreads over all of them:
//   GET /api/task/v1, GET /api/task/v1?status=failed, GET /api/task/v1/context,
// each at the first page and at pages starting 10%, 50% and 90% into the list (a deep page is where
// offset pagination gets slow and keyset pagination should not). The token of a deep page is made
// from a real token's list digest and the key of the row before that position (read with SQL): what
// walking next_page_token would hand out, without walking 18,000 pages; it is checked against a
// real one. Prints p50/p99 per page and the ratio large/small against the target "about the same":
// p50 ratio <= 1.5. Also the Postgres execution time of each list's deepest page (EXPLAIN ANALYZE),
// and the plan of every list whose ratio misses the target. BENCH_LOG_LEVEL (warn) sets the API's log level.
import os from 'node:os';
import type { Knex } from 'knex';
import { freePort } from '../scripts/local-services.ts';
import { listContexts, listTasks } from '../db/tasks.ts';
import { pgQuery } from '../db/knex.ts';
import { encodeToken } from '../db/pagination.ts';
import { answers, httpClient, pct, say, seedTasks, sortNum, startStack } from './harness.ts';

const SMALL = 1000;
const LARGE = Number(process.env.BENCH_ROWS ?? 1_000_000);
const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 300);
const PAGE = 50;
const POSITIONS = [0, 0.1, 0.5, 0.9];
const WARMUP_ROUNDS = 50;
const TARGET_RATIO = 1.5;

interface List {
  name: string; path: string; table: 'tasks' | 'contexts'; status?: string;
  // The same list read directly, for EXPLAIN.
  direct(db: Knex, token?: string): Promise<unknown>;
}
const lists: List[] = [
  { name: 'tasks', path: '/api/task/v1', table: 'tasks', direct: (db, t) => listTasks(db, {}, PAGE, t) },
  { name: 'tasks, status=failed', path: '/api/task/v1', table: 'tasks', status: 'failed', direct: (db, t) => listTasks(db, { status: 'failed' }, PAGE, t) },
  { name: 'contexts', path: '/api/task/v1/context', table: 'contexts', direct: (db, t) => listContexts(db, PAGE, t) },
];

interface Measure { list: List; position: number; row: number; token?: string; latencies: number[] }
interface Sized { rows: number; measures: Measure[]; dbMs: Map<List, number>; plans: Map<List, string> }

const stack = await startStack('pages', { logLevel: 'warn', ephemeralPostgres: true, ephemeralRedis: true });
const client = httpClient(1);
try {
  const port = await freePort();
  const api = `http://127.0.0.1:${port}`;
  await stack.spawnReady('api/main.ts', { PORT: String(port) }, answers(`${api}/_internal/v1/ready`));
  const headers = { authorization: `Bearer ${stack.adminKey}` };
  const url = (l: List, token?: string) => {
    const q = new URLSearchParams({ page_size: String(PAGE), ...(l.status ? { status: l.status } : {}), ...(token ? { next_page_token: token } : {}) });
    return `${api}${l.path}?${q}`;
  };
  const page = async (l: List, token?: string) => {
    const res = await client.request(url(l, token), { headers });
    const body = JSON.parse(res.body);
    if (res.status !== 200 || body.items?.length !== PAGE) throw new Error(`${l.name}: HTTP ${res.status}, ${body.items?.length} items: ${res.body.slice(0, 300)}`);
    return body as { items: unknown[]; next_page_token: string };
  };

  // The key of the row `offset` rows into the list (its order: created_at, id, newest first).
  const keyAt = async (l: List, offset: number) => {
    const q = stack.db(l.table).select('created_at', 'id').orderBy([{ column: 'created_at', order: 'desc' }, { column: 'id', order: 'desc' }]).offset(offset).first();
    if (l.status) q.where('status', l.status);
    const r = await q;
    return [r.created_at as Date, r.id as string];
  };
  const listSize = async (l: List) => Number((await (l.status ? stack.db(l.table).where('status', l.status) : stack.db(l.table)).count({ n: '*' }))[0].n);

  // A token resuming `l` after the row at `offset`: the list digest of a real token, the row's key.
  async function tokenAfter(l: List, offset: number): Promise<string> {
    const [digest] = JSON.parse(Buffer.from((await page(l)).next_page_token, 'base64url').toString());
    return encodeToken(digest, await keyAt(l, offset));
  }

  // The Postgres plan and execution time of the list's page after `token`, as the API runs it.
  async function explain(l: List, token?: string): Promise<{ ms: number; plan: string }> {
    let last: { sql: string; bindings: unknown[] } | undefined;
    const grab = (q: { sql: string; bindings: unknown[] }) => { last = q; };
    stack.db.on('query', grab);
    try {
      await l.direct(stack.db, token);
    } finally {
      stack.db.removeListener('query', grab);
    }
    // Its text numbers the parameters ($1, ...), as sent to Postgres.
    const { rows } = await pgQuery<{ 'QUERY PLAN': string }>(stack.db, `explain (analyze, buffers) ${last!.sql}`, last!.bindings);
    const plan = rows.map((r) => r['QUERY PLAN']);
    const ms = Number(/Execution Time: ([\d.]+) ms/.exec(plan.join('\n'))?.[1]);
    return { ms, plan: plan.join('\n') };
  }

  async function measure(rows: number): Promise<Sized> {
    const measures: Measure[] = [];
    for (const l of lists) {
      const n = await listSize(l);
      for (const position of POSITIONS) {
        // A full page always remains after the position.
        const row = Math.min(Math.round(position * n), n - PAGE - 1);
        measures.push({ list: l, position, row, token: row ? await tokenAfter(l, row - 1) : undefined, latencies: [] });
      }
    }
    // The made token is the one the list hands out.
    const first = await page(lists[0]);
    if ((await tokenAfter(lists[0], PAGE - 1)) !== first.next_page_token) throw new Error('a made page token differs from the one the API hands out');

    say(`${rows.toLocaleString('en')} rows: ${REQUESTS} requests for each of ${measures.length} pages`);
    // Warm-up, so that the first size measured does not also pay for a cold API process.
    for (let i = 0; i < WARMUP_ROUNDS; i++) for (const m of measures) await page(m.list, m.token);
    for (let i = 0; i < REQUESTS; i++) {
      for (const m of measures) {
        const t0 = performance.now();
        await page(m.list, m.token);
        m.latencies.push(performance.now() - t0);
      }
    }
    for (const m of measures) m.latencies = sortNum(m.latencies);
    const dbMs = new Map<List, number>();
    const plans = new Map<List, string>();
    for (const l of lists) {
      const deepest = measures.filter((m) => m.list === l).at(-1)!;
      const { ms, plan } = await explain(l, deepest.token);
      dbMs.set(l, ms);
      plans.set(l, plan);
    }
    return { rows, measures, dbMs, plans };
  }

  await seedTasks(stack.db, 0, SMALL);
  const small = await measure(SMALL);
  say(`growing the tables to ${LARGE.toLocaleString('en')} rows`);
  await seedTasks(stack.db, SMALL, LARGE - SMALL);
  const large = await measure(LARGE);

  const ms = (v: number) => v.toFixed(2).padStart(10);
  const where = (m: Measure) => (m.position ? `${(m.position * 100).toFixed(0)}%` : 'first page');
  console.log(`\nKeyset pagination: page_size ${PAGE}, ${REQUESTS} sequential requests per page over one keep-alive connection, ` +
    `${SMALL.toLocaleString('en')} vs ${LARGE.toLocaleString('en')} tasks (and contexts), ${os.cpus().length} CPUs, 1 API process`);
  console.log(`  ${'list, page at'.padEnd(36)}${'small p50'.padStart(10)}${'p99'.padStart(10)}${'large p50'.padStart(10)}${'p99'.padStart(10)}  ${'ratio p50'.padStart(9)}${'p99'.padStart(7)}   rows into the list (small / large)`);
  const ratios: { list: List; name: string; ratio: number }[] = [];
  large.measures.forEach((b, i) => {
    const a = small.measures[i];
    const r50 = pct(b.latencies, 50) / pct(a.latencies, 50);
    const r99 = pct(b.latencies, 99) / pct(a.latencies, 99);
    ratios.push({ list: b.list, name: `${b.list.name} ${where(b)}`, ratio: r50 });
    console.log(`  ${`${b.list.name}, ${where(b)}`.padEnd(36)}${ms(pct(a.latencies, 50))}${ms(pct(a.latencies, 99))}${ms(pct(b.latencies, 50))}${ms(pct(b.latencies, 99))}  ` +
      `${r50.toFixed(2).padStart(9)}${r99.toFixed(2).padStart(7)}   ${a.row.toLocaleString('en')} / ${b.row.toLocaleString('en')}`);
  });
  for (const l of lists) {
    console.log(`  Postgres execution, ${l.name}, page at 90%: ${small.dbMs.get(l)!.toFixed(3)} ms / ${large.dbMs.get(l)!.toFixed(3)} ms (ratio ${(large.dbMs.get(l)! / small.dbMs.get(l)!).toFixed(2)})`);
  }
  const missed = ratios.filter((r) => r.ratio > TARGET_RATIO);
  console.log(`  target ("about the same"): p50 ratio <= ${TARGET_RATIO} for every page: ${missed.length ? `NOT met for ${missed.map((r) => `${r.name} (${r.ratio.toFixed(2)})`).join(', ')}` : 'met'}` +
    ` (worst ${Math.max(...ratios.map((r) => r.ratio)).toFixed(2)})`);
  for (const l of lists.filter((x) => missed.some((r) => r.list === x))) {
    console.log(`\n  EXPLAIN ANALYZE, ${l.name}, page at 90%, ${LARGE.toLocaleString('en')} rows:\n${large.plans.get(l)!.replace(/^/gm, '    ')}`);
  }
} finally {
  client.destroy();
  await stack.cleanup();
}

// `npm run bench:deks [-- N]` (or DEKS=N): bulk DEK migration throughput. Seeds N DEKs (default
// 100,000) under a local envelope key, then measures in the same run
//   1. a bare batch re-wrap loop: the same crypto and the same batched compare-and-set UPDATE
//      as the worker, called directly, no queue, no API;
//   2. migrate-all through the real API and a real worker process (POST …/migrate, then polling
//      GET /job/{id} until it completes), timed end to end;
// and prints DEKs/s for both and their ratio. Postgres runs with its normal durability settings.
import os from 'node:os';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import cliProgress from 'cli-progress';
import { freePort } from '../scripts/local-services.ts';
import { createRedis } from '../queues/connection.ts';
import { deksUnder, insertDeks, rewrapDeks } from '../db/deks.ts';
import { localWrapper, readLocalKeyFile } from '../domain/crypto/envelope-keys.ts';
import { rewrapAll } from '../domain/crypto/dek-migration.ts';
import { loadConfig } from '../domain/config.ts';
import { answers, startStack } from './harness.ts';

const N = Number(process.argv[2] ?? process.env.DEKS ?? 100_000);
if (!Number.isSafeInteger(N) || N < 1) throw new Error(`DEK count must be a positive integer, got ${process.argv[2] ?? process.env.DEKS}`);
const TARGET_RATE = 5000;
const TARGET_RATIO = 0.5;

const stack = await startStack('deks', { logLevel: 'info', ephemeralRedis: true });
const { db, adminKey } = stack;
const cfg = loadConfig(stack.env);

try {
  const apiPort = await freePort();
  const api = `http://127.0.0.1:${apiPort}`;
  const queueConnection = createRedis(stack.redisUrl, 'worker');
  const keyJobs = new Queue('key-jobs', { prefix: 'bench', connection: queueConnection });
  await Promise.all([
    stack.spawnReady('api/main.ts', { PORT: String(apiPort) }, answers(`${api}/_internal/v1/ready`)),
    stack.spawnReady('workers/main.ts', {}, async () => (await keyJobs.getWorkersCount()) > 0),
  ]);
  await keyJobs.close();
  queueConnection.disconnect();
  const base = `${api}/api/encryption/v1`;
  const call = async (method: string, url: string, body?: unknown) => {
    const res = await fetch(base + url, {
      method, headers: { authorization: `Bearer ${adminKey}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    const json = await res.json() as any;
    if (res.status >= 300) throw new Error(`${method} ${url} -> ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  for (const f of ['bench-a.key', 'bench-b.key', 'bench-c.key']) await call('POST', '/envelope', { type: 'local', file_name: f });
  const wrapper = async (name: string) => localWrapper(await readLocalKeyFile(cfg.KEYS_DIR, name));

  const bar = (label: string) => new cliProgress.SingleBar({ format: `${label.padEnd(22)} {bar} {value}/{total} DEKs  {rate}`, hideCursor: true, stream: process.stderr }, cliProgress.Presets.shades_classic);

  // Seed: N DEKs under bench-a, bulk-inserted.
  const seeding = bar('seeding');
  seeding.start(N, 0, { rate: '' });
  const a = await wrapper('bench-a.key');
  for (let i = 0; i < N; i += 10_000) {
    const rows = Array.from({ length: Math.min(10_000, N - i) }, (_, j) => ({ id: `bench-${String(i + j).padStart(8, '0')}`, envelope_key_id: 'bench-a.key', encrypted_dek: a.wrapSync(randomBytes(32)) }));
    await insertDeks(db, rows);
    seeding.update(i + rows.length);
  }
  seeding.stop();
  await db.raw('vacuum analyze deks');

  // 1. Bare loop: bench-a -> bench-b, the worker's batch steps without queue or job row.
  const batch = cfg.DEK_MIGRATION_BATCH;
  const bare = bar('bare re-wrap loop');
  bare.start(N, 0, { rate: '' });
  const from = await wrapper('bench-a.key');
  const to = await wrapper('bench-b.key');
  let cursor: string | null = null;
  let bareDone = 0;
  const t0 = performance.now();
  for (;;) {
    const n: number = await db.transaction(async (trx) => {
      const rows = await deksUnder(trx, 'bench-a.key', { after: cursor }, batch);
      if (!rows.length) return 0;
      const res = await rewrapAll(from, to, rows);
      const updated = await rewrapDeks(trx, 'bench-a.key', 'bench-b.key', res.ids, res.wrapped);
      cursor = rows[rows.length - 1].id;
      return updated.length;
    });
    if (!n) break;
    bareDone += n;
    bare.update(bareDone, { rate: `${Math.round(bareDone / ((performance.now() - t0) / 1000))}/s` });
  }
  const bareSec = (performance.now() - t0) / 1000;
  bare.stop();
  if (bareDone !== N) throw new Error(`bare loop re-wrapped ${bareDone} of ${N}`);
  await db.raw('vacuum analyze deks');

  // 2. Through the API and a worker: bench-b -> bench-c.
  const svc = bar('API + worker');
  svc.start(N, 0, { rate: '' });
  const t1 = performance.now();
  const started = await call('POST', '/envelope/bench-b.key/migrate', { to_envelope_encryption_key_id: 'bench-c.key' });
  let job = started;
  while (job.status === 'queued' || job.status === 'running') {
    await sleep(25);
    job = await call('GET', `/job/${started.id}`);
    svc.update(job.done, { rate: `${Math.round(job.done / ((performance.now() - t1) / 1000))}/s` });
  }
  const svcSec = (performance.now() - t1) / 1000;
  svc.stop();
  if (job.status !== 'completed' || job.done !== N || job.failed !== 0) throw new Error(`job ended ${job.status}, done ${job.done}, failed ${job.failed}`);

  // Spot check: DEKs unwrap under the final key.
  const c = await wrapper('bench-c.key');
  const sample = await db('deks').select('envelope_key_id', 'encrypted_dek').orderByRaw('random()').limit(100);
  for (const d of sample) if (d.envelope_key_id !== 'bench-c.key' || c.unwrapSync(d.encrypted_dek).length !== 32) throw new Error('a migrated DEK does not unwrap under the target key');

  const bareRate = N / bareSec;
  const svcRate = N / svcSec;
  const ratio = svcRate / bareRate;
  const workerSec = (new Date(job.finished_at).getTime() - new Date(job.created_at).getTime()) / 1000;
  console.log(`\nDEK migration, ${N.toLocaleString('en')} DEKs, local envelope keys, batch ${batch}, ${os.cpus().length} CPUs`);
  console.log(`  bare batch re-wrap loop:   ${bareRate.toFixed(0).padStart(7)} DEKs/s  (${bareSec.toFixed(2)} s)`);
  console.log(`  API + worker (end to end): ${svcRate.toFixed(0).padStart(7)} DEKs/s  (${svcSec.toFixed(2)} s; job row created->finished ${workerSec.toFixed(2)} s)`);
  console.log(`  ratio API+worker / bare:   ${ratio.toFixed(2)}`);
  console.log(`  target > ${TARGET_RATE} DEKs/s: ${svcRate > TARGET_RATE ? 'met' : 'NOT met'}; target ratio >= ${TARGET_RATIO}: ${ratio >= TARGET_RATIO ? 'met' : 'NOT met'}`);
} finally {
  await stack.cleanup();
}

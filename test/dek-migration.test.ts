import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { setTimeout } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { cancelWhileRowHeld, startStack, startWorker, testDb, useStack, waitFor, type Client, type Stack, withQueue } from './helpers/stack.ts';
import { insertDeks } from '../db/deks.ts';
import { openByHand, sealByHand } from './helpers/aes-gcm-by-hand.ts';

const E = '/api/encryption/v1';
const N = 2000;

// The job as GET /job shows it once it has ended.
const jobEnded = (c: Client, id: string, what: string) => waitFor(async () => {
  const r = await c.get(`${E}/job/${id}`);
  return ['completed', 'failed'].includes(r.body.status) && r.body;
}, what, 90000, 50);

describe('bulk DEK migration', () => {
  // Small batches with a pause so the job is surely mid-way when the worker is killed. No rate
  // limit: the clients that create DEKs during a migration below go as fast as the machine lets
  // them, past 1,000 requests a second on a fast one.
  const stack = useStack({ DEK_MIGRATION_BATCH: '20', DEK_MIGRATION_PAUSE_MS: '15', RATE_LIMIT_PER_SECOND: '0' });
  let redis: Redis;
  const plains = new Map<string, Buffer>();
  const secretValues = new Map<string, string>();
  let srcKek: Buffer;
  let dstKek: Buffer;

  before(async () => {
    redis = new Redis(process.env.REDIS_URL!);
    const c = stack.client;
    for (const f of ['src.key', 'dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const keysDir = path.join(stack.env.DATA_DIR, 'keys');
    srcKek = fs.readFileSync(path.join(keysDir, 'src.key'));
    dstKek = fs.readFileSync(path.join(keysDir, 'dst.key'));
    const rows = Array.from({ length: N }, (_, i) => {
      const id = `bulk-${String(i).padStart(5, '0')}`;
      const plain = randomBytes(32);
      plains.set(id, plain);
      return { id, envelope_key_id: 'src.key', encrypted_dek: sealByHand(srcKek, plain) };
    });
    await insertDeks(testDb(), rows);
    // Secrets on some of the DEKs, through the secret API.
    for (let i = 0; i < N; i += 100) {
      const dek = rows[i].id;
      assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek, alias: `a-${dek}` })).status, 201);
      const value = `value of ${dek} ${randomBytes(8).toString('hex')}`;
      const s = await c.post('/api/secret/v1', { key: `s/${dek}`, raw_value: value, dek_alias: `a-${dek}` });
      assert.equal(s.status, 201, JSON.stringify(s.body));
      secretValues.set(`s/${dek}`, value);
    }
  });
  after(() => redis?.disconnect());

  it('2,000 DEKs, worker SIGKILLed mid-job: finishes after the restart, re-wraps every DEK exactly once, and keeps every secret readable', async () => {
    const c = stack.client;
    const started = await c.post(`${E}/envelope/src.key/migrate`, { to_envelope_encryption_key_id: 'dst.key' });
    assert.equal(started.status, 202);
    assert.equal(started.body.total, N);
    const jobId = started.body.id;
    const jobRow = () => testDb()('key_jobs').where({ id: jobId }).first();

    await waitFor(async () => (await jobRow()).done >= 200, 'migration under way', 30000, 5);
    const again = await c.post(`${E}/envelope/src.key/migrate`, { to_envelope_encryption_key_id: 'dst.key' });
    assert.equal(again.status, 200);
    assert.equal(again.body.id, jobId);

    await stack.workers[0].kill('SIGKILL');
    const atKill = await jobRow();
    assert.equal(atKill.status, 'running');
    assert.ok(atKill.done < N, `job was still running when the worker died (done ${atKill.done})`);
    // Another target for the same source while it runs: 409 naming the running job, no second job.
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'third.key' })).status, 201);
    const elsewhere = await c.post(`${E}/envelope/src.key/migrate`, { to_envelope_encryption_key_id: 'third.key' });
    assert.equal(elsewhere.status, 409, elsewhere.text);
    assert.match(elsewhere.body.message, new RegExp(`to 'dst.key' is running \\(job ${jobId}\\)`));
    assert.equal(Number((await testDb()('key_jobs').count({ n: '*' }))[0].n), 1);
    // Reads keep working while no worker runs.
    const mid = await c.get('/api/secret/v1/list-decrypted?page_size=1000');
    assert.equal(mid.status, 200);

    stack.workers.push(await startWorker(stack.env));
    const finished = await waitFor(async () => {
      const r = await c.get(`${E}/job/${jobId}`);
      return r.body.status === 'completed' && r.body;
    }, 'migration to complete after restart', 90000, 100);
    assert.deepEqual({ total: finished.total, done: finished.done, failed: finished.failed, errors: finished.errors }, { total: N, done: N, failed: 0, errors: [] });

    const deks = await testDb()('deks').whereIn('id', [...plains.keys()]);
    assert.equal(deks.length, N);
    for (const d of deks) {
      assert.equal(d.envelope_key_id, 'dst.key', d.id);
      // Unwrapping once under the target gives the original key: wrapped exactly once.
      assert.deepEqual(openByHand(dstKek, d.encrypted_dek), plains.get(d.id), d.id);
    }
    assert.equal((await c.get(`${E}/envelope/src.key`)).body.dek_count, 0);

    // Every secret decrypts to its value, in the service and from the stored rows by hand.
    const listed = await c.get('/api/secret/v1/list-decrypted?page_size=1000');
    const got = new Map(listed.body.secrets.map((s: any) => [s.key, s.decrypted_value]));
    for (const [k, v] of secretValues) assert.equal(got.get(k), v, k);
    for (const row of await testDb()('secrets').select('key', 'dek_id', 'encrypted_secret')) {
      assert.equal(openByHand(plains.get(row.dek_id)!, row.encrypted_secret).toString(), secretValues.get(row.key));
    }

    // BullMQ progress was reported on the job.
    const hashes: Record<string, string>[] = [];
    for (const key of await redis.keys(`${stack.env.QUEUE_PREFIX}:key-jobs:*`)) {
      if ((await redis.type(key)) === 'hash') hashes.push(await redis.hgetall(key));
    }
    const bull = hashes.find((h) => h.data && JSON.parse(h.data).job_id === jobId);
    assert.ok(bull, 'the BullMQ job hash exists');
    assert.deepEqual(JSON.parse(bull.data), { job_id: jobId });
    assert.equal(JSON.parse(bull.progress).done, N);

    // No key material or secret value in process logs or BullMQ job hashes.
    const haystacks = [
      ...[stack.api, ...stack.workers].flatMap((p) => p.logs),
      ...hashes.map((h) => JSON.stringify(h)),
    ].join('\n');
    assert.ok(haystacks.includes(jobId), 'the haystack is real');
    const needles = [srcKek, dstKek, ...plains.values()].flatMap((b) => [b.toString('base64'), b.toString('hex')]);
    needles.push(...deks.map((d) => d.encrypted_dek), ...secretValues.values());
    for (const n of needles) assert.ok(!haystacks.includes(n), 'key material or a secret leaked into logs or job data');
  });
  it('also takes the DEKs created or moved under the source while it runs, whatever their ids, and ends with total = done', async () => {
    const c = stack.client;
    for (const f of ['mid-src.key', 'mid-dst.key', 'other.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'mid-src.key'));
    const before = 2000;
    await insertDeks(testDb(), Array.from({ length: before }, (_, i) => ({ id: `m-${String(i).padStart(5, '0')}`, envelope_key_id: 'mid-src.key', encrypted_dek: sealByHand(kek, randomBytes(32)) })));
    const started = await c.post(`${E}/envelope/mid-src.key/migrate`, { to_envelope_encryption_key_id: 'mid-dst.key' });
    assert.equal(started.status, 202);
    const jobId = started.body.id;
    await waitFor(async () => (await c.get(`${E}/job/${jobId}`)).body.done >= 100, 'migration under way', 30000, 5);

    // Ids before the walk's cursor (which it has passed) and after it.
    const added = ['00000-early-1', '00000-early-2', 'zzzzz-late-1', 'zzzzz-late-2'];
    for (const id of added) assert.equal((await c.post(`${E}/envelope/mid-src.key/dek`, { id })).status, 201);
    assert.equal((await c.post(`${E}/envelope/other.key/dek`, { id: '00000-moved-in' })).status, 201);
    const moved = await c.post(`${E}/envelope/other.key/dek/00000-moved-in/migrate`, { to_envelope_encryption_key_id: 'mid-src.key' });
    assert.equal(moved.status, 200, moved.text);
    const mid = await testDb()('key_jobs').where({ id: jobId }).first();
    assert.ok(mid.status === 'running' && mid.cursor > '00000-moved-in', `the walk is still under way and past the early ids (${mid.status}, ${mid.cursor})`);

    // A migration the other way, or into its source, would move the same DEKs back and forth: 409.
    for (const [from, to] of [['mid-dst.key', 'mid-src.key'], ['other.key', 'mid-src.key'], ['mid-dst.key', 'other.key']]) {
      const crossing = await c.post(`${E}/envelope/${from}/migrate`, { to_envelope_encryption_key_id: to });
      assert.equal(crossing.status, 409, `${from} -> ${to}: ${crossing.text}`);
      assert.match(crossing.body.message, new RegExp(`'mid-src.key' to 'mid-dst.key' is running \\(job ${jobId}\\)`));
    }

    const finished = await waitFor(async () => {
      const r = await c.get(`${E}/job/${jobId}`);
      return r.body.status === 'completed' && r.body;
    }, 'migration to complete', 90000, 100);
    const all = before + added.length + 1;
    assert.deepEqual({ total: finished.total, done: finished.done, failed: finished.failed }, { total: all, done: all, failed: 0 });
    assert.equal((await c.get(`${E}/envelope/mid-src.key`)).body.dek_count, 0);
    assert.equal((await c.get(`${E}/envelope/mid-dst.key`)).body.dek_count, all);
    assert.equal((await c.delete(`${E}/envelope/mid-src.key`)).status, 200, 'the source holds nothing any more');
  });
  it('takes a failed DEK once however many fail (past the 1,000 errors it lists), and ends with total = done + failed', async () => {
    const c = stack.client;
    for (const f of ['bad-src.key', 'bad-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'bad-src.key'));
    const bad = 1100;
    const good = 50;
    await insertDeks(testDb(), [
      ...Array.from({ length: bad }, (_, i) => ({ id: `bad-${String(i).padStart(5, '0')}`, envelope_key_id: 'bad-src.key', encrypted_dek: sealByHand(randomBytes(32), randomBytes(32)) })),
      ...Array.from({ length: good }, (_, i) => ({ id: `good-${String(i).padStart(5, '0')}`, envelope_key_id: 'bad-src.key', encrypted_dek: sealByHand(kek, randomBytes(32)) })),
    ]);
    const started = await c.post(`${E}/envelope/bad-src.key/migrate`, { to_envelope_encryption_key_id: 'bad-dst.key' });
    assert.equal(started.status, 202);
    const finished = await waitFor(async () => {
      const r = await c.get(`${E}/job/${started.body.id}`);
      return r.body.status === 'completed' && r.body;
    }, 'migration to complete', 90000, 100);
    assert.deepEqual({ total: finished.total, done: finished.done, failed: finished.failed }, { total: bad + good, done: good, failed: bad });
    assert.equal(finished.errors.length, 1000, 'the errors listed are bounded');
    assert.equal(finished.params.sweep, undefined, 'no sweep: the DEKs left are the failed ones');
    assert.equal((await c.get(`${E}/envelope/bad-src.key`)).body.dek_count, bad);
  });

  it('fails when its target key file is deleted mid-job, wrapping no DEK under it after that', async () => {
    const c = stack.client;
    for (const f of ['gone-src.key', 'gone-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const keysDir = path.join(stack.env.DATA_DIR, 'keys');
    const kek = fs.readFileSync(path.join(keysDir, 'gone-src.key'));
    const target = fs.readFileSync(path.join(keysDir, 'gone-dst.key'));
    const count = 1000;
    const keys = new Map<string, Buffer>();
    await insertDeks(testDb(), Array.from({ length: count }, (_, i) => {
      const id = `gone-${String(i).padStart(5, '0')}`;
      keys.set(id, randomBytes(32));
      return { id, envelope_key_id: 'gone-src.key', encrypted_dek: sealByHand(kek, keys.get(id)!) };
    }));
    const started = await c.post(`${E}/envelope/gone-src.key/migrate`, { to_envelope_encryption_key_id: 'gone-dst.key' });
    assert.equal(started.status, 202);
    const jobRow = () => testDb()('key_jobs').where({ id: started.body.id }).first();
    await waitFor(async () => (await jobRow()).done >= 40, 'migration under way', 30000, 5);
    fs.rmSync(path.join(keysDir, 'gone-dst.key'));
    const atRemoval = await jobRow();
    assert.ok(atRemoval.status === 'running' && atRemoval.done < count, `the job was still running when the file went (${atRemoval.status}, done ${atRemoval.done})`);
    let finished: any;
    try {
      finished = await jobEnded(c, started.body.id, 'migration to end');
    } finally {
      fs.writeFileSync(path.join(keysDir, 'gone-dst.key'), target, { mode: 0o600 });
    }
    assert.equal(finished.status, 'failed');
    assert.match(finished.errors.at(-1).message, /^local envelope key 'gone-dst\.key' cannot be read \(ENOENT\)$/);
    // At most the batch under way when the file went was wrapped under it; the rest stayed.
    assert.ok(finished.done <= atRemoval.done + 20, `done ${finished.done}, ${atRemoval.done} when the file went`);
    const moved = await testDb()('deks').where({ envelope_key_id: 'gone-dst.key' });
    assert.equal(moved.length, finished.done);
    assert.equal((await c.get(`${E}/envelope/gone-src.key`)).body.dek_count, count - finished.done);
    assert.equal(finished.total, finished.done + finished.failed + (count - finished.done), 'total = done + failed + the DEKs it had still to move');
    for (const d of moved) assert.ok(openByHand(target, d.encrypted_dek).equals(keys.get(d.id)!), d.id);
  });

  it('is canceled mid-way (202 while a batch holds it, 200 when queued): stops after the batch in flight, each DEK left under one key or the other and opening there', async () => {
    const c = stack.client;
    for (const f of ['stop-src.key', 'stop-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const keysDir = path.join(stack.env.DATA_DIR, 'keys');
    const keks = { 'stop-src.key': fs.readFileSync(path.join(keysDir, 'stop-src.key')), 'stop-dst.key': fs.readFileSync(path.join(keysDir, 'stop-dst.key')) };
    const count = 1000;
    const keys = new Map<string, Buffer>();
    await insertDeks(testDb(), Array.from({ length: count }, (_, i) => {
      const id = `stop-${String(i).padStart(5, '0')}`;
      keys.set(id, randomBytes(32));
      return { id, envelope_key_id: 'stop-src.key', encrypted_dek: sealByHand(keks['stop-src.key'], keys.get(id)!) };
    }));
    const started = await c.post(`${E}/envelope/stop-src.key/migrate`, { to_envelope_encryption_key_id: 'stop-dst.key' });
    assert.equal(started.status, 202);
    const id = started.body.id;
    await waitFor(async () => (await c.get(`${E}/job/${id}`)).body.done >= 40, 'migration under way', 30000, 5);

    // Refused: a key that may only read, an id that is no UUID, a job that does not exist. None cancels.
    const reader = (await c.post('/api/auth/v1/api-key', { name: 'reads keys', scopes: ['encryption:read'] })).body.key;
    assert.equal((await c.as(reader).post(`${E}/job/${id}/cancel`)).status, 403);
    const notUuid = await c.post(`${E}/job/not-a-job/cancel`);
    assert.equal(notUuid.status, 400, notUuid.text);
    const missing = await c.post(`${E}/job/00000000-0000-4000-8000-000000000000/cancel`);
    assert.equal(missing.status, 404, missing.text);
    assert.match(missing.body.message, /00000000-0000-4000-8000-000000000000' not found/);
    assert.equal((await c.get(`${E}/job/${id}`)).body.status, 'running');

    // A batch holds the job's row while it runs: a cancel then is recorded and answered 202 at once,
    // the job still running, and the job's next step applies it (held here as a long batch would).
    const requested = await cancelWhileRowHeld(c, id, 'running');
    assert.ok(requested.done < count, `canceled before the end (done ${requested.done})`);
    // The worker stops at its next step: the job row and its log line say so.
    await waitFor(async () => stack.workers.some((w) => w.logs.some((l) => l.includes(id) && l.includes('DEK migration finished') && l.includes('"status":"canceled"'))), 'the worker to stop', 30000, 20);
    const stopped = await testDb()('key_jobs').where({ id }).first();
    assert.equal(stopped.status, 'canceled');
    assert.ok(stopped.finished_at, 'it ended');
    assert.equal(stopped.done, requested.done, 'no batch ran after the cancel');
    assert.equal(await testDb()('key_job_cancels').where({ job_id: id }).first(), undefined, 'the request was applied');
    await setTimeout(300);
    const deks = await testDb()('deks').whereIn('envelope_key_id', Object.keys(keks));
    assert.equal(deks.length, count);
    const under = deks.filter((d) => d.envelope_key_id === 'stop-dst.key').length;
    assert.equal(under, stopped.done, 'the DEKs moved are those the job counted, and nothing moved after it stopped');
    for (const d of deks) assert.ok(openByHand(keks[d.envelope_key_id as keyof typeof keks], d.encrypted_dek).equals(keys.get(d.id)!), d.id);

    // Again: answered as it is (a retried cancel). A job that ended otherwise cannot be canceled.
    const again = await c.post(`${E}/job/${id}/cancel`);
    assert.deepEqual([again.status, again.body.status, again.body.done], [200, 'canceled', stopped.done]);
    // A queued job no batch holds is canceled at once (200); its worker then does nothing with it.
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      await keyJobs.pause();
      try {
        await c.post(`${E}/envelope/stop-src.key/dek`, { id: 'stop-queued' });
        const queued = await c.post(`${E}/envelope/stop-src.key/migrate`, { to_envelope_encryption_key_id: 'stop-dst.key' });
        assert.equal(queued.status, 202, queued.text);
        const now = await c.post(`${E}/job/${queued.body.id}/cancel`);
        assert.deepEqual([now.status, now.body.status, now.body.done], [200, 'canceled', 0], now.text);
      } finally {
        await keyJobs.resume();
      }
    });
    // One whose row is held as it waits (a batch of an earlier worker, say) is answered 202; the
    // worker's start applies the cancel and logs that end, once, as every step that ends a job does.
    let held!: string;
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      await keyJobs.pause();
      try {
        const queued = await c.post(`${E}/envelope/stop-src.key/migrate`, { to_envelope_encryption_key_id: 'stop-dst.key' });
        assert.equal(queued.status, 202, queued.text);
        held = queued.body.id;
        await cancelWhileRowHeld(c, held);
      } finally {
        await keyJobs.resume();
      }
    });
    const endLines = () => stack.workers.flatMap((w) => w.logs).filter((l) => l.includes(held) && /"msg":"DEK migration (finished|failed)"/.test(l));
    await waitFor(async () => endLines().length > 0, 'the worker to end the job', 10000, 20);
    await setTimeout(200);
    assert.equal(endLines().length, 1, endLines().join('\n'));
    assert.deepEqual([JSON.parse(endLines()[0]).status, (await c.get(`${E}/job/${held}`)).body.status], ['canceled', 'canceled']);
    // The source is free again: a new migration takes the rest, and once it completed it is no longer cancelable.
    const rest = await c.post(`${E}/envelope/stop-src.key/migrate`, { to_envelope_encryption_key_id: 'stop-dst.key' });
    assert.equal(rest.status, 202, rest.text);
    assert.notEqual(rest.body.id, id);
    const finished = await jobEnded(c, rest.body.id, 'the second migration to end');
    assert.deepEqual([finished.status, finished.done], ['completed', count + 1 - stopped.done]);
    const late = await c.post(`${E}/job/${rest.body.id}/cancel`);
    assert.equal(late.status, 409, late.text);
    assert.match(late.body.message, /already ended \(completed\)/);
    assert.equal((await c.get(`${E}/job/${rest.body.id}`)).body.status, 'completed');
    assert.equal((await c.get(`${E}/envelope/stop-dst.key`)).body.dek_count, count + 1);
  });

  it('canceled mid-way, ends with total = done + failed + the DEKs it had still to move, counting those written or moved out since its pass began', async () => {
    const c = stack.client;
    for (const f of ['late-src.key', 'late-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'late-src.key'));
    const count = 1000;
    await insertDeks(testDb(), Array.from({ length: count }, (_, i) => ({ id: `late-${String(i).padStart(5, '0')}`, envelope_key_id: 'late-src.key', encrypted_dek: sealByHand(kek, randomBytes(32)) })));
    const started = await c.post(`${E}/envelope/late-src.key/migrate`, { to_envelope_encryption_key_id: 'late-dst.key' });
    assert.equal(started.status, 202);
    const id = started.body.id;
    await waitFor(async () => (await c.get(`${E}/job/${id}`)).body.done >= 40, 'migration under way', 30000, 5);
    // Two DEKs behind its cursor (for a sweep to take) and one moved out ahead of it: the walk's
    // count, taken as it began, is off by one.
    for (const dek of ['0-late-a', '0-late-b']) assert.equal((await c.post(`${E}/envelope/late-src.key/dek`, { id: dek })).status, 201);
    assert.equal((await c.post(`${E}/envelope/late-src.key/dek/late-00999/migrate`, { to_envelope_encryption_key_id: 'late-dst.key' })).status, 200);
    const asked = await c.post(`${E}/job/${id}/cancel`);
    assert.ok([200, 202].includes(asked.status), asked.text);
    const job = await waitFor(async () => {
      const r = await c.get(`${E}/job/${id}`);
      return r.body.status === 'canceled' && r.body;
    }, 'the job to be canceled', 30000, 20);
    const left = (await c.get(`${E}/envelope/late-src.key`)).body.dek_count;
    assert.ok(job.done < count && left > 2, `canceled before the end (done ${job.done}, ${left} left)`);
    assert.deepEqual([job.failed, job.total], [0, job.done + left], JSON.stringify(job));
    assert.deepEqual(job.errors, []);
  });

  it('lets only one of two opposite migrations started at the same instant run', async () => {
    const c = stack.client;
    for (const f of ['x.key', 'y.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    await c.post(`${E}/envelope/x.key/dek`, { id: 'xy-0' });
    // Workers take no key job while the pair is sent: a job of one DEK could otherwise end before the
    // other request looks, and then that one may rightly start.
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      for (let round = 0; round < 5; round++) {
        await keyJobs.pause();
        const [a, b] = await Promise.all([
          c.post(`${E}/envelope/x.key/migrate`, { to_envelope_encryption_key_id: 'y.key' }),
          c.post(`${E}/envelope/y.key/migrate`, { to_envelope_encryption_key_id: 'x.key' }),
        ]).finally(() => keyJobs.resume());
        assert.deepEqual([a.status, b.status].sort(), [202, 409], `round ${round}: ${a.text} / ${b.text}`);
        const id = (a.status === 202 ? a : b).body.id;
        await waitFor(async () => (await c.get(`${E}/job/${id}`)).body.status === 'completed', 'the one started to end', 30000, 20);
      }
    });
  });
});

describe('bulk DEK migration while DEKs keep coming', () => {
  // A long pause between batches: each sweep stays open for at least a second, so the client
  // creating DEKs adds some behind its cursor however the CPU is shared (with short pauses a worker
  // that got the CPU could finish a sweep before a starved client wrote anything, and complete).
  const stack = useStack({ DEK_MIGRATION_BATCH: '20', DEK_MIGRATION_PAUSE_MS: '1000', RATE_LIMIT_PER_SECOND: '0' });

  it('cannot be held open by DEKs created all the time: after 5 sweeps it fails, naming how many it left', async () => {
    const c = stack.client;
    for (const f of ['busy-src.key', 'busy-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'busy-src.key'));
    await insertDeks(testDb(), Array.from({ length: 40 }, (_, i) => ({ id: `busy-${String(i).padStart(5, '0')}`, envelope_key_id: 'busy-src.key', encrypted_dek: sealByHand(kek, randomBytes(32)) })));
    const started = await c.post(`${E}/envelope/busy-src.key/migrate`, { to_envelope_encryption_key_id: 'busy-dst.key' });
    assert.equal(started.status, 202);
    // A client creates a DEK every 200 ms until the job ends, each id sorting before every earlier
    // one, so each lands behind the cursor of the pass under way and the next sweep has work.
    let ended = false;
    const creator = (async () => {
      for (let n = 99999; !ended; n--) {
        assert.equal((await c.post(`${E}/envelope/busy-src.key/dek`, { id: `0-${n}` })).status, 201);
        await setTimeout(200);
      }
    })();
    let finished: any;
    try {
      finished = await jobEnded(c, started.body.id, 'the job to end while DEKs keep coming');
    } finally {
      ended = true;
      await creator;
    }
    assert.equal(finished.status, 'failed');
    assert.equal(finished.params.sweep, 5);
    assert.match(finished.errors.at(-1).message, /^\d+ DEKs written under 'busy-src.key' while the job ran are still there after 5 sweeps: migrate it again$/);
    // The job's own reason, under its own id (as every key job failure's), not a DEK's: not counted in failed.
    assert.equal(finished.errors.at(-1).id, started.body.id);
    assert.equal(finished.failed, 0);
    const left = Number(/^(\d+) DEKs/.exec(finished.errors.at(-1).message)![1]);
    assert.equal(finished.total, finished.done + finished.failed + left, 'total = done + failed + the DEKs it left');
  });
});

describe('bulk DEK migration when its worker is stopped (SIGTERM)', () => {
  let stack: Stack;
  before(async () => {
    // One batch, then a long pause: the job is between batches when the worker is asked to stop.
    stack = await startStack({ DEK_MIGRATION_BATCH: '10', DEK_MIGRATION_PAUSE_MS: '60000', WORKER_SHUTDOWN_GRACE_MS: '1000' });
  });
  after(async () => stack?.stop());

  it('is handed back to the queue once the grace period is over, and another worker finishes it', async () => {
    const c = stack.client;
    for (const f of ['handback-src.key', 'handback-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'handback-src.key'));
    await insertDeks(testDb(), Array.from({ length: 35 }, (_, i) => ({ id: `hb-${i}`, envelope_key_id: 'handback-src.key', encrypted_dek: sealByHand(kek, randomBytes(32)) })));
    const started = await c.post(`${E}/envelope/handback-src.key/migrate`, { to_envelope_encryption_key_id: 'handback-dst.key' });
    assert.equal(started.status, 202, started.text);
    const job = () => c.get(`${E}/job/${started.body.id}`).then((r) => r.body);
    await waitFor(async () => (await job()).done === 10, 'the first batch');

    const worker = stack.workers.shift()!;
    const at = Date.now();
    await worker.kill('SIGTERM');
    assert.equal(worker.child.exitCode, 0);
    assert.ok(Date.now() - at < 24_000, `exited ${Date.now() - at} ms after SIGTERM (grace 1000 ms; the pause was 60 s)`);
    assert.ok(worker.logs.some((l) => l.includes('key job handed back to the queue') && l.includes(started.body.id)), worker.logs.slice(-10).join('\n'));
    assert.deepEqual([(await job()).status, (await job()).done], ['running', 10]);

    stack.workers.push(await startWorker({ ...stack.env, DEK_MIGRATION_PAUSE_MS: '0' }));
    const finished = await waitFor(async () => {
      const j = await job();
      return j.status === 'completed' && j;
    }, 'the migration to finish on the other worker');
    assert.deepEqual([finished.total, finished.done, finished.failed], [35, 35, 0]);
  });
});

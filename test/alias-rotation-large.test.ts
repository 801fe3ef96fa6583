import assert from 'node:assert/strict';
import { startWorker, testDb, useStack, waitFor, type Proc } from './helpers/stack.ts';

const S = '/api/secret/v1';
const E = '/api/encryption/v1';
const COPIES = 300;
const running = (p: Proc) => p.child.exitCode === null && p.child.signalCode === null;

describe('alias rotation of large secrets: batches are bounded by bytes, not only by count', () => {
  // No worker yet: the rotation starts once every secret is in place.
  const stack = useStack({ RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
  let worker: Proc | undefined;
  after(async () => worker?.stop());

  it('rotates 300 secrets of about a megabyte each with a worker of a 128 MiB heap, every secret still opening', async function () {
    this.timeout(180000);
    const c = stack.client;
    const raw = 'v'.repeat(700_000);
    const created = await c.post(S, { key: 'big/0', raw_value: raw });
    assert.equal(created.status, 201, created.text);
    const db = testDb();
    // Copies of its ciphertext under other keys (a secret's value is sealed without its key), so the
    // alias holds about 280 MB of ciphertext: a batch of the default 500 rows would hold all of it.
    await db.raw(
      `insert into secrets (id, key, encrypted_secret, dek_id, dek_alias)
       select gen_random_uuid(), 'big/' || n, s.encrypted_secret, s.dek_id, s.dek_alias from secrets s, generate_series(1, ?) n where s.id = ?`,
      [COPIES - 1, created.body.id],
    );
    const oldDek = (await db('secrets').where({ id: created.body.id }).first()).dek_id;

    worker = await startWorker({ ...stack.env, NODE_OPTIONS: '--max-old-space-size=128' });
    const started = await c.post(`${E}/dek/alias/default/rotate`);
    assert.equal(started.status, 202, started.text);
    const job = await waitFor(async () => {
      // Out of heap, V8 aborts: the worker ends by a signal.
      if (!running(worker!)) throw new Error(`the worker ended (${worker!.child.signalCode ?? worker!.child.exitCode})`);
      const j = (await c.get(`${E}/job/${started.body.id}`)).body;
      return ['completed', 'failed'].includes(j.status) && j;
    }, 'the rotation to end', 120000, 200);
    assert.equal(job.status, 'completed', JSON.stringify(job));
    assert.equal(job.done, COPIES, JSON.stringify({ ...job, errors: undefined }));
    assert.equal(job.failed, 0);
    assert.ok(running(worker), 'the worker is still running');

    const newDek = (await db('dek_aliases').where({ alias: 'default' }).first()).dek_id;
    assert.notEqual(newDek, oldDek);
    const deks = await db('secrets').where('key', 'like', 'big/%').select('dek_id').groupBy('dek_id');
    assert.deepEqual(deks.map((r) => r.dek_id), [newDek]);
    // The rotated copies open to the value.
    const page = await c.get(`${S}/list-decrypted?page_size=2`);
    assert.equal(page.status, 200, page.text.slice(0, 300));
    assert.equal(page.body.secrets.length, 2);
    for (const s of page.body.secrets) assert.equal(s.decrypted_value, raw);
  });
});

// Key jobs (bulk DEK migration, alias rotation) meeting a KMS key that KMS refuses for its state
// (disabled): a lasting state, not KMS failing, so the job is not retried for its attempts budget.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { DisableKeyCommand, EnableKeyCommand, KMSClient } from '@aws-sdk/client-kms';
import { assertError, resetDb, startStack, testDb, useProcessEnv, waitFor, withQueue, type Stack } from './helpers/stack.ts';
import { startKmsServer, type KmsServer } from './helpers/kms-server.ts';
import { sealByHand } from './helpers/aes-gcm-by-hand.ts';
import { insertDeks } from '../db/deks.ts';
import { kmsWrapper } from '../domain/crypto/envelope-keys.ts';

const E = '/api/encryption/v1';
const arn = (n: string) => `arn:aws:kms:eu-west-1:111122223333:key/0f1e2d3c-4b5a-6978-8796-0000000000${n}`;
const SRC = arn('01');
const DST = arn('02');
const ROT_OLD = arn('03');
const ROT_NEW = arn('04');
const enc = encodeURIComponent;
const disabled = (op: string, key: string) => `AWS KMS ${op} failed: DisabledException (KMS key '${key}' is disabled)`;

describe('key jobs when a KMS key they use is disabled', () => {
  let stack: Stack;
  let kms: KmsServer;
  let admin: KMSClient;
  const c = () => stack.client;
  const job = async (id: string) => (await c().get(`${E}/job/${id}`)).body;
  // Ended: no backoff to wait out, so well within the first retry's minutes.
  const ended = (id: string) => waitFor(async () => {
    const j = await job(id);
    return ['completed', 'failed'].includes(j.status) && j;
  }, `job ${id} to end`, 30_000);
  // How its BullMQ job went: one attempt, and the worker never said it would retry.
  const triedOnce = async (id: string) => {
    const q = await withQueue(stack.env, 'key-jobs', async (keyJobs) => (await keyJobs.getJobs(['failed', 'completed'])).find((j) => j?.data.job_id === id));
    assert.ok(q, `the queue job of ${id}`);
    assert.equal(q.attemptsMade, 1, `attempts of ${id}`);
    const retries = stack.workers[0].logs.filter((l) => l.includes(id) && l.includes('will retry'));
    assert.deepEqual(retries, []);
  };
  const aliasDek = async (alias: string) => (await testDb()('dek_aliases').where({ alias }).first()).dek_id as string;
  const setKey = (key: string, on: boolean) => admin.send(on ? new EnableKeyCommand({ KeyId: key }) : new DisableKeyCommand({ KeyId: key }));
  // Job `id` once `firstDone` items are done: its next batch's `op` calls to KMS wait while `disable` (a
  // key) is disabled, then are answered as KMS then would (or with `error`); the job as it ended. The key
  // is enabled again after.
  const endedAfterNextBatch = async (id: string, firstDone: number, op: string, { disable, error }: { disable?: string; error?: string }) => {
    await waitFor(async () => (await job(id)).done >= firstDone, 'a first batch', 30_000, 5);
    const release = kms.hold(op);
    try {
      const calls = kms.calls.length;
      await waitFor(async () => kms.calls.length > calls, 'the next batch to call KMS');
      if (disable) await setKey(disable, false);
      release(error);
      return await ended(id);
    } finally {
      release();
      if (disable) await setKey(disable, true);
    }
  };
  const dropCaches = async () => {
    const name = `drop-${randomUUID().slice(0, 8)}.key`;
    assert.equal((await c().post(`${E}/envelope`, { type: 'local', file_name: name })).status, 201);
    assert.equal((await c().delete(`${E}/envelope/${name}`)).status, 200);
  };
  const decrypted = async () => {
    const page = await c().get('/api/secret/v1/list-decrypted?page_size=1000');
    assert.equal(page.status, 200, page.text);
    return new Map<string, string | undefined>(page.body.secrets.map((s: { key: string; decrypted_value?: string }) => [s.key, s.decrypted_value]));
  };
  const createSecrets = async (prefix: string, n: number, alias: string) => {
    const values = new Map<string, string>();
    for (let i = 0; i < n; i++) {
      const key = `${prefix}/${i}`;
      values.set(key, `v-${key}-${randomBytes(4).toString('hex')}`);
      const r = await c().post('/api/secret/v1', { key, raw_value: values.get(key), dek_alias: alias });
      assert.equal(r.status, 201, r.text);
    }
    return values;
  };

  useProcessEnv({ AWS_ACCESS_KEY_ID: 'AKIDLOCALTEST', AWS_SECRET_ACCESS_KEY: 'local-test-secret' });
  before(async () => {
    await resetDb();
    kms = await startKmsServer([SRC, DST, ROT_OLD, ROT_NEW]);
    stack = await startStack({
      AWS_KMS_ENDPOINT: kms.url, AWS_ACCESS_KEY_ID: 'AKIDLOCALTEST', AWS_SECRET_ACCESS_KEY: 'local-test-secret',
      DEK_MIGRATION_BATCH: '20', DEK_MIGRATION_PAUSE_MS: '20', ALIAS_ROTATION_BATCH: '10', ALIAS_ROTATION_PAUSE_MS: '20',
    });
    admin = new KMSClient({ region: 'eu-west-1', endpoint: kms.url });
    for (const key of [SRC, DST, ROT_OLD, ROT_NEW]) assert.equal((await c().post(`${E}/envelope`, { type: 'aws_kms', arn: key, region: 'eu-west-1' })).status, 201);
  });
  after(async () => {
    admin?.destroy();
    await stack?.stop();
    await kms?.close();
  });

  it('a migration whose source KMS key is disabled fails at once naming the key and its state, moving nothing; re-run once enabled, it moves them all', async () => {
    assert.equal((await c().post(`${E}/envelope`, { type: 'local', file_name: 'from-kms.key' })).status, 201);
    const count = 30;
    for (let i = 0; i < count; i++) assert.equal((await c().post(`${E}/envelope/${enc(SRC)}/dek`, { id: `src-${i}` })).status, 201);
    assert.equal((await c().post(`${E}/dek/alias`, { dek_id: 'src-0', alias: 'src-alias' })).status, 201);
    const values = await createSecrets('src', 3, 'src-alias');
    const before = await testDb()('deks').where({ envelope_key_id: SRC }).orderBy('id');
    await setKey(SRC, false);
    try {
      const started = await c().post(`${E}/envelope/${enc(SRC)}/migrate`, { to_envelope_encryption_key_id: 'from-kms.key' });
      assert.equal(started.status, 202, started.text);
      const failed = await ended(started.body.id);
      assert.equal(failed.status, 'failed', JSON.stringify(failed));
      assert.deepEqual(failed.errors, [{ id: started.body.id, message: disabled('Decrypt', SRC) }]);
      assert.deepEqual([failed.total, failed.done, failed.failed], [count, 0, 0]);
      await triedOnce(started.body.id);
      assert.deepEqual(await testDb()('deks').where({ envelope_key_id: SRC }).orderBy('id'), before, 'nothing moved or rewritten');
    } finally {
      await setKey(SRC, true);
    }
    const again = await c().post(`${E}/envelope/${enc(SRC)}/migrate`, { to_envelope_encryption_key_id: 'from-kms.key' });
    assert.equal(again.status, 202, again.text);
    const done = await ended(again.body.id);
    assert.deepEqual([done.status, done.total, done.done, done.failed], ['completed', count, count, 0], JSON.stringify(done));
    assert.equal((await testDb()('deks').where({ envelope_key_id: 'from-kms.key' }).whereLike('id', 'src-%')).length, count);
    await dropCaches();
    const all = await decrypted();
    for (const [k, v] of values) assert.equal(all.get(k), v, k);
  });

  it('a migration to a KMS key disabled before the request is refused (502) naming the key and its state, starting no job', async () => {
    assert.equal((await c().post(`${E}/envelope`, { type: 'local', file_name: 'refused.key' })).status, 201);
    assert.equal((await c().post(`${E}/envelope/refused.key/dek`, { id: 'refused-dek' })).status, 201);
    const jobs = async () => Number((await testDb()('key_jobs').count({ n: '*' }))[0].n);
    const before = await jobs();
    await setKey(DST, false);
    try {
      const refused = await c().post(`${E}/envelope/refused.key/migrate`, { to_envelope_encryption_key_id: DST });
      assertError(refused, 502, 'bad_gateway');
      assert.equal(refused.body.message, disabled('Encrypt', DST));
    } finally {
      await setKey(DST, true);
    }
    assert.equal(await jobs(), before);
  });

  it('a migration whose target KMS key is disabled mid-job fails at its next batch, the DEKs moved staying moved; re-run once enabled, it moves the rest', async () => {
    assert.equal((await c().post(`${E}/envelope`, { type: 'local', file_name: 'to-kms.key' })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'to-kms.key'));
    const count = 400;
    const plains = new Map<string, Buffer>();
    await insertDeks(testDb(), Array.from({ length: count }, (_, i) => {
      const id = `dst-${String(i).padStart(4, '0')}`;
      plains.set(id, randomBytes(32));
      return { id, envelope_key_id: 'to-kms.key', encrypted_dek: sealByHand(kek, plains.get(id)!) };
    }));
    const started = await c().post(`${E}/envelope/to-kms.key/migrate`, { to_envelope_encryption_key_id: DST });
    assert.equal(started.status, 202, started.text);
    const failed = await endedAfterNextBatch(started.body.id, 20, 'Encrypt', { disable: DST });
    assert.equal(failed.status, 'failed', JSON.stringify(failed));
    assert.deepEqual(failed.errors, [{ id: started.body.id, message: disabled('Encrypt', DST) }]);
    assert.ok(failed.done >= 20 && failed.done < count, `done ${failed.done}`);
    assert.deepEqual([failed.total, failed.failed], [count, 0], 'total = done + the DEKs it had still to move');
    await triedOnce(started.body.id);
    const moved = await testDb()('deks').where({ envelope_key_id: DST }).whereLike('id', 'dst-%');
    assert.equal(moved.length, failed.done);
    const w = kmsWrapper(DST, 'eu-west-1', kms.url);
    for (const d of moved) assert.ok((await w.unwrap(d.encrypted_dek)).equals(plains.get(d.id)!), d.id);

    const again = await c().post(`${E}/envelope/to-kms.key/migrate`, { to_envelope_encryption_key_id: DST });
    assert.equal(again.status, 202, again.text);
    const done = await ended(again.body.id);
    assert.deepEqual([done.status, done.total, done.done, done.failed], ['completed', count - failed.done, count - failed.done, 0], JSON.stringify(done));
    assert.equal((await testDb()('deks').where({ envelope_key_id: 'to-kms.key' })).length, 0);
  });

  it('a migration whose KMS calls meet a KMSInvalidStateException other than pending deletion (a custom key store disconnected for a while) retries that batch and completes', async () => {
    assert.equal((await c().post(`${E}/envelope`, { type: 'local', file_name: 'to-kms-blip.key' })).status, 201);
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'to-kms-blip.key'));
    const count = 400;
    await insertDeks(testDb(), Array.from({ length: count }, (_, i) => ({ id: `blip-${String(i).padStart(4, '0')}`, envelope_key_id: 'to-kms-blip.key', encrypted_dek: sealByHand(kek, randomBytes(32)) })));
    const started = await c().post(`${E}/envelope/to-kms-blip.key/migrate`, { to_envelope_encryption_key_id: DST });
    assert.equal(started.status, 202, started.text);
    // The next batch's Encrypt calls are answered as KMS answers for a custom key store that is not connected.
    const done = await endedAfterNextBatch(started.body.id, 20, 'Encrypt', { error: 'KMSInvalidStateException' });
    assert.deepEqual([done.status, done.total, done.done, done.failed], ['completed', count, count, 0], JSON.stringify(done));
    const q = await withQueue(stack.env, 'key-jobs', async (keyJobs) => (await keyJobs.getJobs(['completed'])).find((j) => j?.data.job_id === started.body.id));
    assert.ok(q && q.attemptsMade >= 1 && stack.workers[0].logs.some((l) => l.includes(started.body.id) && l.includes('will retry')), 'the batch was retried');
    assert.equal((await testDb()('deks').where({ envelope_key_id: DST }).whereLike('id', 'blip-%')).length, count);
  });

  it('an alias rotation moves what it can read and lists, as not moved, the secrets under an older DEK whose KMS key is disabled; re-run once enabled, it moves them', async () => {
    const alias = 'rot-kms';
    assert.equal((await c().post(`${E}/envelope/${enc(ROT_OLD)}/dek`, { id: 'rot-old' })).status, 201);
    assert.equal((await c().post(`${E}/dek/alias`, { dek_id: 'rot-old', alias })).status, 201);
    const oldValues = await createSecrets('rot-old', 15, alias);
    assert.equal((await c().post(`${E}/envelope`, { type: 'local', file_name: 'rot-current.key' })).status, 201);
    assert.equal((await c().post(`${E}/envelope/rot-current.key/dek`, { id: 'rot-current' })).status, 201);
    assert.equal((await c().put(`${E}/dek/alias/${alias}`, { new_dek_id: 'rot-current' })).status, 200);
    const newValues = await createSecrets('rot-new', 5, alias);
    const oldRows = await testDb()('secrets').where({ dek_id: 'rot-old' }).orderBy('id');
    await setKey(ROT_OLD, false);
    try {
      await dropCaches();
      const started = await c().post(`${E}/dek/alias/${alias}/rotate`);
      assert.equal(started.status, 202, started.text);
      const done = await ended(started.body.id);
      assert.equal(done.status, 'completed', JSON.stringify(done));
      assert.deepEqual([done.total, done.done, done.failed], [20, 5, 15]);
      assert.deepEqual(done.errors.map((e: { id: string }) => e.id).sort(), oldRows.map((r) => r.id).sort());
      for (const e of done.errors) assert.equal(e.message, `secret does not decrypt with DEK 'rot-old': ${disabled('Decrypt', ROT_OLD)}`);
      assert.equal(await aliasDek(alias), done.params.new_dek_id);
      assert.deepEqual(await testDb()('secrets').where({ dek_id: 'rot-old' }).orderBy('id'), oldRows, 'left as they were');
      await triedOnce(started.body.id);
    } finally {
      await setKey(ROT_OLD, true);
    }
    const again = await c().post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(again.status, 202, again.text);
    const done = await ended(again.body.id);
    assert.deepEqual([done.status, done.total, done.done, done.failed], ['completed', 20, 20, 0], JSON.stringify(done));
    assert.equal((await testDb()('secrets').where({ dek_alias: alias }).whereNot({ dek_id: done.params.new_dek_id })).length, 0);
    await dropCaches();
    const all = await decrypted();
    for (const [k, v] of [...oldValues, ...newValues]) assert.equal(all.get(k), v, k);
  });

  it('an alias rotation whose new DEK\'s KMS key is disabled fails naming it: at its start making no DEK, mid-walk leaving the alias where it was; re-run once enabled, it completes', async () => {
    const alias = 'rot-off';
    assert.equal((await c().post(`${E}/envelope/${enc(ROT_NEW)}/dek`, { id: 'rot-off-old' })).status, 201);
    assert.equal((await c().post(`${E}/dek/alias`, { dek_id: 'rot-off-old', alias })).status, 201);
    const values = await createSecrets('rot-off', 60, alias);
    const deks = async () => (await testDb()('deks').where({ envelope_key_id: ROT_NEW })).length;
    const deksBefore = await deks();

    await setKey(ROT_NEW, false);
    try {
      const atStart = await c().post(`${E}/dek/alias/${alias}/rotate`);
      assert.equal(atStart.status, 202, atStart.text);
      const failed = await ended(atStart.body.id);
      assert.equal(failed.status, 'failed', JSON.stringify(failed));
      assert.deepEqual(failed.errors, [{ id: atStart.body.id, message: disabled('GenerateDataKey', ROT_NEW) }]);
      assert.deepEqual([failed.done, failed.failed, failed.params.prepared_dek_id], [0, 0, undefined]);
      await triedOnce(atStart.body.id);
      assert.equal(await deks(), deksBefore, 'no DEK made');
    } finally {
      await setKey(ROT_NEW, true);
    }

    const midWalk = await c().post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(midWalk.status, 202, midWalk.text);
    // The next batch checks its new DEK opens (a Decrypt), answered once the key is disabled.
    const failed = await endedAfterNextBatch(midWalk.body.id, 10, 'Decrypt', { disable: ROT_NEW });
    assert.equal(failed.status, 'failed', JSON.stringify(failed));
    assert.deepEqual(failed.errors, [{ id: midWalk.body.id, message: disabled('Decrypt', ROT_NEW) }]);
    assert.ok(failed.done >= 10 && failed.done < values.size && failed.failed === 0, JSON.stringify([failed.done, failed.failed]));
    assert.equal(failed.total, values.size, 'total = done + the secrets it had still to move');
    await triedOnce(midWalk.body.id);
    assert.equal(await aliasDek(alias), 'rot-off-old');
    assert.equal((await testDb()('secrets').where({ dek_alias: alias, dek_id: failed.params.new_dek_id })).length, failed.done, 'the secrets moved stay moved');

    const again = await c().post(`${E}/dek/alias/${alias}/rotate`);
    assert.equal(again.status, 202, again.text);
    const done = await ended(again.body.id);
    assert.deepEqual([done.status, done.total, done.done, done.failed], ['completed', values.size, values.size, 0], JSON.stringify(done));
    assert.equal(await aliasDek(alias), done.params.new_dek_id);
    await dropCaches();
    const all = await decrypted();
    for (const [k, v] of values) assert.equal(all.get(k), v, k);
  });
});

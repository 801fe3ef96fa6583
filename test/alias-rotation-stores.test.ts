import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, startStack, startWorker, testDb, textMessage, waitFor, type Client, type Stack, withQueue } from './helpers/stack.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';

const E = '/api/encryption/v1';
const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const CONFIGS = 7; // push configs with secrets, over several rotation batches
const CREDENTIALS = 4;

describe('alias rotation: bridge credentials and push notification secrets are re-encrypted too', () => {
  let stack: Stack;
  let c: Client;
  let upstream: FakeProviders;
  const stripeKeys = new Map<string, string>(); // provider instance id -> raw API key
  const tasks: { id: string; token: string; credentials: string }[] = [];

  const setStatus = async (id: string, status: string) => {
    const r = await c.put(`/api/task/v1/${id}`, { status, ...(status === 'completed' ? { message: textMessage('done', 'agent') } : {}) });
    assert.equal(r.status, 200, r.text);
  };
  const rpc = async (method: string, params: unknown) => {
    const r = await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method, params });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.error, undefined, JSON.stringify(r.body.error));
    return r.body.result;
  };
  const hooksFor = (taskId: string) => upstream.seen.filter((s) => s.url === `/hook/${taskId}`);

  before(async () => {
    await resetDb();
    upstream = await startFakeProviders();
    // Small batches with a pause, so a worker can be killed in the middle of a pass.
    stack = await startStack({ STRIPE_API_BASE_URL: upstream.url, BRIDGE_ALLOW_PRIVATE: 'true', PUSH_ALLOW_PRIVATE: 'true', ALIAS_ROTATION_BATCH: '3', ALIAS_ROTATION_PAUSE_MS: '100' });
    c = stack.client;
    for (let i = 0; i < CREDENTIALS; i++) {
      const key = `sk_test_${randomUUID().replace(/-/g, '')}`;
      const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: key } });
      assert.equal(cred.status, 201, cred.text);
      const id = `stripe-${i}`;
      assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: id, display_name: 'Stripe', resource_server_credential_id: cred.body.id })).status, 201);
      assert.equal((await c.post(`${B}/provider/${id}/function/stripe_process_refund/enable`, {})).status, 201);
      stripeKeys.set(id, key);
    }
    // Tasks no agent runs (their first message is an agent's): the test drives their status.
    for (let i = 0; i < CONFIGS + 1; i++) {
      const created = await c.post('/api/task/v1', { message: textMessage('driven by the test', 'agent') });
      assert.equal(created.status, 201);
      const id = created.body.task.id;
      const token = `tok-${randomUUID()}`;
      const credentials = `cred-${randomUUID()}`;
      // The last config has no secrets: nothing of it is encrypted, so nothing to rotate.
      const config = i < CONFIGS ? { url: `${upstream.url}/hook/${id}`, token, authentication: { schemes: ['Bearer'], credentials } } : { url: `${upstream.url}/hook/${id}` };
      await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: config });
      if (i < CONFIGS) tasks.push({ id, token, credentials });
    }
    for (const t of tasks) await setStatus(t.id, 'working');
    await waitFor(async () => tasks.every((t) => hooksFor(t.id).length === 1), 'the first notification of every task');
  });
  after(async () => {
    await stack?.stop();
    upstream?.close();
  });

  it('moves every credential and push config of the alias to the new DEK, counted in the job', async () => {
    const db = testDb();
    const oldDek = (await db('dek_aliases').where({ alias: 'default' }).first()).dek_id;
    const before = {
      creds: new Map((await db('bridge_credentials').select('id', 'value', 'dek_id')).map((r) => [r.id, r])),
      configs: new Map((await db('push_configs').whereNotNull('encrypted_secrets').select('task_id', 'encrypted_secrets', 'secrets_dek_id')).map((r) => [r.task_id, r])),
    };
    assert.equal(before.creds.size, CREDENTIALS);
    assert.equal(before.configs.size, CONFIGS);
    assert.ok([...before.creds.values(), ...before.configs.values()].every((r) => (r.dek_id ?? r.secrets_dek_id) === oldDek));

    const started = await c.post(`${E}/dek/alias/default/rotate`);
    assert.equal(started.status, 202, started.text);
    const job = await waitFor(async () => {
      const j = (await c.get(`${E}/job/${started.body.id}`)).body;
      return ['completed', 'failed'].includes(j.status) && j;
    }, 'the rotation to finish', 60000, 100);
    assert.equal(job.status, 'completed', JSON.stringify(job));
    assert.deepEqual([job.total, job.done, job.failed], [CREDENTIALS + CONFIGS, CREDENTIALS + CONFIGS, 0]);

    const newDek = (await db('dek_aliases').where({ alias: 'default' }).first()).dek_id;
    assert.notEqual(newDek, oldDek);
    for (const r of await db('bridge_credentials').select('id', 'value', 'dek_id')) {
      assert.equal(r.dek_id, newDek);
      assert.notEqual(r.value.api_key, before.creds.get(r.id)!.value.api_key, 'the ciphertext changed');
      assert.ok(!String(r.value.api_key).startsWith('sk_test_'), 'still encrypted');
    }
    const configs = await db('push_configs').select('task_id', 'encrypted_secrets', 'secrets_dek_id');
    for (const r of configs) {
      if (!before.configs.has(r.task_id)) {
        assert.deepEqual([r.encrypted_secrets, r.secrets_dek_id], [null, null], 'a config without secrets stays without');
        continue;
      }
      assert.equal(r.secrets_dek_id, newDek);
      assert.notEqual(r.encrypted_secrets, before.configs.get(r.task_id)!.encrypted_secrets);
    }
  });

  it('still delivers every push notification with its token and credentials after the rotation', async () => {
    for (const t of tasks) await setStatus(t.id, 'completed');
    await waitFor(async () => tasks.every((t) => hooksFor(t.id).length === 2), 'the second notification of every task');
    for (const t of tasks) {
      const [first, second] = hooksFor(t.id);
      assert.equal(JSON.parse(second.body).status.state, 'completed');
      for (const seen of [first, second]) {
        assert.equal(seen.token, t.token);
        assert.equal(seen.authorization, `Bearer ${t.credentials}`);
      }
    }
  });

  it('still invokes bridge functions with the credentials decrypted after the rotation', async () => {
    for (const [id, key] of stripeKeys) {
      const r = await c.post(`${B}/provider/${id}/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_1' } });
      assert.equal(r.status, 200, r.text);
      const seen = upstream.seen.filter((s) => s.url === '/v1/refunds').at(-1)!;
      assert.equal(seen.authorization, `Bearer ${key}`);
    }
  });

  it('resumes after the worker is killed during the push-config pass; a config set during the rotation ends under the new DEK', async () => {
    // More configs, so the pass spans several batches.
    for (let i = 0; i < 12; i++) {
      const created = await c.post('/api/task/v1', { message: textMessage('more configs', 'agent') });
      await rpc('tasks/pushNotificationConfig/set', { taskId: created.body.task.id, pushNotificationConfig: { url: `${upstream.url}/hook/x`, token: `tok-${i}` } });
    }
    const db = testDb();
    const deksBefore = Number((await db('deks').count({ n: '*' }))[0].n);
    const started = await c.post(`${E}/dek/alias/default/rotate`);
    assert.equal(started.status, 202);
    const job = async () => (await c.get(`${E}/job/${started.body.id}`)).body;
    await waitFor(async () => { const j = await job(); return j.params.phase === 'push-configs' && j.status === 'running'; }, 'the push-config pass', 30000, 20);
    const late = await c.post('/api/task/v1', { message: textMessage('late config', 'agent') });
    await rpc('tasks/pushNotificationConfig/set', { taskId: late.body.task.id, pushNotificationConfig: { url: `${upstream.url}/hook/late`, token: 'tok-late' } });
    await stack.workers[0].kill('SIGKILL');
    const mid = await job();
    assert.equal(mid.status, 'running');
    stack.workers[0] = await startWorker(stack.env);

    const done = await waitFor(async () => { const j = await job(); return ['completed', 'failed'].includes(j.status) && j; }, 'the resumed rotation', 60000, 100);
    assert.equal(done.status, 'completed', JSON.stringify(done));
    assert.equal(done.failed, 0);
    assert.equal(done.done, done.total);
    assert.equal(Number((await db('deks').count({ n: '*' }))[0].n), deksBefore + 1, 'one new DEK, though the job ran twice');
    const newDek = done.params.new_dek_id;
    assert.equal((await db('dek_aliases').where({ alias: 'default' }).first()).dek_id, newDek);
    assert.deepEqual(await db('push_configs').whereNotNull('encrypted_secrets').whereNot({ secrets_dek_id: newDek }).select('task_id'), []);
    assert.deepEqual(await db('bridge_credentials').whereNot({ dek_id: newDek }).select('id'), []);
  });

  it('a second rotation re-encrypts them all again, with what was written since the first', async () => {
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'sk_test_after' } });
    assert.equal(cred.status, 201);
    const started = await c.post(`${E}/dek/alias/default/rotate`);
    assert.equal(started.status, 202);
    const job = await waitFor(async () => {
      const j = (await c.get(`${E}/job/${started.body.id}`)).body;
      return ['completed', 'failed'].includes(j.status) && j;
    }, 'the second rotation to finish', 60000, 100);
    assert.deepEqual([job.status, job.total, job.done, job.failed], ['completed', CREDENTIALS + 1 + CONFIGS + 13, CREDENTIALS + 1 + CONFIGS + 13, 0]);
  });

  it('a rotation run by two processors at once (a second queue job, as recovery adds when Redis lost the first) takes every phase: nothing skipped, counts exact', async () => {
    await withQueue(stack.env, 'key-jobs', async (queue) => {
      const db = testDb();
      const all = Number((await db('bridge_credentials').count({ n: '*' }))[0].n)
        + Number((await db('push_configs').whereNotNull('encrypted_secrets').count({ n: '*' }))[0].n);
      const started = await c.post(`${E}/dek/alias/default/rotate`);
      assert.equal(started.status, 202);
      await queue.add('rotate-alias', { job_id: started.body.id }, { jobId: `second-copy-${started.body.id}` });
      const job = await waitFor(async () => {
        const j = (await c.get(`${E}/job/${started.body.id}`)).body;
        return ['completed', 'failed'].includes(j.status) && j;
      }, 'the doubled rotation to finish', 60000, 100);
      assert.deepEqual([job.status, job.total, job.done, job.failed], ['completed', all, all, 0], JSON.stringify(job));
      // The second copy ran too (to its end), not dropped.
      await waitFor(async () => (await queue.getJob(`second-copy-${started.body.id}`))?.finishedOn, 'the second copy to finish', 10000);
      const newDek = job.params.new_dek_id;
      assert.deepEqual(await db('bridge_credentials').whereNot({ dek_id: newDek }).select('id'), [], 'every credential under the new DEK');
      assert.deepEqual(await db('push_configs').whereNotNull('encrypted_secrets').whereNot({ secrets_dek_id: newDek }).select('task_id'), [], 'every push config under the new DEK');
    });
  });
});

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createHash, randomUUID } from 'node:crypto';
import { assertError, testDb, readUntilClosed, unreadAnswer, useStack, waitFor } from './helpers/stack.ts';

describe('GET /api/a2a/v1/definition', () => {
  const stack = useStack({ AGENT_NAME: 'definition-test-agent' });

  it('exports the agent card, envelope keys with wrapped DEKs by alias, encrypted secrets and providers with encrypted credentials, never raw values', async () => {
    const raw = 'raw-secret-value-0b7d3c51';
    const created = await stack.client.post('/api/secret/v1', { key: 'billing/stripe', raw_value: raw });
    assert.equal(created.status, 201, created.text);
    const apiKey = 'sk_test_definition_5f1e2d';
    const stripe = '/api/bridge/v1/available-providers/stripe/available-credentials/api_key';
    const cred = await stack.client.post(`${stripe}/credential/resource-server`, { value: { api_key: apiKey }, metadata: { team: 'billing' } });
    assert.equal(cred.status, 201, cred.text);
    assert.equal((await stack.client.post(stripe, { provider_instance_id: 'stripe-1', display_name: 'Stripe', resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await stack.client.post('/api/bridge/v1/provider/stripe-1/function/stripe_process_refund/enable', {})).status, 201);

    const res = await stack.client.get('/api/a2a/v1/definition');
    assert.equal(res.status, 200, res.text);
    const def = res.body;
    assert.equal(def.format, 'taskbridge-definition/v1');
    assert.equal(def.agent_card.name, 'definition-test-agent');
    assert.equal(def.agent_card.protocolVersion, '0.3.0');
    assert.deepEqual(def.providers, [{
      id: 'stripe-1', display_name: 'Stripe', provider_controller_type_id: 'stripe', credential_controller_type_id: 'api_key', status: 'active',
      resource_server_credential: {
        id: cred.body.id, type_id: 'api_key', dek_alias: 'default', data_encryption_key_id: def.secrets[0].data_encryption_key_id,
        metadata: { team: 'billing' }, value: cred.body.value,
      },
      functions: ['stripe_process_refund'],
    }]);
    assert.ok(!res.text.includes(apiKey), 'the raw API key is not in the export');
    // Disabled by an admin, then its refresh failed (as a worker marks it): exported disabled, the
    // admin's choice, which applying the definition elsewhere keeps.
    assert.equal((await stack.client.patch('/api/bridge/v1/provider/stripe-1', { status: 'disabled' })).status, 200);
    await testDb()('provider_instances').where({ id: 'stripe-1' }).update({ status: 'refresh_failed' });
    assert.equal((await stack.client.get('/api/a2a/v1/definition')).body.providers[0].status, 'disabled');
    await testDb()('provider_instances').where({ id: 'stripe-1' }).update({ status: 'active', disabled_by_admin: false });

    const secret = def.secrets.find((s: any) => s.key === 'billing/stripe');
    assert.ok(secret, 'the secret is exported');
    assert.equal(secret.id, created.body.id);
    assert.equal(secret.encrypted_value, created.body.encrypted_secret);
    assert.equal(secret.dek_alias, 'default');

    // The bootstrapped local envelope key and its DEK aliased "default", which encrypted the secret.
    const withDefault = def.envelope_keys.find((k: any) => k.data_encryption_keys.some((d: any) => d.aliases.includes('default')));
    assert.ok(withDefault, 'an envelope key holds the DEK aliased default');
    assert.equal(withDefault.type, 'local');
    const dek = withDefault.data_encryption_keys.find((d: any) => d.aliases.includes('default'));
    assert.equal(dek.id, secret.data_encryption_key_id);
    assert.match(dek.encrypted_data_encryption_key, /^[A-Za-z0-9+/]+=*$/);
    // Wrapped: nonce + 32-byte key + tag, not the 32 raw bytes.
    assert.equal(Buffer.from(dek.encrypted_data_encryption_key, 'base64').length, 12 + 32 + 16);

    assert.ok(!res.text.includes(raw), 'the raw secret value is not in the export');
    const keyFile = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', withDefault.file_name));
    for (const form of [keyFile.toString('base64'), keyFile.toString('hex')]) assert.ok(!res.text.includes(form), 'the envelope key material is not in the export');
  });

  it('is one snapshot: a credential moved to a new DEK while the export reads is exported with the DEK it names', async () => {
    const db = testDb();
    const trx = await db.transaction();
    try {
      // Holds the export at its read of the providers, after its read of the DEKs ...
      await trx.raw('lock table function_instances in access exclusive mode');
      const pending = stack.client.get('/api/a2a/v1/definition');
      await waitFor(async () => (await db.raw(`select count(*)::int as n from pg_locks l join pg_class c on c.oid = l.relation
                                                where c.relname = 'function_instances' and not l.granted`)).rows[0].n > 0, 'the export to wait for function_instances');
      // ... while the credential moves to a new DEK, as an alias rotation moves it.
      const cred = await trx('bridge_credentials').first();
      const moved = `dek-${randomUUID()}`;
      await trx.raw(`insert into deks (id, envelope_key_id, encrypted_dek) select ?, envelope_key_id, encrypted_dek from deks where id = ?`, [moved, cred.dek_id]);
      await trx('bridge_credentials').where({ id: cred.id }).update({ dek_id: moved });
      await trx.commit();
      const def = (await pending).body;
      const deks = def.envelope_keys.flatMap((k: any) => k.data_encryption_keys.map((d: any) => d.id));
      const named = def.providers.flatMap((p: any) => [p.resource_server_credential, p.user_credential]).filter(Boolean).map((c: any) => c.data_encryption_key_id);
      assert.ok(named.length > 0);
      for (const id of [...named, ...def.secrets.map((s: any) => s.data_encryption_key_id)]) assert.ok(deks.includes(id), `DEK ${id} is exported (${deks.join(', ')})`);
      assert.ok(!named.includes(moved), 'the export is as of its start');
    } finally {
      if (!trx.isCompleted()) await trx.rollback();
    }
  });

  it('answers HEAD with the headers, its export ended at once (more HEADs than exports run at once)', async () => {
    for (let i = 0; i < 3; i++) {
      const res = await stack.client.request('HEAD', '/api/a2a/v1/definition');
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('content-type'), 'application/json; charset=utf-8');
    }
    assert.equal((await stack.client.get('/api/a2a/v1/definition')).status, 200);
  });

  it('needs an API key with the a2a scope', async () => {
    assert.equal((await stack.client.as(undefined).get('/api/a2a/v1/definition')).status, 401);
    const key = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read'] });
    assert.equal(key.status, 201, key.text);
    const denied = await stack.client.as(key.body.key).get('/api/a2a/v1/definition');
    assert.equal(denied.status, 403);
    assert.equal(denied.body.data.code, 'forbidden');
  });
});

const MiB = 1024 * 1024;
// 1 MiB of text for secret `i`, as Postgres writes repeat(md5(i::text), MiB / 32).
const bigValue = (i: number) => createHash('md5').update(String(i)).digest('hex').repeat(MiB / 32);

// Secrets of 1 MiB each, inserted as rows (the export reads them as they are, never decrypting).
async function insertBigSecrets(count: number): Promise<void> {
  const db = testDb();
  const { dek_id: dek } = await db('dek_aliases').where({ alias: 'default' }).first();
  await db.raw(`insert into secrets (id, key, encrypted_secret, dek_id, dek_alias)
                select gen_random_uuid(), 'big/' || lpad(i::text, 4, '0'), repeat(md5(i::text), ?), ?, 'default' from generate_series(1, ?) i`, [MiB / 32, dek, count]);
}

const unreadExport = (api: string) => unreadAnswer(api, 'GET', '/api/a2a/v1/definition');

// Exports waiting on their clients: a snapshot open between two reads of the secrets.
const waitingExports = async () => (await testDb().raw(`select count(*)::int as n from pg_stat_activity
                                                          where state = 'idle in transaction' and query like '%from "secrets"%'`)).rows[0].n as number;

describe('GET /api/a2a/v1/definition of an installation larger than the API heap', function () {
  this.timeout(300_000);
  const SECRETS = 240;
  const PROVIDERS = 60;
  // Read whole, these secrets alone would take more than this heap.
  const stack = useStack({ NODE_OPTIONS: '--max-old-space-size=96', RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
  const keys = Array.from({ length: SECRETS }, (_, i) => `big/${String(i + 1).padStart(4, '0')}`);
  const providerIds = Array.from({ length: PROVIDERS }, (_, i) => `stripe-${String(i + 1).padStart(3, '0')}`);
  let credentialId: string;

  before(async () => {
    await insertBigSecrets(SECRETS);
    // One credential of 1 MiB that every provider names: the export embeds it in each of them.
    const db = testDb();
    const { dek_id: dek } = await db('dek_aliases').where({ alias: 'default' }).first();
    credentialId = randomUUID();
    await db('bridge_credentials').insert({
      id: credentialId, kind: 'resource_server', provider_controller_type_id: 'stripe', type_id: 'api_key',
      value: { api_key: 'k'.repeat(MiB) }, metadata: { team: 'billing' }, dek_id: dek, dek_alias: 'default',
    });
    await db.raw(`insert into provider_instances (id, display_name, provider_controller_type_id, credential_controller_type_id, status, resource_server_credential_id)
                  select 'stripe-' || lpad(i::text, 3, '0'), 'Stripe ' || i, 'stripe', 'api_key', 'active', ? from generate_series(1, ?) i`, [credentialId, PROVIDERS]);
  });

  it('answers it whole, some 300 MiB with a 96 MiB heap: every secret, and every provider with the credential it names', async () => {
    const res = await stack.client.get('/api/a2a/v1/definition');
    assert.equal(res.status, 200, res.text.slice(0, 300));
    assert.equal(res.headers.get('content-type'), 'application/json; charset=utf-8');
    assert.ok(res.text.length > (SECRETS + PROVIDERS) * MiB, `${res.text.length} bytes`);
    const def = res.body;
    assert.equal(def.format, 'taskbridge-definition/v1');
    assert.ok(def.envelope_keys.some((k: any) => k.data_encryption_keys.some((d: any) => d.aliases.includes('default'))));
    assert.deepEqual(def.secrets.map((s: any) => s.key), keys);
    def.secrets.forEach((s: any, i: number) => assert.ok(s.encrypted_value === bigValue(i + 1), `the value of ${s.key}`));
    assert.deepEqual(def.providers.map((p: any) => p.id), providerIds);
    for (const p of def.providers) {
      const { value, ...rest } = p.resource_server_credential;
      assert.ok(value.api_key === 'k'.repeat(MiB), `the credential of ${p.id}`);
      assert.deepEqual(rest, { id: credentialId, type_id: 'api_key', dek_alias: 'default', data_encryption_key_id: def.secrets[0].data_encryption_key_id, metadata: { team: 'billing' } });
    }
    assert.equal(stack.api.child.exitCode, null, 'the API is still running');
  });

  it('clients that go away mid-export: two at once, a third refused (503), the API stays up, each snapshot and its connection are released, and the next export is whole', async () => {
    const clients = [unreadExport(stack.api.url), unreadExport(stack.api.url)];
    await waitFor(async () => (await waitingExports()) === 2, 'both exports to wait on their clients');
    const third = await stack.client.get('/api/a2a/v1/definition');
    assertError(third, 503, 'unavailable');
    assert.equal(third.headers.get('retry-after'), '5');
    for (const c of clients) c.destroy();
    await waitFor(async () => (await waitingExports()) === 0, 'the snapshots to end');
    const next = await stack.client.get('/api/a2a/v1/definition');
    assert.equal(next.status, 200, next.text.slice(0, 300));
    assert.deepEqual(next.body.secrets.map((s: any) => s.key), keys);
    assert.deepEqual(next.body.providers.map((p: any) => p.id), providerIds);
    assert.equal(stack.api.child.exitCode, null, 'the API is still running');
    assert.ok(!stack.api.logs.some((l) => l.includes('definition export failed')), 'a client going away is no failure');
  });

  it('an export whose database connection is lost mid-way: its client gets the answer cut short, the failure is logged without values, and the next export is whole', async () => {
    const client = unreadExport(stack.api.url);
    await waitFor(async () => (await waitingExports()) === 1, 'the export to wait on its client');
    await testDb().raw(`select pg_terminate_backend(pid) from pg_stat_activity where state = 'idle in transaction' and query like '%from "secrets"%'`);
    const received = await readUntilClosed(client);
    assert.match(received, /^HTTP\/1\.1 200 /);
    assert.ok(!received.endsWith('\r\n0\r\n\r\n'), 'the chunked answer is cut, not ended');
    const line = await waitFor(async () => stack.api.logs.find((l) => l.includes('definition export failed')), 'the failure to be logged');
    assert.equal(JSON.parse(line).level, 50);
    assert.ok(!line.includes(bigValue(1).slice(0, 32)) && !line.includes('big/'), line);
    const next = await stack.client.get('/api/a2a/v1/definition');
    assert.equal(next.status, 200, next.text.slice(0, 300));
    assert.deepEqual(next.body.secrets.map((s: any) => s.key), keys);
    assert.equal(stack.api.child.exitCode, null, 'the API is still running');
  });
});

describe('GET /api/a2a/v1/definition not read whole within DEFINITION_EXPORT_TIMEOUT_MS, one at a time (DEFINITION_EXPORTS_AT_ONCE=1)', function () {
  this.timeout(120_000);
  // API_WRITE_STALL_MS off: only the export's own bound cuts a client that reads nothing.
  const stack = useStack({ DEFINITION_EXPORT_TIMEOUT_MS: '2000', API_WRITE_STALL_MS: '0', DEFINITION_EXPORTS_AT_ONCE: '1' }, { workers: 0 });

  // 30 MiB: more than the loopback socket buffers hold.
  before(() => insertBigSecrets(30));

  it('is cut then: its snapshot and connection are released, the cut is logged, and the next export is whole; meanwhile a second is refused', async () => {
    const client = unreadExport(stack.api.url);
    try {
      await waitFor(async () => (await waitingExports()) === 1, 'the export to wait on its client');
      const second = await stack.client.get('/api/a2a/v1/definition');
      assertError(second, 503, 'unavailable');
      assert.match(second.body.message, /writing 1 definition exports, the most it writes at once \(DEFINITION_EXPORTS_AT_ONCE\)/);
      await waitFor(async () => (await waitingExports()) === 0, 'the export to be cut', 10_000);
      await waitFor(async () => stack.api.logs.some((l) => l.includes('definition export cut')), 'the cut to be logged');
    } finally {
      client.destroy();
    }
    const next = await stack.client.get('/api/a2a/v1/definition');
    assert.equal(next.status, 200, next.text.slice(0, 300));
    assert.equal(next.body.secrets.length, 30);
  });
});

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, startStack, startWorker, testDb, waitFor, type Client, type Stack, assertNotFound } from './helpers/stack.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const STRIPE_KEY = `sk_test_${randomUUID().replace(/-/g, '')}`;

describe('credential import: credentials from the definition export are re-applied', () => {
  let stack: Stack;
  let c: Client;
  let stripe: FakeProviders;
  const credentials = async () => Number((await testDb()('bridge_credentials').count({ n: '*' }))[0].n);

  before(async () => {
    await resetDb();
    stripe = await startFakeProviders();
    stack = await startStack({ STRIPE_API_BASE_URL: stripe.url, BRIDGE_ALLOW_PRIVATE: 'true' }, { workers: 0 });
    c = stack.client;
  });
  after(async () => {
    await stack?.stop();
    stripe?.close();
  });

  it('exports a provider, deletes it, imports its credential under the same id, and the recreated instance calls with the same key', async () => {
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, metadata: { team: 'billing' } });
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'pay', display_name: 'Pay', resource_server_credential_id: cred.body.id })).status, 201);
    const definition = (await c.get('/api/a2a/v1/definition')).body;
    const exported = definition.providers.find((p: { id: string }) => p.id === 'pay').resource_server_credential;
    assert.equal(exported.id, cred.body.id);
    assert.notEqual(exported.value.api_key, STRIPE_KEY);

    assert.equal((await c.delete(`${B}/provider/pay`)).status, 200);
    assert.equal(await credentials(), 0, 'the credential went with its instance');

    // The exported credential as it is.
    const imported = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, exported);
    assert.equal(imported.status, 201, imported.text);
    assert.equal(imported.body.id, exported.id);
    assert.deepEqual(imported.body.metadata, { team: 'billing' });
    assert.equal(typeof imported.body.value.api_key, 'string');
    assert.ok(!imported.text.includes(STRIPE_KEY));

    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'pay', display_name: 'Pay', resource_server_credential_id: exported.id })).status, 201);
    assert.equal((await c.post(`${B}/provider/pay/function/stripe_process_refund/enable`, {})).status, 201);
    const r = await c.post(`${B}/provider/pay/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_1' } });
    assert.equal(r.status, 200, r.text);
    assert.equal(stripe.seen.at(-1)!.authorization, `Bearer ${STRIPE_KEY}`);

    // The same id again is a conflict.
    const again = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, { id: exported.id, value: exported.value });
    assert.equal(again.status, 409);
    // Named as reads name it, in lower case, whatever case it was sent in.
    const shouted = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, { id: exported.id.toUpperCase(), value: exported.value });
    assert.equal(shouted.status, 409, shouted.text);
    assert.equal(shouted.body.message, `Credential '${exported.id}' already exists`);
    assert.equal(shouted.body.data.id, exported.id);
  });

  it('imports user credentials too (a new id when none is given)', async () => {
    const rs = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, { value: { client_id: 'c', client_secret: 's', redirect_uri: 'https://example.com/cb' } });
    const user = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`, { value: { access_token: 'at-123', refresh_token: 'rt-456', expiry_time: '2099-01-01T00:00:00Z' } });
    assert.equal((await c.post(avail('google_mail', 'oauth_auth_flow'), { provider_instance_id: 'mail', display_name: 'Mail', resource_server_credential_id: rs.body.id, user_credential_id: user.body.id })).status, 201);
    const exported = (await c.get('/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'mail').user_credential;
    const r = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential/import`, { value: exported.value });
    assert.equal(r.status, 201, r.text);
    assert.notEqual(r.body.id, exported.id);
    assert.equal(r.body.next_rotation_time, '2098-12-31T23:55:00.000Z');
  });

  it('imports what was exported before an alias rotation, with the DEK the export names', async () => {
    const exported = (await c.get('/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'pay').resource_server_credential;
    // The alias moves to a new DEK, as a rotation leaves it.
    const envelope = (await c.get('/api/encryption/v1/dek/alias/default')).body.envelope_encryption_key_id.id;
    const dek = await c.post(`/api/encryption/v1/envelope/${encodeURIComponent(envelope)}/dek`, {});
    assert.equal((await c.put('/api/encryption/v1/dek/alias/default', { new_dek_id: dek.body.id })).status, 200);
    const url = `${avail('stripe', 'api_key')}/credential/resource-server/import`;
    const { id: _id, data_encryption_key_id: oldDek, ...rest } = exported;
    const without = await c.post(url, rest);
    assert.equal(without.status, 400, 'the alias now names another DEK');
    assert.match(without.body.message, /value\.api_key does not decrypt with DEK/);
    const withDek = await c.post(url, { ...rest, data_encryption_key_id: oldDek });
    assert.equal(withDek.status, 201, withDek.text);
    const row = await testDb()('bridge_credentials').where({ id: withDek.body.id }).first();
    assert.equal(row.dek_id, dek.body.id, 'sealed anew under the DEK the alias names now');
  });

  it('needs scope secret:decrypt besides bridge:write: an import puts a ciphertext to use', async () => {
    const exported = (await c.get('/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'pay').resource_server_credential;
    const { id: _id, ...body } = exported;
    const url = `${avail('stripe', 'api_key')}/credential/resource-server/import`;
    const writer = (await c.post('/api/auth/v1/api-key', { name: 'writer', scopes: ['bridge:write'] })).body.key;
    const refused = await c.as(writer).post(url, body);
    assert.equal(refused.status, 403);
    assert.match(refused.body.message, /secret:decrypt/);
    const both = (await c.post('/api/auth/v1/api-key', { name: 'importer', scopes: ['bridge:write', 'secret:decrypt'] })).body.key;
    assert.equal((await c.as(both).post(url, body)).status, 201);
  });

  it("a credential's exported ciphertext does not import as a secret, so a key that decrypts secrets still cannot read a credential", async () => {
    const exported = (await c.get('/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'pay').resource_server_credential;
    const smuggle = await c.post('/api/secret/v1/import', { key: 'smuggled', encrypted_value: exported.value.api_key, dek_alias: 'default', data_encryption_key_id: exported.data_encryption_key_id });
    assert.equal(smuggle.status, 400, smuggle.text);
    assert.match(smuggle.body.message, /encrypted_value does not decrypt with DEK/);
    assert.equal((await c.get('/api/secret/v1/key/smuggled')).status, 404);
    const listed = await c.get('/api/secret/v1/list-decrypted?page_size=1000');
    assert.ok(!listed.text.includes(STRIPE_KEY));
  });

  it("a secret's ciphertext does not import as a credential member: refused naming the member, nothing stored", async () => {
    const secretValue = `sk_test_${randomUUID().replace(/-/g, '')}`;
    const created = await c.post('/api/secret/v1', { key: 'not-a-credential', raw_value: secretValue, dek_alias: 'default' });
    assert.equal(created.status, 201, created.text);
    // Read as a client with secret:read reads it: its stored ciphertext, under the DEK its alias names.
    const reader = (await c.post('/api/auth/v1/api-key', { name: 'secret-reader', scopes: ['secret:read'] })).body.key;
    const secret = (await c.as(reader).get(`/api/secret/v1/${created.body.id}`)).body;
    const importer = (await c.post('/api/auth/v1/api-key', { name: 'smuggler', scopes: ['bridge:write', 'secret:decrypt'] })).body.key;
    const before = await credentials();
    const dek = (await c.get('/api/encryption/v1/dek/alias/default')).body.id;
    for (const body of [
      { value: { api_key: secret.encrypted_secret }, dek_alias: secret.dek_alias },
      { value: { api_key: secret.encrypted_secret }, data_encryption_key_id: dek },
    ]) {
      const r = await c.as(importer).post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, body);
      assert.equal(r.status, 400, r.text);
      assert.match(r.body.message, /^value\.api_key is sealed without the associated data 'taskbridge:credential:api_key' of a credential member, as a secret's value is: not imported/);
      assert.deepEqual(r.body.data.errors.map((e: { path: string }) => e.path), ['body.value.api_key']);
      assert.ok(!r.text.includes(secretValue));
    }
    assert.equal(await credentials(), before);
  });

  it('a credential stored before purposes were bound still works, and an alias rotation seals it for its purpose', async () => {
    const legacyKey = `sk_test_${randomUUID().replace(/-/g, '')}`;
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'sk_test_placeholder' } });
    assert.equal(cred.status, 201, cred.text);
    // As such a row was written: the member sealed under the same DEK without associated data (as a secret's value is).
    assert.equal((await c.post('/api/secret/v1', { key: 'legacy-sealing', raw_value: legacyKey })).status, 201);
    const sealedPlain = (await c.get('/api/a2a/v1/definition')).body.secrets.find((x: { key: string }) => x.key === 'legacy-sealing');
    const row = await testDb()('bridge_credentials').where({ id: cred.body.id }).first();
    assert.equal(sealedPlain.data_encryption_key_id, row.dek_id);
    await testDb()('bridge_credentials').where({ id: cred.body.id }).update({ value: { ...row.value, api_key: sealedPlain.encrypted_value } });

    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'legacy', display_name: 'Legacy', resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await c.post(`${B}/provider/legacy/function/stripe_process_refund/enable`, {})).status, 201);
    const invoke = () => c.post(`${B}/provider/legacy/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_legacy' } });
    assert.equal((await invoke()).status, 200);
    assert.equal(stripe.seen.at(-1)!.authorization, `Bearer ${legacyKey}`);
    // Its export carries the member as stored, sealed for no purpose: refused, as a secret's ciphertext is.
    const importUrl = `${avail('stripe', 'api_key')}/credential/resource-server/import`;
    const exportedLegacy = async () => {
      const { id: _id, ...body } = (await c.get('/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'legacy').resource_server_credential;
      return body;
    };
    const count = await credentials();
    const refused = await c.post(importUrl, await exportedLegacy());
    assert.equal(refused.status, 400, refused.text);
    assert.match(refused.body.message, /^value\.api_key is sealed without the associated data .*rotated or it is written again/);
    assert.equal(await credentials(), count);

    const worker = await startWorker(stack.env);
    try {
      const job = await c.post('/api/encryption/v1/dek/alias/default/rotate', {});
      assert.equal(job.status, 202, job.text);
      await waitFor(async () => (await c.get(`/api/encryption/v1/job/${job.body.id}`)).body.status === 'completed', 'the rotation');
    } finally {
      await worker.stop();
    }
    const rotated = await testDb()('bridge_credentials').where({ id: cred.body.id }).first();
    assert.notEqual(rotated.dek_id, row.dek_id);
    const smuggle = await c.post('/api/secret/v1/import', { key: 'smuggled-rotated', encrypted_value: rotated.value.api_key, dek_alias: 'default', data_encryption_key_id: rotated.dek_id });
    assert.equal(smuggle.status, 400, smuggle.text);
    assert.match(smuggle.body.message, /encrypted_value does not decrypt with DEK/);
    assert.equal((await invoke()).status, 200);
    assert.equal(stripe.seen.at(-1)!.authorization, `Bearer ${legacyKey}`);
    // Rotated, it exports sealed for its purpose, and imports.
    const imported = await c.post(importUrl, await exportedLegacy());
    assert.equal(imported.status, 201, imported.text);
  });

  it('refuses values that do not decrypt, fail the schema, or name an unknown alias, storing nothing', async () => {
    const exported = (await c.get('/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'pay').resource_server_credential;
    const sealed = exported.value.api_key as string;
    const dek = exported.data_encryption_key_id as string;
    const tampered = `${sealed.slice(0, -6)}AAAAAA`;
    const url = `${avail('stripe', 'api_key')}/credential/resource-server/import`;
    const before = await credentials();
    const cases: [unknown, number, RegExp][] = [
      [{ value: { api_key: tampered }, data_encryption_key_id: dek }, 400, /value\.api_key does not decrypt with DEK '/],
      [{ value: { api_key: STRIPE_KEY }, data_encryption_key_id: dek }, 400, /value\.api_key does not decrypt/],
      [{ value: {}, data_encryption_key_id: dek }, 400, /body\.value\.api_key is required/],
      [{ value: { api_key: { a: 1 } }, data_encryption_key_id: dek }, 400, /^body\.value\.api_key must be a string \(its ciphertext, as exported\)$/],
      [{ value: { api_key: sealed, extra: 1 }, data_encryption_key_id: dek }, 400, /body\.value\.extra is not an allowed member/],
      [{ value: { api_key: sealed }, dek_alias: 'nope' }, 404, /dek_alias 'nope' not found/],
      [{ value: { api_key: sealed }, id: 'not-a-uuid' }, 400, /body\.id/],
      [{ value: { api_key: sealed }, type_id: 'oauth_auth_flow', data_encryption_key_id: dek }, 400, /body\.type_id 'oauth_auth_flow' is not the credential controller 'api_key'/],
      [{ value: { api_key: sealed }, data_encryption_key_id: 'no-such-dek' }, 404, /dek 'no-such-dek' not found/],
    ];
    for (const [body, status, pattern] of cases) {
      const r = await c.post(url, body);
      assert.equal(r.status, status, `${JSON.stringify(body)}: ${r.text}`);
      assert.match(r.body.message, pattern);
      assert.ok(!r.text.includes(STRIPE_KEY));
    }
    // A nullable member is worded once, as its value's rule "or null".
    const badTime = await c.post(url, { value: { api_key: sealed }, data_encryption_key_id: dek, next_rotation_time: 'tomorrow' });
    assert.equal(badTime.status, 400, badTime.text);
    assert.deepEqual(badTime.body.data.errors, [{ path: 'body.next_rotation_time', message: 'must be an RFC 3339 date-time or null' }]);
    // Unknown controllers are named by fixed snake_case data.resource values.
    for (const [where, resource, id] of [[avail('nope', 'api_key'), 'provider_controller', 'nope'], [avail('stripe', 'oauth_auth_flow'), 'credential_controller', 'oauth_auth_flow']]) {
      assertNotFound(await c.post(`${where}/credential/resource-server/import`, { value: { api_key: sealed }, data_encryption_key_id: dek }), resource, id);
    }
    const reader = (await c.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['bridge:read'] })).body.key;
    assert.equal((await c.as(reader).post(url, { value: { api_key: sealed } })).status, 403);
    assert.equal(await credentials(), before);
  });
});

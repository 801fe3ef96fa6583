import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { resetDb, startStack, type Stack } from './helpers/stack.ts';

describe('GET /api/a2a/v1/definition', () => {
  let stack: Stack;
  before(async () => {
    await resetDb();
    stack = await startStack({ AGENT_NAME: 'definition-test-agent' });
  });
  after(async () => stack?.stop());

  it('exports the agent card, envelope keys with wrapped DEKs by alias and encrypted secrets, never raw values', async () => {
    const raw = 'raw-secret-value-0b7d3c51';
    const created = await stack.client.post('/api/secret/v1', { key: 'billing/stripe', raw_value: raw });
    assert.equal(created.status, 201, created.text);

    const res = await stack.client.get('/api/a2a/v1/definition');
    assert.equal(res.status, 200, res.text);
    const def = res.body;
    assert.equal(def.format, 'taskbridge-definition/v1');
    assert.equal(def.agent_card.name, 'definition-test-agent');
    assert.equal(def.agent_card.protocolVersion, '0.3.0');
    assert.deepEqual(def.providers, []);

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

  it('needs an API key with the a2a scope', async () => {
    assert.equal((await stack.client.as(undefined).get('/api/a2a/v1/definition')).status, 401);
    const key = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read'] });
    assert.equal(key.status, 201, key.text);
    const denied = await stack.client.as(key.body.key).get('/api/a2a/v1/definition');
    assert.equal(denied.status, 403);
    assert.equal(denied.body.data.code, 'forbidden');
  });
});

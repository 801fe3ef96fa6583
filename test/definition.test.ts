import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { testDb, useStack, waitFor } from './helpers/stack.ts';

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

  it('needs an API key with the a2a scope', async () => {
    assert.equal((await stack.client.as(undefined).get('/api/a2a/v1/definition')).status, 401);
    const key = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read'] });
    assert.equal(key.status, 201, key.text);
    const denied = await stack.client.as(key.body.key).get('/api/a2a/v1/definition');
    assert.equal(denied.status, 403);
    assert.equal(denied.body.data.code, 'forbidden');
  });
});

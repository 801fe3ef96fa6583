import assert from 'node:assert/strict';
import fs from 'node:fs';
import { once } from 'node:events';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { CancelKeyDeletionCommand, DisableKeyCommand, EnableKeyCommand, KMSClient, ScheduleKeyDeletionCommand } from '@aws-sdk/client-kms';
import { Client, requestLogsThrough, resetDb, startApi, startStack, testDb, testEnv, useProcessEnv, waitFor, withQueue, type Stack, type Response, assertError, assertNotFound } from './helpers/stack.ts';
import { startKmsServer, type KmsServer } from './helpers/kms-server.ts';
import { openByHand, sealByHand } from './helpers/aes-gcm-by-hand.ts';
import { kmsWrapper } from '../domain/crypto/envelope-keys.ts';
import { invalidateKeyring } from '../domain/keyring.ts';
import { loadConfig } from '../domain/config.ts';
import { createServices } from '../domain/services.ts';

const E = '/api/encryption/v1';
const ARN = 'arn:aws:kms:eu-west-1:111122223333:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';
// A key a test disables, schedules for deletion and deletes (ARN stays usable for the others).
const DOOMED_ARN = 'arn:aws:kms:eu-west-1:111122223333:key/0f1e2d3c-4b5a-6978-8796-00000000d00d';
const enc = encodeURIComponent;

describe('encryption API: envelope keys, DEKs, aliases, migration and jobs', () => {
  let stack: Stack;
  let kms: KmsServer;
  let keysDir: string;
  const kek = (name: string) => fs.readFileSync(path.join(keysDir, name));

  useProcessEnv({ AWS_ACCESS_KEY_ID: 'AKIDLOCALTEST', AWS_SECRET_ACCESS_KEY: 'local-test-secret' });
  before(async () => {
    await resetDb();
    kms = await startKmsServer([ARN, DOOMED_ARN]);
    stack = await startStack({ AWS_KMS_ENDPOINT: kms.url, AWS_ACCESS_KEY_ID: 'AKIDLOCALTEST', AWS_SECRET_ACCESS_KEY: 'local-test-secret' });
    keysDir = path.join(stack.env.DATA_DIR, 'keys');
  });
  after(async () => {
    await stack?.stop();
    await kms?.close();
  });

  it('bootstraps a local envelope key (file 0600) and a DEK aliased default', async () => {
    const r = await stack.client.get(`${E}/dek/alias/default`);
    assert.equal(r.status, 200);
    assert.equal(r.body.envelope_encryption_key_id.type, 'local');
    const file = path.join(keysDir, r.body.envelope_encryption_key_id.file_name);
    assert.equal(fs.statSync(file).mode & 0o777, 0o600);
    assert.equal(openByHand(fs.readFileSync(file), r.body.encrypted_data_encryption_key).length, 32);
  });

  it('creates, lists, gets and rejects bad envelope keys', async () => {
    const c = stack.client;
    const a = await c.post(`${E}/envelope`, { type: 'local', file_name: 'alpha.key' });
    assert.equal(a.status, 201);
    assert.deepEqual(Object.keys(a.body).sort(), ['created_at', 'file_name', 'id', 'type']);
    assert.equal(a.body.id, 'alpha.key');
    assert.equal(kek('alpha.key').length, 32);
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'alpha.key' })).status, 409);
    const racing = await Promise.all([1, 2, 3].map(() => c.post(`${E}/envelope`, { type: 'local', file_name: 'race.key' })));
    assert.deepEqual(racing.map((r) => r.status).sort(), [201, 409, 409]);
    assert.equal(kek('race.key').length, 32);
    for (const bad of ['../escape', '..', 'a/b', 'x\\y', '', '.']) {
      const r = await c.post(`${E}/envelope`, { type: 'local', file_name: bad });
      assert.equal(r.status, 400, bad);
      assert.equal(r.body.data.code, 'invalid_request');
    }
    assert.equal(fs.existsSync(path.join(keysDir, '..', 'escape')), false);
    fs.writeFileSync(path.join(keysDir, 'short.key'), randomBytes(31));
    const short = await c.post(`${E}/envelope`, { type: 'local', file_name: 'short.key' });
    assert.equal(short.status, 400);
    assert.match(short.body.message, /32-byte/);
    fs.writeFileSync(path.join(keysDir, 'restored.key'), randomBytes(32), { mode: 0o600 });
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'restored.key' })).status, 201);
    // A restored key others can read is adopted and made private.
    fs.writeFileSync(path.join(keysDir, 'open.key'), randomBytes(32));
    fs.chmodSync(path.join(keysDir, 'open.key'), 0o644);
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'open.key' })).status, 201);
    assert.equal(fs.statSync(path.join(keysDir, 'open.key')).mode & 0o777, 0o600);
    assert.equal((await c.post(`${E}/envelope`, { type: 'local' })).body.data.errors[0].path, 'body.file_name');
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'b.key', arn: ARN })).status, 400);
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'b.key', extra: 1 })).status, 400);
    assert.equal((await c.post(`${E}/envelope`, { type: 'pgp', file_name: 'b.key' })).status, 400);
    assert.equal(fs.existsSync(path.join(keysDir, 'b.key')), false);

    const k = await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN, region: 'eu-west-1' });
    assert.equal(k.status, 201);
    assert.deepEqual({ id: k.body.id, type: k.body.type, region: k.body.region }, { id: ARN, type: 'aws_kms', region: 'eu-west-1' });
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN, region: 'eu-west-1' })).status, 409);
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN, region: 'us-east-1' })).status, 400);
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: 'arn:aws:iam::111122223333:role/x', region: 'eu-west-1' })).status, 400);
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN })).status, 400);

    const list = await c.get(`${E}/envelope?page_size=2`);
    assert.equal(list.status, 200);
    assert.equal(list.body.items.length, 2);
    const rest = await c.get(`${E}/envelope?page_size=100&next_page_token=${list.body.next_page_token}`);
    assert.equal(rest.body.next_page_token, undefined);
    assert.deepEqual([...list.body.items, ...rest.body.items].map((e: any) => e.id).sort(), ['alpha.key', ARN, 'default-envelope.key', 'open.key', 'race.key', 'restored.key'].sort());
    assert.equal((await c.get(`${E}/envelope?next_page_token=bogus`)).status, 400);

    const one = await c.get(`${E}/envelope/${enc(ARN)}`);
    assert.equal(one.status, 200);
    assert.equal(one.body.dek_count, 0);
    assert.equal((await c.get(`${E}/envelope/nope.key`)).status, 404);
  });

  it('takes KMS ARNs of the real partitions only, none so long that the list cannot be paged past it', async () => {
    const c = stack.client;
    const region = `eu-${'a'.repeat(59)}-1`;
    const longest = `arn:aws-iso-b:kms:${region}:111122223333:alias/${'a'.repeat(250)}`;
    const huge = await c.post(`${E}/envelope`, { type: 'aws_kms', arn: `arn:aws-${'a'.repeat(1500)}:kms:eu-west-1:111122223333:key/1b2c3d4e`, region: 'eu-west-1' });
    assertError(huge, 400, 'invalid_request');
    assert.match(huge.body.message, /body\.arn must NOT have more than \d+ characters/);
    for (const [arn, r] of [[longest, region], ['arn:aws-eusc:kms:eusc-de-east-1:111122223333:key/1b2c3d4e', 'eusc-de-east-1']]) {
      assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn, region: r })).status, 201, arn);
    }
    const unknown = await c.post(`${E}/envelope`, { type: 'aws_kms', arn: 'arn:aws-mars:kms:eu-west-1:111122223333:key/1b2c3d4e', region: 'eu-west-1' });
    assertError(unknown, 400, 'invalid_request');
    assert.match(unknown.body.message, /is not a KMS key or alias ARN/);
    let token: string | undefined;
    const seen: string[] = [];
    do {
      const page: Response = await c.get(`${E}/envelope?page_size=1${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(page.status, 200, page.body.message);
      seen.push(...page.body.items.map((e: any) => e.id));
      token = page.body.next_page_token;
    } while (token);
    assert.ok(seen.includes(longest));
  });

  it('creates, imports and lists DEKs; a wrapped DEK must unwrap', async () => {
    const c = stack.client;
    const gen = await c.post(`${E}/envelope/alpha.key/dek`, {});
    assert.equal(gen.status, 201);
    assert.equal(gen.body.envelope_encryption_key_id.id, 'alpha.key');
    assert.equal(openByHand(kek('alpha.key'), gen.body.encrypted_data_encryption_key).length, 32);
    // Every member is optional, so the body may be left out.
    const bare = await c.post(`${E}/envelope/alpha.key/dek`);
    assert.equal(bare.status, 201, bare.text);
    assert.equal(openByHand(kek('alpha.key'), bare.body.encrypted_data_encryption_key).length, 32);

    const mine = randomBytes(32);
    const given = await c.post(`${E}/envelope/alpha.key/dek`, { id: 'given-dek', encrypted_dek: sealByHand(kek('alpha.key'), mine) });
    assert.equal(given.status, 201);
    assert.equal(given.body.id, 'given-dek');
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek`, { id: 'given-dek' })).status, 409);
    // A taken id is the answer whatever the key material: it is checked before the key is unwrapped.
    for (const [path, member] of [['dek', 'encrypted_dek'], ['dek/import', 'encrypted_data_encryption_key']]) {
      const taken = await c.post(`${E}/envelope/alpha.key/${path}`, { id: 'given-dek', [member]: sealByHand(randomBytes(32), mine) });
      assertError(taken, 409, 'conflict');
      assert.equal(taken.body.message, "DEK 'given-dek' already exists", taken.text);
    }
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek`, { encrypted_dek: sealByHand(randomBytes(32), mine) })).status, 400);
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek`, { encrypted_dek: 'not base64!' })).status, 400);
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek`, { encrypted_dek: sealByHand(kek('alpha.key'), randomBytes(16)) })).status, 400);
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek`, { id: 'bad id!' })).status, 400);
    assert.equal((await c.post(`${E}/envelope/nope.key/dek`, {})).status, 404);

    const imp = await c.post(`${E}/envelope/alpha.key/dek/import`, { id: 'imported-dek', encrypted_data_encryption_key: sealByHand(kek('alpha.key'), randomBytes(32)) });
    assert.equal(imp.status, 201);
    const notMine = await c.post(`${E}/envelope/alpha.key/dek/import`, { encrypted_data_encryption_key: sealByHand(kek('restored.key'), randomBytes(32)) });
    assert.equal(notMine.status, 400);
    assert.deepEqual(notMine.body.data.errors.map((e: { path: string }) => e.path), ['body.encrypted_data_encryption_key']);
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek/import`, {})).status, 400);
    assert.equal((await c.post(`${E}/envelope/nope.key/dek/import`, { encrypted_data_encryption_key: 'AAAA' })).status, 404);

    const viaKms = await c.post(`${E}/envelope/${enc(ARN)}/dek`, { id: 'kms-dek' });
    assert.equal(viaKms.status, 201);
    const w = kmsWrapper(ARN, 'eu-west-1', kms.url);
    assert.equal((await w.unwrap(viaKms.body.encrypted_data_encryption_key)).length, 32);
    assert.equal((await c.post(`${E}/envelope/${enc(ARN)}/dek/import`, { encrypted_data_encryption_key: Buffer.from('junk').toString('base64') })).status, 400);
    // Within our own bound (16,384 characters) but longer than KMS takes: the client's bad value, not KMS failing.
    const tooLong = await c.post(`${E}/envelope/${enc(ARN)}/dek/import`, { encrypted_data_encryption_key: randomBytes(7000).toString('base64') });
    assert.equal(tooLong.status, 400, tooLong.text);
    assert.deepEqual(tooLong.body.data.errors.map((e: { path: string }) => e.path), ['body.encrypted_data_encryption_key']);
    assert.match(tooLong.body.data.errors[0].message, /6144 bytes/);

    const page = await c.get(`${E}/envelope/alpha.key/dek?page_size=2`);
    assert.equal(page.status, 200);
    assert.equal(page.body.items.length, 2);
    assert.ok(page.body.next_page_token);
    for (const item of page.body.items) assert.deepEqual(Object.keys(item).sort(), ['created_at', 'envelope_encryption_key_id', 'id', 'updated_at']);
    const all = await c.get(`${E}/envelope/alpha.key/dek?page_size=100`);
    assert.deepEqual(all.body.items.map((d: any) => d.id).sort(), [gen.body.id, bare.body.id, 'given-dek', 'imported-dek'].sort());
    assert.equal((await c.get(`${E}/envelope/nope.key/dek`)).status, 404);
    assert.equal((await c.get(`${E}/envelope/alpha.key`)).body.dek_count, 4);
  });

  it('manages aliases: create, get by alias then id, update, delete', async () => {
    const c = stack.client;
    const created = await c.post(`${E}/dek/alias`, { dek_id: 'given-dek', alias: 'payments' });
    assert.equal(created.status, 201);
    assert.equal(created.body.data_encryption_key_id, 'given-dek');
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'imported-dek', alias: 'payments' })).status, 409);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'no-such-dek', alias: 'other' })).status, 404);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'given-dek', alias: 'has space' })).status, 400);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'given-dek' })).status, 400);

    assert.equal((await c.get(`${E}/dek/alias/payments`)).body.id, 'given-dek');
    const byId = await c.get(`${E}/dek/alias/imported-dek`);
    assert.equal(byId.status, 200);
    assert.equal(byId.body.envelope_encryption_key_id.id, 'alpha.key');
    // An alias named like a DEK id wins over the DEK id.
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'given-dek', alias: 'imported-dek' })).status, 201);
    assert.equal((await c.get(`${E}/dek/alias/imported-dek`)).body.id, 'given-dek');
    assert.equal((await c.get(`${E}/dek/alias/nothing`)).status, 404);

    const upd = await c.put(`${E}/dek/alias/payments`, { new_dek_id: 'kms-dek' });
    assert.equal(upd.status, 200);
    assert.equal(upd.body.data_encryption_key_id, 'kms-dek');
    assert.equal((await c.get(`${E}/dek/alias/payments`)).body.envelope_encryption_key_id.type, 'aws_kms');
    assert.equal((await c.put(`${E}/dek/alias/nothing`, { new_dek_id: 'kms-dek' })).status, 404);
    assert.equal((await c.put(`${E}/dek/alias/payments`, { new_dek_id: 'no-such-dek' })).status, 404);
    assert.equal((await c.put(`${E}/dek/alias/payments`, {})).status, 400);
    // The alias of the path is looked for first, as every route looks for its path's resource first.
    assertNotFound(await c.put(`${E}/dek/alias/nothing`, { new_dek_id: 'no-such-dek' }), 'dek_alias', 'nothing');
    assertNotFound(await c.put(`${E}/dek/alias/payments`, { new_dek_id: 'no-such-dek' }), 'dek', 'no-such-dek');
    // Pointing it where it already points changes nothing: answered as it is, updated_at kept.
    const again = await c.put(`${E}/dek/alias/payments`, { new_dek_id: 'kms-dek' });
    assert.equal(again.status, 200);
    assert.deepEqual(again.body, upd.body);
    assert.equal((await c.put(`${E}/dek/alias/payments`, { new_dek_id: 'given-dek' })).body.data_encryption_key_id, 'given-dek');
    const moved = await c.put(`${E}/dek/alias/payments`, { new_dek_id: 'kms-dek' });
    assert.ok(moved.body.updated_at > upd.body.updated_at, 'a real move stamps updated_at');

    assert.equal((await c.delete(`${E}/dek/alias/imported-dek`)).status, 200);
    assert.equal((await c.delete(`${E}/dek/alias/imported-dek`)).status, 404);
    assert.equal((await c.get(`${E}/dek/alias/imported-dek`)).body.id, 'imported-dek');
  });

  it('moves an alias once when the same move is sent many times at once: the rest change nothing, answering it as moved', async () => {
    const c = stack.client;
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    for (let round = 0; round < 3; round++) {
      const [from, to] = ['from', 'to'].map((n) => `repoint-${n}-${round}`);
      for (const id of [from, to]) assert.equal((await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, { id })).status, 201);
      assert.equal((await c.post(`${E}/dek/alias`, { alias: `repoint-${round}`, dek_id: from })).status, 201);
      const answers = await Promise.all(Array.from({ length: 20 }, () => c.put(`${E}/dek/alias/repoint-${round}`, { new_dek_id: to })));
      const now = (await c.get(`${E}/dek/alias/repoint-${round}`)).body;
      const row = await testDb()('dek_aliases').where({ alias: `repoint-${round}` }).first();
      // As one after the other: one move stamps updated_at, and every answer shows the alias as it now is.
      assert.deepEqual(answers.map((a) => [a.status, a.body.data_encryption_key_id, a.body.updated_at]), answers.map(() => [200, to, row.updated_at.toISOString()]), answers.map((a) => a.text).join('\n'));
      assert.equal(now.id, to);
    }
  });

  it('refuses (400, saying why) a new DEK id or alias that is "." or "..", which a URL cannot address, storing nothing', async () => {
    const c = stack.client;
    const why = 'must not be "." or ".." (a URL cannot address it)';
    const count = async (table: string) => Number((await testDb()(table).count({ n: '*' }))[0].n);
    const before = [await count('deks'), await count('dek_aliases')];
    for (const name of ['.', '..']) {
      // Before, 201: fetch sends GET .../dek/alias/.. as GET .../dek/ (404).
      const refused: [Response, string][] = [
        [await c.post(`${E}/envelope/alpha.key/dek`, { id: name }), 'body.id'],
        [await c.post(`${E}/envelope/alpha.key/dek/import`, { id: name, encrypted_data_encryption_key: sealByHand(kek('alpha.key'), randomBytes(32)) }), 'body.id'],
        [await c.post(`${E}/dek/alias`, { dek_id: 'given-dek', alias: name }), 'body.alias'],
      ];
      for (const [r, path] of refused) {
        assert.equal(r.status, 400, `${name}: ${r.text}`);
        assert.deepEqual(r.body.data.errors, [{ path, message: why }], name);
      }
    }
    assert.deepEqual([await count('deks'), await count('dek_aliases')], before);
    const dots = await c.post(`${E}/envelope/alpha.key/dek`, { id: '...' });
    assert.equal(dots.status, 201, dots.text);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: '...', alias: '.dots.' })).status, 201);
    assert.equal((await c.get(`${E}/dek/alias/.dots.`)).body.id, '...');
  });

  it('refuses to delete an alias while secrets use it', async () => {
    const c = stack.client;
    const s = await c.post('/api/secret/v1', { key: 'alias-user', raw_value: 'v', dek_alias: 'payments' });
    assert.equal(s.status, 201);
    const r = await c.delete(`${E}/dek/alias/payments`);
    assert.equal(r.status, 409);
    assert.equal(r.body.data.code, 'conflict');
    assert.equal((await c.get(`${E}/dek/alias/payments`)).status, 200);
  });

  it('refuses to delete the default alias, which push configs and secrets without dek_alias rely on', async () => {
    const c = stack.client;
    const r = await c.delete(`${E}/dek/alias/default`);
    assertError(r, 409, 'conflict');
    assert.match(r.body.message, /'default' cannot be deleted.*point it at another DEK/);
    assert.equal((await c.get(`${E}/dek/alias/default`)).status, 200);
  });

  it('migrates one DEK in place (local to local, local to KMS and back) with compare-and-set', async () => {
    const c = stack.client;
    const before = openByHand(kek('alpha.key'), (await c.get(`${E}/dek/alias/given-dek`)).body.encrypted_data_encryption_key);
    const m = await c.post(`${E}/envelope/alpha.key/dek/given-dek/migrate`, { to_envelope_encryption_key_id: 'restored.key' });
    assert.equal(m.status, 200);
    assert.deepEqual({ id: m.body.id, env: m.body.envelope_encryption_key_id }, { id: 'given-dek', env: 'restored.key' });
    const after = await c.get(`${E}/dek/alias/given-dek`);
    assert.deepEqual(openByHand(kek('restored.key'), after.body.encrypted_data_encryption_key), before);
    // The old envelope no longer holds it: a repeat is 404, never a second wrap.
    assert.equal((await c.post(`${E}/envelope/alpha.key/dek/given-dek/migrate`, { to_envelope_encryption_key_id: 'restored.key' })).status, 404);
    assert.equal((await c.post(`${E}/envelope/restored.key/dek/given-dek/migrate`, { to_envelope_encryption_key_id: 'restored.key' })).status, 400);
    assert.equal((await c.post(`${E}/envelope/restored.key/dek/given-dek/migrate`, { to_envelope_encryption_key_id: 'nope.key' })).status, 404);
    assert.equal((await c.post(`${E}/envelope/restored.key/dek/no-such/migrate`, { to_envelope_encryption_key_id: 'alpha.key' })).status, 404);
    assert.equal((await c.post(`${E}/envelope/restored.key/dek/given-dek/migrate`, {})).status, 400);

    const toKms = await c.post(`${E}/envelope/restored.key/dek/given-dek/migrate`, { to_envelope_encryption_key_id: ARN });
    assert.equal(toKms.status, 200);
    const w = kmsWrapper(ARN, 'eu-west-1', kms.url);
    assert.deepEqual(await w.unwrap((await c.get(`${E}/dek/alias/given-dek`)).body.encrypted_data_encryption_key), before);
    const back = await c.post(`${E}/envelope/${enc(ARN)}/dek/given-dek/migrate`, { to_envelope_encryption_key_id: 'alpha.key' });
    assert.equal(back.status, 200);
    assert.deepEqual(openByHand(kek('alpha.key'), (await c.get(`${E}/dek/alias/given-dek`)).body.encrypted_data_encryption_key), before);

    // Two concurrent migrations of one DEK: exactly one applies, the DEK stays valid.
    const race = await Promise.all(['restored.key', ARN].map((to) => c.post(`${E}/envelope/alpha.key/dek/given-dek/migrate`, { to_envelope_encryption_key_id: to })));
    const statuses = race.map((r) => r.status).sort();
    assert.equal(statuses[0], 200);
    assert.ok([404, 409].includes(statuses[1]), `loser answered ${statuses[1]}`);
    const final = (await c.get(`${E}/dek/alias/given-dek`)).body;
    const plain = final.envelope_encryption_key_id.id === ARN ? await w.unwrap(final.encrypted_data_encryption_key) : openByHand(kek('restored.key'), final.encrypted_data_encryption_key);
    assert.deepEqual(plain, before);
  });

  it('a DEK migration names what it did not find: the envelope key in its path, else the DEK under it, moving nothing', async () => {
    const c = stack.client;
    for (const name of ['nf-a.key', 'nf-b.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: name })).status, 201);
    const dek = await c.post(`${E}/envelope/nf-a.key/dek`, { id: 'nf-dek' });
    assert.equal(dek.status, 201);
    // Before, both answered "dek 'nf-dek' not found", a DEK that exists.
    assertNotFound(await c.post(`${E}/envelope/nf-gone.key/dek/nf-dek/migrate`, { to_envelope_encryption_key_id: 'nf-b.key' }), 'envelope_key', 'nf-gone.key');
    const elsewhere = await c.post(`${E}/envelope/nf-b.key/dek/nf-dek/migrate`, { to_envelope_encryption_key_id: 'nf-a.key' });
    assertNotFound(elsewhere, 'dek', 'nf-dek');
    assert.equal(elsewhere.body.message, "dek 'nf-dek' not found under envelope key 'nf-b.key'");
    const row = await testDb()('deks').where({ id: 'nf-dek' }).first();
    assert.deepEqual([row.envelope_key_id, row.encrypted_dek], ['nf-a.key', dek.body.encrypted_data_encryption_key]);
  });

  it('runs migrate-all as a job and reports it; deletes envelope keys only when unused', async () => {
    const c = stack.client;
    assert.equal((await c.delete(`${E}/envelope/alpha.key`)).status, 409);
    const plains = new Map<string, Buffer>();
    for (const d of (await c.get(`${E}/envelope/alpha.key/dek?page_size=100`)).body.items) {
      plains.set(d.id, openByHand(kek('alpha.key'), (await c.get(`${E}/dek/alias/${d.id}`)).body.encrypted_data_encryption_key));
    }
    assert.equal((await c.post(`${E}/envelope/alpha.key/migrate`, { to_envelope_encryption_key_id: 'alpha.key' })).status, 400);
    assert.equal((await c.post(`${E}/envelope/alpha.key/migrate`, { to_envelope_encryption_key_id: 'nope.key' })).status, 404);
    assert.equal((await c.post(`${E}/envelope/nope.key/migrate`, { to_envelope_encryption_key_id: 'alpha.key' })).status, 404);
    const started = await c.post(`${E}/envelope/alpha.key/migrate`, { to_envelope_encryption_key_id: 'restored.key' });
    assert.equal(started.status, 202);
    assert.equal(started.body.kind, 'migrate-deks');
    assert.equal(started.body.total, plains.size);
    assert.deepEqual(started.body.params, { from_envelope_encryption_key_id: 'alpha.key', to_envelope_encryption_key_id: 'restored.key' });
    let job: any;
    for (let i = 0; i < 400; i++) {
      job = (await c.get(`${E}/job/${started.body.id}`)).body;
      if (job.status === 'completed') break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(job.status, 'completed');
    assert.deepEqual({ total: job.total, done: job.done, failed: job.failed, errors: job.errors }, { total: plains.size, done: plains.size, failed: 0, errors: [] });
    assert.ok(job.started_at && job.finished_at);
    for (const [id, plain] of plains) {
      const d = (await c.get(`${E}/dek/alias/${id}`)).body;
      assert.equal(d.envelope_encryption_key_id.id, 'restored.key');
      assert.deepEqual(openByHand(kek('restored.key'), d.encrypted_data_encryption_key), plain);
    }
    assert.equal((await c.get(`${E}/job/00000000-0000-4000-8000-000000000000`)).status, 404);
    assert.equal((await c.get(`${E}/job/not-a-uuid`)).status, 400);

    assert.equal((await c.delete(`${E}/envelope/alpha.key`)).status, 200);
    assert.equal((await c.delete(`${E}/envelope/alpha.key`)).status, 404);
    assert.equal(fs.existsSync(path.join(keysDir, 'alpha.key')), true);
    const rows = await testDb()('envelope_keys').where({ id: 'alpha.key' });
    assert.equal(rows.length, 0);
  });

  it('migrate-all to a KMS key records DEKs that do not unwrap as per-DEK errors and finishes the rest', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'mixed.key' })).status, 201);
    const good = await Promise.all([1, 2, 3].map((i) => c.post(`${E}/envelope/mixed.key/dek`, { id: `mixed-${i}` })));
    const plains = good.map((g) => openByHand(kek('mixed.key'), g.body.encrypted_data_encryption_key));
    await testDb()('deks').insert({ id: 'mixed-corrupt', envelope_key_id: 'mixed.key', encrypted_dek: sealByHand(randomBytes(32), randomBytes(32)) });
    const started = await c.post(`${E}/envelope/mixed.key/migrate`, { to_envelope_encryption_key_id: ARN });
    assert.equal(started.status, 202);
    let job: any;
    for (let i = 0; i < 400 && job?.status !== 'completed'; i++) {
      await new Promise((r) => setTimeout(r, 50));
      job = (await c.get(`${E}/job/${started.body.id}`)).body;
    }
    assert.equal(job.status, 'completed');
    assert.deepEqual({ total: job.total, done: job.done, failed: job.failed }, { total: 4, done: 3, failed: 1 });
    assert.equal(job.errors.length, 1);
    assert.equal(job.errors[0].id, 'mixed-corrupt');
    assert.match(job.errors[0].message, /does not decrypt/);
    const w = kmsWrapper(ARN, 'eu-west-1', kms.url);
    for (const [i, plain] of plains.entries()) {
      const d = (await c.get(`${E}/dek/alias/mixed-${i + 1}`)).body;
      assert.equal(d.envelope_encryption_key_id.id, ARN);
      assert.deepEqual(await w.unwrap(d.encrypted_data_encryption_key), plain);
    }
    assert.equal((await c.get(`${E}/dek/alias/mixed-corrupt`)).body.envelope_encryption_key_id.id, 'mixed.key');
  });

  it('refuses (502) a migrate-all to a KMS key that cannot wrap, starting no job and moving nothing', async () => {
    const c = stack.client;
    const unknownArn = 'arn:aws:kms:eu-west-1:111122223333:key/00000000-0000-4000-8000-00000000dead';
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: unknownArn, region: 'eu-west-1' })).status, 201);
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'stay.key' })).status, 201);
    assert.equal((await c.post(`${E}/envelope/stay.key/dek`, { id: 'stay-dek' })).status, 201);
    const jobsBefore = Number((await testDb()('key_jobs').count({ n: '*' }))[0].n);
    const refused = await c.post(`${E}/envelope/stay.key/migrate`, { to_envelope_encryption_key_id: unknownArn });
    assertError(refused, 502, 'bad_gateway');
    assert.match(refused.body.message, /AWS KMS Encrypt failed: NotFoundException/);
    assert.equal(Number((await testDb()('key_jobs').count({ n: '*' }))[0].n), jobsBefore);
    assert.equal((await c.get(`${E}/dek/alias/stay-dek`)).body.envelope_encryption_key_id.id, 'stay.key');
  });

  it('fails a migrate-all job at once when the source key file is gone, leaving its DEKs untouched', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'lost.key' })).status, 201);
    const dek = await c.post(`${E}/envelope/lost.key/dek`, { id: 'lost-dek' });
    assert.equal(dek.status, 201);
    fs.rmSync(path.join(keysDir, 'lost.key'));
    const started = await c.post(`${E}/envelope/lost.key/migrate`, { to_envelope_encryption_key_id: 'restored.key' });
    assert.equal(started.status, 202);
    let job: any;
    for (let i = 0; i < 400 && !['failed', 'completed'].includes(job?.status); i++) {
      await new Promise((r) => setTimeout(r, 50));
      job = (await c.get(`${E}/job/${started.body.id}`)).body;
    }
    assert.equal(job.status, 'failed');
    assert.match(job.errors[0].message, /lost\.key.*cannot be read/);
    const row = await testDb()('deks').where({ id: 'lost-dek' }).first();
    assert.deepEqual({ env: row.envelope_key_id, wrapped: row.encrypted_dek }, { env: 'lost.key', wrapped: dek.body.encrypted_data_encryption_key });
    assert.equal(fs.existsSync(path.join(keysDir, 'lost.key')), false);
  });

  it('a cancel recorded while a batch to KMS is in flight ends the job when that batch fails, not at its retry minutes later', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'outage.key' })).status, 201);
    for (let i = 0; i < 3; i++) assert.equal((await c.post(`${E}/envelope/outage.key/dek`, { id: `outage-${i}` })).status, 201);
    let id!: string;
    let answer!: (error?: string) => void;
    await withQueue(stack.env, 'key-jobs', async (keyJobs) => {
      await keyJobs.pause();
      const started = await c.post(`${E}/envelope/outage.key/migrate`, { to_envelope_encryption_key_id: ARN });
      assert.equal(started.status, 202, started.text);
      id = started.body.id;
      answer = kms.hold('Encrypt');
      const calls = kms.calls.length;
      await keyJobs.resume();
      await waitFor(async () => kms.calls.length > calls, 'the batch to call KMS');
    });
    const requested = await c.post(`${E}/job/${id}/cancel`);
    assert.deepEqual([requested.status, requested.body.status], [202, 'running'], requested.text);
    // The key is disabled meanwhile: the batch fails, which would be retried (1 s, then up to minutes).
    answer('KMSInvalidStateException');
    const logs = () => stack.workers[0].logs.filter((l) => l.includes(id));
    const ended = await waitFor(async () => logs().find((l) => l.includes('DEK migration finished')), 'the worker to end the job', 5000, 20);
    assert.match(ended, /"status":"canceled"/);
    assert.ok(!logs().some((l) => l.includes('will retry') || l.includes('DEK migration failed')), logs().join('\n'));
    const job = (await c.get(`${E}/job/${id}`)).body;
    assert.deepEqual([job.status, job.done, job.failed], ['canceled', 0, 0], JSON.stringify(job));
    assert.equal((await testDb()('deks').where({ envelope_key_id: 'outage.key' })).length, 3, 'nothing moved');
    // Its queue job ended too, and the source is free for another migration at once.
    await waitFor(() => withQueue(stack.env, 'key-jobs', async (q) => (await q.getJobs(['delayed', 'waiting', 'active'])).every((j) => j?.data.job_id !== id)), 'the queue job to end');
    const next = await c.post(`${E}/envelope/outage.key/migrate`, { to_envelope_encryption_key_id: 'mixed.key' });
    assert.equal(next.status, 202, next.text);
    // Ended here: its end drops every cached DEK, which the next test must not meet.
    await waitFor(async () => (await c.get(`${E}/job/${next.body.id}`)).body.status === 'completed', 'the next migration to complete');
  });

  const invalidateFromAnotherProcess = async (dekId: string) => {
    const s = createServices(loadConfig({ ...stack.env, LOG_LEVEL: 'silent' }), 'cli');
    try {
      if (s.redis.status !== 'ready') await once(s.redis, 'ready');
      await invalidateKeyring(s, { dek_ids: [dekId] });
    } finally {
      await s.close();
    }
  };

  // Has the API cache the DEK aliased `default` (a write), then swaps its stored key behind the
  // service's back, so that only its cache still knows the old one; runs `use` with a probe that
  // writes under `default` and says whether the API used the DEK as stored now (its cache dropped).
  async function withSwappedDefaultDek(use: (ctx: { dekId: string; oldPlain: Buffer; usesStored(): Promise<boolean>; valueOf(key: string, plain: Buffer): Promise<string | undefined> }) => Promise<void>) {
    const c = stack.client;
    const probe = await c.post('/api/secret/v1', { key: 'cache-probe-1', raw_value: 'one', dek_alias: 'default' });
    assert.equal(probe.status, 201);
    const dekId = (await c.get(`${E}/dek/alias/default`)).body.id;
    const kekName = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    const oldRow = await testDb()('deks').where({ id: dekId }).first();
    const oldPlain = openByHand(kek(kekName), oldRow.encrypted_dek);
    const newPlain = randomBytes(32);
    await testDb()('deks').where({ id: dekId }).update({ encrypted_dek: sealByHand(kek(kekName), newPlain) });
    const valueOf = async (key: string, plain: Buffer) => {
      const row = await testDb()('secrets').where({ key }).first();
      try { return openByHand(plain, row.encrypted_secret).toString(); } catch { return undefined; }
    };
    const usesStored = async () => {
      const key = `cache-probe-${randomBytes(4).toString('hex')}`;
      assert.equal((await c.post('/api/secret/v1', { key, raw_value: 'three', dek_alias: 'default' })).status, 201);
      return (await valueOf(key, newPlain)) === 'three';
    };
    try {
      await use({ dekId, oldPlain, usesStored, valueOf });
    } finally {
      await testDb()('secrets').where('key', 'like', 'cache-probe-%').delete();
      await testDb()('deks').where({ id: dekId }).update({ encrypted_dek: oldRow.encrypted_dek });
      await invalidateFromAnotherProcess(dekId);
    }
  }

  it('drops a cached DEK in the API process when another process invalidates it', async function () {
    await withSwappedDefaultDek(async ({ dekId, oldPlain, usesStored, valueOf }) => {
      assert.equal((await stack.client.post('/api/secret/v1', { key: 'cache-probe-2', raw_value: 'two', dek_alias: 'default' })).status, 201);
      assert.equal(await valueOf('cache-probe-2', oldPlain), 'two', 'the API used its cached DEK');
      await invalidateFromAnotherProcess(dekId);
      await waitFor(usesStored, 'the API to drop its cached DEK', 10000, 100);
    });
  });

  it('drops the cached DEKs of every process when a migration fails, as when one completes or is canceled', async () => {
    const c = stack.client;
    await withSwappedDefaultDek(async ({ usesStored }) => {
      assert.equal(await usesStored(), false, 'the API used its cached DEK');
      // It fails at its first batch: its source key file is gone.
      assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'fail-drop.key' })).status, 201);
      assert.equal((await c.post(`${E}/envelope/fail-drop.key/dek`, { id: 'fail-drop-dek' })).status, 201);
      fs.rmSync(path.join(keysDir, 'fail-drop.key'));
      const started = await c.post(`${E}/envelope/fail-drop.key/migrate`, { to_envelope_encryption_key_id: 'mixed.key' });
      assert.equal(started.status, 202, started.text);
      const failed = await waitFor(async () => { const j = (await c.get(`${E}/job/${started.body.id}`)).body; return j.status !== 'queued' && j.status !== 'running' && j; }, 'the migration to end');
      assert.equal(failed.status, 'failed', JSON.stringify(failed));
      await waitFor(usesStored, 'the API to drop its cached DEK', 5000, 100);
    });
  });

  it('needs encryption:read to read and encryption:write to change', async () => {
    const c = stack.client;
    const key = await c.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['encryption:read'] });
    assert.equal(key.status, 201);
    const reader = c.as(key.body.key);
    assert.equal((await reader.get(`${E}/envelope`)).status, 200);
    assert.equal((await reader.get(`${E}/dek/alias/default`)).status, 200);
    assert.equal((await reader.post(`${E}/envelope`, { type: 'local', file_name: 'r.key' })).status, 403);
    assert.equal((await reader.post(`${E}/dek/alias`, { dek_id: 'kms-dek', alias: 'r' })).status, 403);
    assert.equal((await reader.delete(`${E}/envelope/restored.key`)).status, 403);
    assert.equal((await c.as('').get(`${E}/envelope`)).status, 401);
    assert.equal(fs.existsSync(path.join(keysDir, 'r.key')), false);
  });

  it('describes every encryption route in the OpenAPI document', async () => {
    const doc = (await stack.client.get('/api/openapi.json')).body;
    const paths = Object.keys(doc.paths).filter((p) => p.startsWith(E));
    for (const p of ['/envelope', '/envelope/{envelope_id}', '/envelope/{envelope_id}/dek', '/envelope/{envelope_id}/dek/import',
      '/envelope/{envelope_id}/dek/{dek_id}/migrate', '/envelope/{envelope_id}/migrate', '/job/{job_id}', '/dek/alias', '/dek/alias/{alias}']) {
      assert.ok(paths.includes(E + p), p);
    }
  });

  it('answers 400, not 500, for control characters in envelope ids and alias lookups', async () => {
    const c = stack.client;
    for (const [method, url] of [['GET', `${E}/envelope/%00`], ['DELETE', `${E}/envelope/%00`], ['GET', `${E}/envelope/a%00b/dek`], ['POST', `${E}/envelope/a%00b/dek`], ['POST', `${E}/envelope/%01/migrate`], ['GET', `${E}/dek/alias/%00`]] as const) {
      const r = await c.request(method, url, method === 'POST' ? {} : undefined);
      assert.equal(r.status, 400, `${method} ${url}: ${r.text}`);
      assert.equal(r.body.data.code, 'invalid_request');
    }
  });

  it('a DEK created while its envelope key is deleted: 201 and the delete 409, or 404 and the delete 200', async () => {
    const c = stack.client;
    for (let i = 0; i < 30; i++) {
      const name = `race-${i}.key`;
      assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: name })).status, 201);
      const [created, deleted] = await Promise.all([c.post(`${E}/envelope/${name}/dek`, {}), c.delete(`${E}/envelope/${name}`)]);
      const deks = await testDb()('deks').where({ envelope_key_id: name }).count({ n: '*' });
      if (created.status === 201) {
        assertError(deleted, 409, 'conflict');
        assert.equal(Number(deks[0].n), 1);
      } else {
        assert.deepEqual(created.body.data, { code: 'not_found', resource: 'envelope_key', id: name }, `round ${i}: ${created.status} ${created.text}`);
        assert.equal(deleted.status, 200, deleted.text);
        assert.equal(Number(deks[0].n), 0);
      }
    }
  });

  it('a DEK migrated to an envelope key being deleted: 200 and the delete 409, or 404 and the delete 200', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'move-src.key' })).status, 201);
    for (let i = 0; i < 30; i++) {
      const dek = await c.post(`${E}/envelope/move-src.key/dek`, {});
      const target = `move-to-${i}.key`;
      assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: target })).status, 201);
      const [moved, deleted] = await Promise.all([
        c.post(`${E}/envelope/move-src.key/dek/${dek.body.id}/migrate`, { to_envelope_encryption_key_id: target }),
        c.delete(`${E}/envelope/${target}`),
      ]);
      const row = await testDb()('deks').where({ id: dek.body.id }).first();
      if (moved.status === 200) {
        assertError(deleted, 409, 'conflict');
        assert.equal(row.envelope_key_id, target);
      } else {
        assert.deepEqual(moved.body.data, { code: 'not_found', resource: 'envelope_key', id: target }, `round ${i}: ${moved.status} ${moved.text}`);
        assert.equal(deleted.status, 200, deleted.text);
        assert.equal(row.envelope_key_id, 'move-src.key');
      }
    }
  });

  it('refuses (409) to delete an envelope key that a queued or running migration targets', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'target-only.key' })).status, 201);
    const [job] = await testDb()('key_jobs').insert({
      id: randomUUID(), kind: 'migrate-deks', status: 'queued', source_envelope_key_id: 'some-source.key',
      params: { from_envelope_encryption_key_id: 'some-source.key', to_envelope_encryption_key_id: 'target-only.key' },
    }).returning('id');
    const refused = await c.delete(`${E}/envelope/target-only.key`);
    assert.equal(refused.status, 409, refused.text);
    assert.match(refused.body.message, /target of a running DEK migration/);
    await testDb()('key_jobs').where({ id: job.id }).update({ status: 'completed' });
    assert.equal((await c.delete(`${E}/envelope/target-only.key`)).status, 200);
  });
  // Drops every cached DEK and key wrapper in the API process: deleting any envelope key does.
  const dropCaches = async (c: Client) => {
    const name = `drop-${randomUUID().slice(0, 8)}.key`;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: name })).status, 201);
    assert.equal((await c.delete(`${E}/envelope/${name}`)).status, 200);
  };

  it('unwraps a DEK once for a page of its values with a cold cache, not once per value (KMS calls)', async () => {
    const c = stack.client;
    // Registered by an earlier test of this file, or here when run alone.
    assert.ok([201, 409].includes((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN, region: 'eu-west-1' })).status));
    assert.equal((await c.post(`${E}/envelope/${enc(ARN)}/dek`, { id: 'kms-page-dek' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'kms-page-dek', alias: 'kms-page' })).status, 201);
    const ids = new Set<string>();
    for (let i = 0; i < 100; i += 25) {
      for (const r of await Promise.all(Array.from({ length: 25 }, (_, j) => c.post('/api/secret/v1', { key: `page/${i + j}`, raw_value: `v${i + j}`, dek_alias: 'kms-page' })))) ids.add(r.body.id);
    }
    await dropCaches(c);
    const decrypts = () => kms.calls.filter((x) => x.op === 'Decrypt').length;
    const before = decrypts();
    const page = await c.get('/api/secret/v1/list-decrypted?page_size=1000');
    assert.equal(page.status, 200, page.text);
    assert.equal(page.body.secrets.filter((x: { id: string }) => ids.has(x.id)).length, 100);
    // One Decrypt per KMS-wrapped DEK of the page (earlier tests of this file left secrets under others).
    const [{ n }] = await testDb()('secrets as s').join('deks as d', 'd.id', 's.dek_id').where('d.envelope_key_id', ARN).countDistinct({ n: 's.dek_id' });
    assert.equal(decrypts() - before, Number(n));
    for (const id of ids) assert.equal((await c.delete(`/api/secret/v1/${id}`)).status, 200);
  });

  it('fails a list-decrypted page whole (502) while KMS fails, but lists a secret whose DEK KMS refuses (changed in the table) with its decrypt_error, the rest decrypted', async () => {
    const c = stack.client;
    assert.ok([201, 409].includes((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN, region: 'eu-west-1' })).status));
    assert.equal((await c.post(`${E}/envelope/${enc(ARN)}/dek`, { id: 'kms-list-dek' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'kms-list-dek', alias: 'kms-list' })).status, 201);
    const onKms = await c.post('/api/secret/v1', { key: 'kms-list/on-kms', raw_value: 'kms-v', dek_alias: 'kms-list' });
    const onLocal = await c.post('/api/secret/v1', { key: 'kms-list/on-local', raw_value: 'local-v' });
    assert.deepEqual([onKms.status, onLocal.status], [201, 201]);
    const decrypts = () => kms.calls.filter((x) => x.op === 'Decrypt').length;
    const list = () => c.get('/api/secret/v1/list-decrypted?page_size=1000');

    await dropCaches(c);
    const before = decrypts();
    const release = kms.hold('Decrypt');
    const listing = list();
    await waitFor(async () => decrypts() > before, 'the page to ask KMS for its DEK');
    release('KMSInternalException');
    assertError(await listing, 502, 'bad_gateway');

    await testDb()('deks').where({ id: 'kms-list-dek' }).update({ encrypted_dek: randomBytes(100).toString('base64') });
    await dropCaches(c);
    const page = await list();
    assert.equal(page.status, 200, page.text);
    const item = (id: string) => page.body.secrets.find((x: { id: string }) => x.id === id);
    assert.deepEqual(item(onKms.body.id).decrypt_error, {
      code: 'dek_does_not_unwrap',
      message: `DEK 'kms-list-dek' does not unwrap with envelope key '${ARN}' (encrypted DEK does not unwrap with this KMS key): that key is not the one it was wrapped with`,
    });
    assert.equal(item(onKms.body.id).decrypted_value, undefined);
    assert.equal(item(onLocal.body.id).decrypted_value, 'local-v');
    for (const r of [onKms, onLocal]) assert.equal((await c.delete(`/api/secret/v1/${r.body.id}`)).status, 200);
  });

  it('lists a secret whose KMS key is disabled, pending deletion or deleted with decrypt_error kms_key_unusable, the rest decrypted, and its value again once the key is enabled', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: DOOMED_ARN, region: 'eu-west-1' })).status, 201);
    assert.equal((await c.post(`${E}/envelope/${enc(DOOMED_ARN)}/dek`, { id: 'kms-doomed-dek' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'kms-doomed-dek', alias: 'kms-doomed' })).status, 201);
    const onDoomed = await c.post('/api/secret/v1', { key: 'kms-doomed/on-kms', raw_value: 'doomed-v', dek_alias: 'kms-doomed' });
    const onLocal = await c.post('/api/secret/v1', { key: 'kms-doomed/on-local', raw_value: 'local-v' });
    assert.deepEqual([onDoomed.status, onLocal.status], [201, 201]);
    const admin = new KMSClient({ region: 'eu-west-1', endpoint: kms.url });
    const listed = async () => {
      await dropCaches(c);
      const page = await c.get('/api/secret/v1/list-decrypted?page_size=1000');
      assert.equal(page.status, 200, page.text);
      const item = (id: string) => page.body.secrets.find((x: { id: string }) => x.id === id);
      assert.equal(item(onLocal.body.id).decrypted_value, 'local-v');
      return { page, doomed: item(onDoomed.body.id) };
    };
    const refused = async (kmsError: string, state: string) => {
      const { page, doomed } = await listed();
      assert.equal(doomed.decrypted_value, undefined);
      assert.deepEqual(doomed.decrypt_error, {
        code: 'kms_key_unusable',
        message: `DEK 'kms-doomed-dek' cannot be unwrapped: AWS KMS Decrypt failed: ${kmsError} (KMS key '${DOOMED_ARN}' ${state})`,
      });
      const id = page.headers.get('x-request-id');
      const errors = (await requestLogsThrough(stack, page, { all: true })).filter((l) => l.includes(`"req_id":"${id}"`) && l.includes('"level":50'));
      assert.equal(errors.length, 1, errors.join('\n'));
      assert.ok(errors[0].includes(onDoomed.body.id) && errors[0].includes('kms_key_unusable'), errors[0]);
    };
    const opens = async () => assert.equal((await listed()).doomed.decrypted_value, 'doomed-v');
    try {
      await opens();
      await admin.send(new DisableKeyCommand({ KeyId: DOOMED_ARN }));
      await refused('DisabledException', 'is disabled');
      await admin.send(new EnableKeyCommand({ KeyId: DOOMED_ARN }));
      await opens();
      await admin.send(new ScheduleKeyDeletionCommand({ KeyId: DOOMED_ARN, PendingWindowInDays: 7 }));
      await refused('KMSInvalidStateException', 'is in a state that cannot be used, such as pending deletion');
      await admin.send(new CancelKeyDeletionCommand({ KeyId: DOOMED_ARN }));
      await admin.send(new EnableKeyCommand({ KeyId: DOOMED_ARN }));
      await opens();
      kms.deleteKey(DOOMED_ARN);
      await refused('NotFoundException', 'does not exist');
    } finally {
      admin.destroy();
    }
    for (const r of [onDoomed, onLocal]) assert.equal((await c.delete(`/api/secret/v1/${r.body.id}`)).status, 200);
  });

  it('keeps writes under an alias going while its rotation waits on KMS for the new DEK', async () => {
    const c = stack.client;
    assert.ok([201, 409].includes((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: ARN, region: 'eu-west-1' })).status));
    assert.equal((await c.post(`${E}/envelope/${enc(ARN)}/dek`, { id: 'kms-rot-dek' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'kms-rot-dek', alias: 'kms-rot' })).status, 201);
    const generated = () => kms.calls.filter((x) => x.op === 'GenerateDataKey').length;
    const before = generated();
    const release = kms.hold('GenerateDataKey');
    let job: string;
    try {
      const started = await c.post(`${E}/dek/alias/kms-rot/rotate`, {});
      assert.equal(started.status, 202, started.text);
      job = started.body.id;
      await waitFor(async () => generated() > before, 'the rotation to ask KMS for its new DEK');
      // Not held up by the rotation's KMS call: it answers, rather than wait on the alias's row lock.
      let answered = false;
      const waitingOnAlias = async () => {
        if (answered) return 'stopped';
        const { rows } = await testDb().raw(`select 1 from pg_stat_activity where wait_event_type = 'Lock' and query ilike '%dek_aliases%'`);
        return rows.length > 0 && 'waiting';
      };
      const written = await Promise.race([
        c.post('/api/secret/v1', { key: 'during-kms-rotation', raw_value: 'v', dek_alias: 'kms-rot' }),
        waitFor(waitingOnAlias, 'a write waiting on the alias', 60_000, 20),
      ]);
      answered = true;
      assert.notEqual(written, 'waiting', "the write waited for the rotation's KMS call");
      assert.equal((written as { status: number }).status, 201);
    } finally {
      release();
    }
    const done = await waitFor(async () => {
      const r = (await c.get(`${E}/job/${job}`)).body;
      return ['completed', 'failed'].includes(r.status) && r;
    }, 'the rotation to end', 30_000);
    assert.equal(done.status, 'completed', JSON.stringify(done));
    const read = (await c.get('/api/secret/v1/list-decrypted?page_size=1000')).body.secrets.find((x: { key: string }) => x.key === 'during-kms-rotation');
    assert.equal(read.decrypted_value, 'v');
  });

  it('answers a DEK that no longer unwraps (its key file replaced) as a server fault naming it, logged, not as the request\'s fault', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'swapped.key' })).status, 201);
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'swapped-target.key' })).status, 201);
    assert.equal((await c.post(`${E}/envelope/swapped.key/dek`, { id: 'swapped-dek' })).status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: 'swapped-dek', alias: 'swapped' })).status, 201);
    const stored = await c.post('/api/secret/v1', { key: 'on-swapped', raw_value: 'v', dek_alias: 'swapped' });
    assert.equal(stored.status, 201);
    const sealed = (await c.get(`/api/secret/v1/${stored.body.id}`)).body.encrypted_secret;
    const file = path.join(keysDir, 'swapped.key');
    const original = fs.readFileSync(file);
    fs.writeFileSync(file, randomBytes(32));
    await dropCaches(c);
    try {
      const written = await c.post('/api/secret/v1', { key: 'on-swapped-2', raw_value: 'v2', dek_alias: 'swapped' });
      const updated = await c.put(`/api/secret/v1/${stored.body.id}`, { raw_value: 'new' });
      const imported = await c.post('/api/secret/v1/import', { key: 'on-swapped-3', encrypted_value: sealed, dek_alias: 'swapped', data_encryption_key_id: 'swapped-dek' });
      const migrated = await c.post(`${E}/envelope/swapped.key/dek/swapped-dek/migrate`, { to_envelope_encryption_key_id: 'swapped-target.key' });
      for (const r of [written, updated, imported, migrated]) {
        assertError(r, 500, 'internal');
        assert.match(r.body.message, /^DEK 'swapped-dek' does not unwrap with envelope key 'swapped\.key' \(.*\): that key is not the one it was wrapped with$/);
      }
      await waitFor(async () => stack.api.logs.some((l) => l.includes('"level":50') && l.includes("DEK 'swapped-dek' does not unwrap")), 'the fault to be logged');
    } finally {
      fs.writeFileSync(file, original);
      await dropCaches(c);
    }
    assert.equal((await c.delete(`/api/secret/v1/${stored.body.id}`)).status, 200);
    // The refused migration moved nothing: the target is still unused.
    assert.equal((await c.delete(`${E}/envelope/swapped-target.key`)).status, 200);
  });

  it('answers a new DEK under a local envelope key whose file is gone as a server fault naming the file, though the key was used a moment before, storing nothing', async () => {
    const c = stack.client;
    assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: 'deleted.key' })).status, 201);
    assert.equal((await c.post(`${E}/envelope/deleted.key/dek`, { id: 'deleted-1' })).status, 201);
    fs.rmSync(path.join(keysDir, 'deleted.key'));
    const made = await c.post(`${E}/envelope/deleted.key/dek`, { id: 'deleted-2' });
    assertError(made, 500, 'internal');
    assert.match(made.body.message, /^local envelope key 'deleted\.key' cannot be read \(ENOENT\)$/);
    assert.equal(await testDb()('deks').where({ id: 'deleted-2' }).first(), undefined);
  });
});

describe('encryption API with AWS_KMS_ACCOUNTS', () => {
  let api: Awaited<ReturnType<typeof startApi>>;
  before(async () => {
    api = await startApi(testEnv({ AWS_KMS_ACCOUNTS: '111122223333,444455556666' }));
  });
  after(async () => api?.stop());

  it('takes KMS keys of the accounts it names only (400 naming them), storing nothing else', async () => {
    const c = new Client(api.url);
    const foreign = 'arn:aws:kms:eu-west-1:999988887777:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';
    const refused = await c.post(`${E}/envelope`, { type: 'aws_kms', arn: foreign, region: 'eu-west-1' });
    assert.equal(refused.status, 400, refused.text);
    assert.equal(refused.body.message, 'AWS account 999988887777 is not one whose KMS keys may be used (AWS_KMS_ACCOUNTS: 111122223333, 444455556666)');
    assert.equal((await c.get(`${E}/envelope/${encodeURIComponent(foreign)}`)).status, 404);
    const own = 'arn:aws:kms:eu-west-1:444455556666:alias/taskbridge-allowed';
    assert.equal((await c.post(`${E}/envelope`, { type: 'aws_kms', arn: own, region: 'eu-west-1' })).status, 201);
  });
});

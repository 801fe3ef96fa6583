import assert from 'node:assert/strict';
import { runCli, type CliRun } from './helpers/cli.ts';
import { randomUUID } from 'node:crypto';
import { constants } from 'node:buffer';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { ADMIN_KEY, requireEnv, resetDb, startStack, tableRowCounts, testDb, type Client, type Stack } from './helpers/stack.ts';
import { scratchDatabase, type ScratchDatabase } from './helpers/scratch-database.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';
import { migrateLatest } from '../db/knex.ts';
import { aliasTargets } from '../domain/definition-match.ts';

const E = '/api/encryption/v1';
const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const STRIPE_KEY = `sk_test_${randomUUID().replace(/-/g, '')}`;
const VALUES: Record<string, string> = {
  'db/password': `pw-${randomUUID()}`, 'api/token': `tok-${randomUUID()}`, 'after-rotation': `rot-${randomUUID()}`,
  'pay/key': `pk-${randomUUID()}`, 'pay/webhook': `wh-${randomUUID()}`,
};

// The CLI as the README runs it, with the API key in the environment.
const cli = (args: string[], env: Record<string, string | undefined> = {}) => runCli(args, { TASKBRIDGE_API_KEY: ADMIN_KEY, ...env });

async function ok(r: Promise<{ status: number; text: string; body: any }>, status = 201) {
  const res = await r;
  assert.equal(res.status, status, res.text);
  return res.body;
}

const decrypted = async (c: Client) => {
  const res = await c.get('/api/secret/v1/list-decrypted?page_size=100');
  assert.equal(res.status, 200, res.text);
  return Object.fromEntries(res.body.secrets.map((s: any) => [s.id, { key: s.key, dek_alias: s.dek_alias, value: s.decrypted_value }]));
};

const provider = async (c: Client, id: string) => {
  const p = await ok(c.get(`${B}/provider/${id}`), 200);
  return {
    id: p.id, display_name: p.display_name, status: p.status, resource_server_credential_id: p.resource_server_credential_id,
    user_credential_id: p.user_credential_id, functions: p.functions.map((f: any) => f.function_controller_type_id).sort(),
  };
};

const exported = async (c: Client) => ok(c.get('/api/a2a/v1/definition'), 200);

// An export as a move keeps it: without what each installation stamps for itself (exported_at,
// created_at and updated_at) and without ciphertexts an import seals afresh: every credential's
// sensitive members, and each secret sealed with an older DEK than its alias names (`resealed`): it is
// re-encrypted under the alias's DEK, which its data_encryption_key_id then names. Such an older DEK
// is on the target, but nothing there uses it, so an export leaves it out: `used` keeps a source's
// DEKs to those the target uses.
function portable(def: any, resealed: Set<string>, used?: Set<string>) {
  const aliasDek = aliasTargets(def);
  const { exported_at: _, ...rest } = def;
  const sealed = (v: Record<string, unknown>, members: string[]) => Object.fromEntries(Object.entries(v).map(([k, x]) => [k, members.includes(k) ? 'sealed' : x]));
  const credential = (c: any) => c && ({
    id: c.id, type_id: c.type_id, dek_alias: c.dek_alias, metadata: c.metadata, data_encryption_key_id: c.data_encryption_key_id,
    value: sealed(c.value, ['api_key', 'client_secret', 'access_token', 'refresh_token']),
  });
  return {
    ...rest,
    envelope_keys: def.envelope_keys.map((k: any) => ({
      id: k.id, type: k.type, file_name: k.file_name,
      data_encryption_keys: k.data_encryption_keys.filter((d: any) => !used || used.has(d.id)).map((d: any) => ({ id: d.id, encrypted_data_encryption_key: d.encrypted_data_encryption_key, aliases: d.aliases })),
    })),
    secrets: def.secrets.map((s: any) => ({
      id: s.id, key: s.key, dek_alias: s.dek_alias,
      ...(resealed.has(s.id) ? { data_encryption_key_id: aliasDek.get(s.dek_alias), encrypted_value: 'resealed' } : { data_encryption_key_id: s.data_encryption_key_id, encrypted_value: s.encrypted_value }),
    })),
    providers: def.providers.map((p: any) => ({ ...p, resource_server_credential: credential(p.resource_server_credential), user_credential: credential(p.user_credential) })),
  };
}
const dekIds = (def: any) => new Set<string>(def.envelope_keys.flatMap((k: any) => k.data_encryption_keys.map((d: any) => d.id)));

describe('npm run cli -- definition apply: an export re-applied to a fresh installation', function () {
  this.timeout(120_000);
  let a: Stack;
  let b: Stack;
  let scratch: ScratchDatabase;
  let stripe: FakeProviders;
  let file: string;
  let source: any;
  const ids: Record<string, string> = {};
  const apply = (...args: string[]) => cli(['definition', 'apply', file, '--url', b.api.url, ...args]);
  // Nothing the CLI prints may carry a value, a token, a key or a ciphertext of one.
  const assertNoValues = (r: CliRun) => {
    const printed = r.stdout + r.stderr;
    for (const v of [...Object.values(VALUES), STRIPE_KEY, 'at-123', 'rt-456', ...source.secrets.map((s: any) => s.encrypted_value)]) {
      assert.ok(!printed.includes(v), `the output shows a value or ciphertext:\n${printed}`);
    }
  };

  before(async () => {
    await resetDb();
    stripe = await startFakeProviders();
    const providers = { STRIPE_API_BASE_URL: stripe.url, BRIDGE_ALLOW_PRIVATE: 'true' };
    a = await startStack(providers, { workers: 0 });
    const c = a.client;

    // A second envelope key with a custom alias on a DEK of its own.
    await ok(c.post(`${E}/envelope`, { type: 'local', file_name: 'payments.key' }));
    const payments = await ok(c.post(`${E}/envelope/payments.key/dek`, {}));
    await ok(c.post(`${E}/dek/alias`, { alias: 'payments', dek_id: payments.id }));
    for (const key of ['db/password', 'api/token']) ids[key] = (await ok(c.post('/api/secret/v1', { key, raw_value: VALUES[key] }))).id;
    // `default` moved to a new DEK: the secrets above stay under the older one.
    const newer = await ok(c.post(`${E}/envelope/default-envelope.key/dek`, {}));
    await ok(c.put(`${E}/dek/alias/default`, { new_dek_id: newer.id }), 200);
    for (const key of ['after-rotation']) ids[key] = (await ok(c.post('/api/secret/v1', { key, raw_value: VALUES[key] }))).id;
    for (const key of ['pay/key', 'pay/webhook']) ids[key] = (await ok(c.post('/api/secret/v1', { key, raw_value: VALUES[key], dek_alias: 'payments' }))).id;

    const card = await ok(c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, metadata: { team: 'billing' }, dek_alias: 'payments' }));
    await ok(c.post(avail('stripe', 'api_key'), { provider_instance_id: 'pay', display_name: 'Payments', resource_server_credential_id: card.id }));
    await ok(c.post(`${B}/provider/pay/function/stripe_process_refund/enable`, {}));
    const rs = await ok(c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, { value: { client_id: 'c', client_secret: 's', redirect_uri: 'https://example.com/cb' } }));
    const user = await ok(c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`, { value: { access_token: 'at-123', refresh_token: 'rt-456', expiry_time: '2099-01-01T00:00:00Z' } }));
    await ok(c.post(avail('google_mail', 'oauth_auth_flow'), { provider_instance_id: 'mail', display_name: 'Mail', resource_server_credential_id: rs.id, user_credential_id: user.id }));
    await ok(c.post(`${B}/provider/mail/function/google_mail_send_email/enable`, {}));
    await ok(c.patch(`${B}/provider/mail`, { status: 'disabled' }), 200);

    file = path.join(a.env.DATA_DIR, 'definition.json');
    const res = await c.get('/api/a2a/v1/definition');
    assert.equal(res.status, 200);
    fs.writeFileSync(file, res.text);
    source = res.body;

    // The target: a database of its own, and the source's key files copied before its first start.
    scratch = await scratchDatabase('apply');
    await migrateLatest(scratch.db);
    const keysDir = path.join(requireEnv('TEST_DATA_DIR'), `apply-keys-${randomUUID().slice(0, 8)}`);
    fs.cpSync(path.join(a.env.DATA_DIR, 'keys'), keysDir, { recursive: true });
    b = await startStack({ ...providers, DATABASE_URL: scratch.url, KEYS_DIR: keysDir }, { workers: 0 });
  });
  after(async () => {
    await a?.stop();
    await b?.stop();
    await scratch?.drop();
    stripe?.close();
  });

  it('stops before writing anything while an envelope key of the file is not on the target, saying what to do (exit 1)', async () => {
    const before = await tableRowCounts([], scratch.db);
    const r = await apply();
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, /the target has no envelope key local key payments\.key \(file payments\.key\); nothing was written/);
    assert.match(r.stderr, /copy the file from the source's KEYS_DIR into the target's KEYS_DIR/);
    assert.match(r.stderr, /POST \/api\/encryption\/v1\/envelope \{"type":"local","file_name":"<file>"\}/);
    assert.deepEqual(await tableRowCounts([], scratch.db), before);
  });

  it('applies the whole export once the key file is registered: secrets, aliases, credentials, providers and functions as on the source (exit 0)', async () => {
    // As the message says: the copied file, registered, is adopted.
    await ok(b.client.post(`${E}/envelope`, { type: 'local', file_name: 'payments.key' }));
    const r = await apply();
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assertNoValues(r);
    const deks = dekIds(source).size;
    assert.match(r.stdout, new RegExp(`deks: ${deks} created, 0 already there, 0 conflicts, 0 failed`));
    // The target's own `default`, pointed at the file's DEK: updated, not created.
    assert.match(r.stdout, /aliases: 1 created, 1 updated, 0 already there, 0 conflicts, 0 failed/);
    assert.match(r.stdout, /alias default: pointed at DEK \S+ \(it named \S+\)/);
    assert.match(r.stdout, /secrets: 5 created, 0 already there, 0 conflicts, 0 failed/);
    assert.match(r.stdout, /credentials: 3 created/);
    assert.match(r.stdout, /providers: 2 created/);
    assert.match(r.stdout, /functions: 2 created/);

    assert.deepEqual(await decrypted(b.client), await decrypted(a.client));
    for (const alias of ['default', 'payments']) {
      assert.equal((await ok(b.client.get(`${E}/dek/alias/${alias}`), 200)).id, (await ok(a.client.get(`${E}/dek/alias/${alias}`), 200)).id);
    }
    for (const id of ['pay', 'mail']) assert.deepEqual(await provider(b.client, id), await provider(a.client, id));
    assert.equal((await provider(b.client, 'mail')).status, 'disabled');
    // The imported credential decrypts to the source's key.
    const invoked = await ok(b.client.post(`${B}/provider/pay/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_1' } }), 200);
    assert.equal(invoked.type, 'success');
    assert.equal(stripe.seen.at(-1)!.authorization, `Bearer ${STRIPE_KEY}`);

    const target = await exported(b.client);
    const aliasDek = aliasTargets(source);
    const resealed = new Set<string>(source.secrets.filter((s: any) => s.data_encryption_key_id !== aliasDek.get(s.dek_alias)).map((s: any) => s.id));
    assert.deepEqual([...resealed].sort(), [ids['db/password'], ids['api/token']].sort());
    assert.deepEqual(portable(target, resealed), portable(source, resealed, dekIds(target)));
    // The one DEK the target has and does not export: the source's `default` before its move.
    assert.deepEqual([...dekIds(source)].filter((d) => !dekIds(target).has(d)).length, 1);
  });

  it('applied again, finds everything there and changes nothing (exit 0)', async () => {
    const before = { rows: await tableRowCounts([], scratch.db), def: await exported(b.client) };
    const r = await apply();
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assertNoValues(r);
    for (const [kind, n] of [['deks', dekIds(source).size], ['aliases', 2], ['secrets', 5], ['credentials', 3], ['providers', 2], ['functions', 2]] as const) {
      assert.match(r.stdout, new RegExp(`${kind}: 0 created, ${kind === 'aliases' || kind === 'providers' ? '0 updated, ' : ''}${n} already there, 0 conflicts, 0 failed`));
    }
    assert.match(r.stdout, /Nothing to do: everything in the file is already on the target/);
    assert.deepEqual(await tableRowCounts([], scratch.db), before.rows);
    const { exported_at: _, ...after } = await exported(b.client);
    const { exported_at: __, ...was } = before.def;
    assert.deepEqual(after, was);
  });

  it('applied again after the target moved `default`, points it back and counts it updated, not created (exit 0)', async () => {
    const fileDek = (await ok(b.client.get(`${E}/dek/alias/default`), 200)).id;
    const moved = await ok(b.client.post(`${E}/envelope/default-envelope.key/dek`, {}));
    await ok(b.client.put(`${E}/dek/alias/default`, { new_dek_id: moved.id }), 200);
    const dry = await apply('--dry-run');
    assert.equal(dry.code, 0, dry.stdout + dry.stderr);
    assert.match(dry.stdout, /aliases: 0 to create, 1 to update, 1 already there, 0 conflicts, 0 failed/);
    assert.equal((await ok(b.client.get(`${E}/dek/alias/default`), 200)).id, moved.id);

    const r = await apply();
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, new RegExp(`alias default: pointed at DEK ${fileDek} \\(it named ${moved.id}\\)`));
    assert.match(r.stdout, /aliases: 0 created, 1 updated, 1 already there, 0 conflicts, 0 failed/);
    assert.doesNotMatch(r.stdout, /Nothing to do/);
    assert.equal((await ok(b.client.get(`${E}/dek/alias/default`), 200)).id, fileDek);
  });

  it('with --dry-run says what a partly applied target lacks and writes nothing; applied then, fills it in', async () => {
    await ok(b.client.delete(`/api/secret/v1/${ids['api/token']}`), 200);
    await ok(b.client.post(`${B}/provider/pay/function/stripe_process_refund/disable`, {}), 200);
    const before = await tableRowCounts([], scratch.db);
    const dry = await apply('--dry-run');
    assert.equal(dry.code, 0, dry.stdout + dry.stderr);
    assert.match(dry.stdout, /secrets: 1 to create, 4 already there, 0 conflicts, 0 failed/);
    assert.match(dry.stdout, /functions: 1 to create, 1 already there/);
    assert.match(dry.stdout, /dry run: nothing was written/);
    assert.deepEqual(await tableRowCounts([], scratch.db), before);

    const r = await apply();
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /secrets: 1 created, 4 already there/);
    assert.match(r.stdout, /functions: 1 created, 1 already there/);
    assert.deepEqual(await decrypted(b.client), await decrypted(a.client));
  });

  it('reports a secret changed on the target as a conflict and leaves it (exit 1)', async () => {
    // One stored as exported, one re-encrypted at import (sealed with the older DEK of `default`).
    for (const key of ['pay/key', 'db/password']) await ok(b.client.put(`/api/secret/v1/${ids[key]}`, { raw_value: `changed-${key}` }), 200);
    const r = await apply();
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assertNoValues(r);
    for (const key of ['pay/key', 'db/password']) {
      assert.match(r.stderr, new RegExp(`conflict: secret ${key} \\(${ids[key]}\\): its value differs; left as it is`));
      assert.equal((await decrypted(b.client))[ids[key]].value, `changed-${key}`);
    }
    assert.match(r.stdout, /secrets: 0 created, 3 already there, 2 conflicts, 0 failed/);
    assert.match(r.stdout, /2 item\(s\) not applied/);
  });

  it('compares a credential the target has without an instance: one unlike the file\'s is a conflict and its instance is not made (exit 1); one alike counts as there', async () => {
    // The last test's conflicts cleared: those secrets are imported again as the file has them.
    for (const key of ['pay/key', 'db/password']) await ok(b.client.delete(`/api/secret/v1/${ids[key]}`), 200);
    const pay = source.providers.find((p: any) => p.id === 'pay');
    const card = pay.resource_server_credential;
    // The instance deleted (its credential goes with it), then the credential imported by hand, unlike the file's.
    await ok(b.client.delete(`${B}/provider/pay`), 200);
    await ok(b.client.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, { ...card, metadata: { team: 'someone else' } }));
    const r = await apply();
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assertNoValues(r);
    assert.match(r.stderr, new RegExp(`conflict: resource server credential ${card.id} of provider pay: its metadata differs; left as it is`));
    assert.match(r.stderr, new RegExp(`failed: provider pay: its credential ${card.id} on the target is not the file's \\(the conflict above\\): not made`));
    assert.match(r.stdout, /credentials: 0 created, 2 already there, 1 conflicts, 0 failed/);
    assert.equal((await b.client.get(`${B}/provider/pay`)).status, 404);
    const kept = (await ok(b.client.get(`${B}/credential?unused=true`), 200)).items.find((x: any) => x.id === card.id);
    assert.deepEqual(kept.metadata, { team: 'someone else' }, 'left as it is');

    // Alike (imported as the file has it): there, and the instance is made on it.
    await ok(b.client.delete(`${B}/credential/${card.id}`), 200);
    await ok(b.client.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, card));
    const again = await apply();
    assert.equal(again.code, 0, again.stdout + again.stderr);
    assert.match(again.stdout, /credentials: 0 created, 3 already there, 0 conflicts, 0 failed/);
    assert.match(again.stdout, /providers: 1 created, 0 updated, 1 already there/);
    assert.equal((await b.client.get(`${B}/provider/pay`)).body.resource_server_credential.id, card.id);

    // Its id taken by a credential of another provider controller: a conflict saying so (before, the
    // list walked by the file's provider missed it: 'there but not listed').
    await ok(b.client.delete(`${B}/provider/pay`), 200);
    const mailClient = source.providers.find((p: any) => p.id === 'mail').resource_server_credential;
    await ok(b.client.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server/import`, { ...mailClient, id: card.id }));
    const other = await apply();
    assert.equal(other.code, 1, other.stdout + other.stderr);
    assert.match(other.stderr, new RegExp(`conflict: resource server credential ${card.id} of provider pay: it is a credential of provider controller 'google_mail'; left as it is`));
    assert.equal((await b.client.get(`${B}/provider/pay`)).status, 404);
    await ok(b.client.delete(`${B}/credential/${card.id}`), 200);
    await ok(b.client.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, card));
    assert.equal((await apply()).code, 0);
  });

  it('refuses a file that is not JSON, not an export, or not there, a run without TASKBRIDGE_API_KEY or with one that is no API key and a bad command line (exit 2), and a key the API refuses (exit 1)', async () => {
    const dir = path.dirname(file);
    const cases: [string, string | undefined, RegExp][] = [
      ['not-json.json', '{"format": "taskbridge-definition/v1", ', /not-json\.json is not JSON/],
      ['other.json', '{"format": "something-else/v2"}', /its format is "something-else\/v2", not "taskbridge-definition\/v1"/],
      ['partial.json', '{"format": "taskbridge-definition/v1", "secrets": []}', /partial\.json is not a valid definition export: Invalid file: file\.\S+ is required/],
      ['absent.json', undefined, /cannot read \S+absent\.json: ENOENT/],
      // Found on the target, the credential was compared member by member: the run died mid-way on it
      // ('Cannot convert undefined or null to object', exit 1, no summary).
      ['null-value.json', JSON.stringify({ ...source, providers: source.providers.map((p: any) => ({ ...p, resource_server_credential: { ...p.resource_server_credential, value: null } })) }),
        /null-value\.json is not a valid definition export: Invalid file: file\.providers\.0\.resource_server_credential\.value must be object/],
      // Names the import endpoints refuse: a 200,000-character id was printed whole in a 'failed:' line,
      // and an alias of the wrong shape failed at its write, after the DEKs were written.
      ['long-id.json', JSON.stringify({ ...source, secrets: source.secrets.map((s: any, i: number) => (i ? s : { ...s, id: 'x'.repeat(200_000) })) }),
        /^Error: \S+long-id\.json is not a valid definition export: Invalid file: file\.secrets\.0\.id must be a UUID\n$/],
      ['bad-alias.json', JSON.stringify({ ...source, envelope_keys: source.envelope_keys.map((k: any) => ({ ...k, data_encryption_keys: k.data_encryption_keys.map((d: any) => ({ ...d, aliases: [...d.aliases, 'no spaces allowed'] })) })) }),
        /bad-alias\.json is not a valid definition export: Invalid file: file\.envelope_keys\.0\.data_encryption_keys\.0\.aliases\.\d+ must be 1 to 128 of A-Z a-z 0-9 _ \. : -/],
    ];
    for (const [name, text, message] of cases) {
      if (text !== undefined) fs.writeFileSync(path.join(dir, name), text);
      const r = await cli(['definition', 'apply', path.join(dir, name), '--url', b.api.url]);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, message);
    }
    const noKey = await cli(['definition', 'apply', file, '--url', b.api.url], { TASKBRIDGE_API_KEY: undefined });
    assert.equal(noKey.code, 2);
    assert.match(noKey.stderr, /TASKBRIDGE_API_KEY is not set/);
    // A key with a line break inside was quoted by fetch's refusal of the header, said as the API out of reach (exit 1).
    for (const badKey of [`${ADMIN_KEY.slice(0, 8)}\n${ADMIN_KEY.slice(8)}`, `${ADMIN_KEY}€`]) {
      const r = await cli(['definition', 'apply', file, '--url', b.api.url], { TASKBRIDGE_API_KEY: badKey });
      assert.equal(r.code, 2, r.stderr);
      assert.match(r.stderr, /^Error: TASKBRIDGE_API_KEY is not an API key: it holds a space, line break or character that is not printable ASCII \(not shown\)$/m);
      assert.ok(!(r.stdout + r.stderr).includes(ADMIN_KEY.slice(8)), r.stderr);
    }
    // Surrounding white space (a key file's newline) is no part of the key.
    const padded = await cli(['definition', 'apply', file, '--url', b.api.url, '--dry-run'], { TASKBRIDGE_API_KEY: ` ${ADMIN_KEY}\n` });
    assert.match(padded.stdout, /^envelope keys: all \d+ on the target/m, padded.stdout + padded.stderr);
    const wrongKey = await cli(['definition', 'apply', file, '--url', b.api.url], { TASKBRIDGE_API_KEY: 'not-a-key' });
    assert.equal(wrongKey.code, 1);
    assert.match(wrongKey.stderr, /refused TASKBRIDGE_API_KEY \(401\)/);
    const usage = await cli(['definition', 'apply']);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /definition apply needs exactly one file/);
    // A --url that does not parse, or holds a password (which fetch's refusal quoted), is a bad command line.
    for (const [url, message] of [['http://[bad', /--url 'http:\/\/\[bad' is not an http\(s\) URL/], ['http://', /--url 'http:\/\/' is not an http\(s\) URL/],
      [`http://ops:pw-${STRIPE_KEY}@127.0.0.1:1`, /--url must not hold a user name or password \(not shown\)/],
      [`http://ops:pw-${STRIPE_KEY}@127.0.0.1:99999`, /--url \(not shown: it holds an @\) is not an http\(s\) URL/]] as const) {
      const r = await cli(['definition', 'apply', file, '--url', url]);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, message);
      assert.ok(!r.stderr.includes(STRIPE_KEY), r.stderr);
    }
    for (const [args, message] of [[['--timeout', '0'], /--timeout '0' is not a whole number of seconds from 1 to 3600/],
      [['--timeout', '1.5'], /--timeout '1\.5' is not a whole number/], [['--timeout', '3601'], /--timeout '3601' is not a whole number/],
      [['--timeout', '5', '--timeout', '6'], /--timeout given more than once/]] as const) {
      const r = await cli(['definition', 'apply', file, '--url', b.api.url, ...args]);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, message);
    }
    for (const opt of ['--url', '--timeout']) {
      const elsewhere = await cli(['keys', 'list', opt, opt === '--url' ? b.api.url : '5']);
      assert.equal(elsewhere.code, 2);
      assert.match(elsewhere.stderr, new RegExp(`${opt} is only for definition apply`));
    }
  });
});

// A pass-through proxy to `target` whose `answer` may answer a request itself (true when it did).
async function proxy(target: string, answer: (req: http.IncomingMessage, res: http.ServerResponse) => boolean | Promise<boolean>) {
  const to = new URL(target);
  const server = http.createServer(async (req, res) => {
    if (await answer(req, res)) return;
    const up = http.request({ host: to.hostname, port: to.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode!, r.headers);
      r.pipe(res);
    });
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, close: () => server.close() };
}

describe('npm run cli -- definition apply: runs cut short, files that cannot be applied, a URL that is not the API', function () {
  this.timeout(180_000);
  let a: Stack;
  let source: any;
  let dir: string;
  const targets: { stack: Stack; scratch: ScratchDatabase }[] = [];

  // A fresh installation with the source's key files, as a move makes one.
  async function freshTarget(env: Record<string, string> = {}) {
    const scratch = await scratchDatabase('apply');
    await migrateLatest(scratch.db);
    const keysDir = path.join(requireEnv('TEST_DATA_DIR'), `apply-keys-${randomUUID().slice(0, 8)}`);
    fs.cpSync(path.join(a.env.DATA_DIR, 'keys'), keysDir, { recursive: true });
    const stack = await startStack({ DATABASE_URL: scratch.url, KEYS_DIR: keysDir, ...env }, { workers: 0 });
    targets.push({ stack, scratch });
    return { stack, scratch };
  }
  const write = (name: string, def: unknown) => {
    const f = path.join(dir, name);
    fs.writeFileSync(f, JSON.stringify(def));
    return f;
  };
  const applyTo = (url: string, f = path.join(dir, 'def.json')) => cli(['definition', 'apply', f, '--url', url]);

  before(async () => {
    await resetDb();
    a = await startStack({}, { workers: 0 });
    const c = a.client;
    const payments = await ok(c.post(`${E}/envelope/default-envelope.key/dek`, {}));
    await ok(c.post(`${E}/dek/alias`, { alias: 'payments', dek_id: payments.id }));
    for (const key of ['s1', 's2']) await ok(c.post('/api/secret/v1', { key, raw_value: `v-${key}` }));
    await ok(c.post('/api/secret/v1', { key: 'p1', raw_value: 'v-p1', dek_alias: 'payments' }));
    // Disabled by an admin, with a function enabled.
    const card = await ok(c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, metadata: {} }));
    await ok(c.post(avail('stripe', 'api_key'), { provider_instance_id: 'off', display_name: 'Disabled one', resource_server_credential_id: card.id }));
    await ok(c.post(`${B}/provider/off/function/stripe_process_refund/enable`, {}));
    await ok(c.patch(`${B}/provider/off`, { status: 'disabled' }), 200);
    const res = await c.get('/api/a2a/v1/definition');
    assert.equal(res.status, 200);
    source = res.body;
    assert.equal(source.providers[0].status, 'disabled');
    dir = a.env.DATA_DIR;
    fs.writeFileSync(path.join(dir, 'def.json'), res.text);
  });
  after(async () => {
    for (const t of targets) {
      await t.stack.stop();
      await t.scratch.drop();
    }
    await a?.stop();
  });

  it('disables, when run again, a disabled provider whose disable failed, before enabling its functions; one an admin made active since is a conflict', async () => {
    const t = await freshTarget();
    // The first PATCH of the instance answered 500, as a fault of the API (or a cut) would; a 503 is asked again.
    let patched = 0;
    const failing = await proxy(t.stack.api.url, (req, res) => {
      if (req.method !== 'PATCH' || patched++ > 0) return false;
      req.resume();
      res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ message: 'Internal server error' }));
      return true;
    });
    try {
      const first = await applyTo(failing.url);
      assert.equal(first.code, 1, first.stdout + first.stderr);
      assert.match(first.stderr, /failed: provider off: 500 Internal server error/);
      assert.match(first.stderr, /failed: function stripe_process_refund of provider off: its provider failed/);
    } finally {
      failing.close();
    }
    // Made active by its create and left so, but with nothing enabled on it.
    assert.deepEqual(await provider(t.stack.client, 'off').then((p) => [p.status, p.functions]), ['active', []]);

    // Only disabled: updated, not created (before, counted created, and 'to create' by --dry-run).
    const dry = await cli(['definition', 'apply', path.join(dir, 'def.json'), '--url', t.stack.api.url, '--dry-run']);
    assert.equal(dry.code, 0, dry.stdout + dry.stderr);
    assert.match(dry.stdout, /providers: 0 to create, 1 to update, 0 already there, 0 conflicts, 0 failed/);
    const again = await applyTo(t.stack.api.url);
    assert.equal(again.code, 0, again.stdout + again.stderr);
    assert.match(again.stdout, /provider off: disabled \(an earlier run made it active and was cut before disabling it\)/);
    assert.match(again.stdout, /providers: 0 created, 1 updated, 0 already there, 0 conflicts, 0 failed/);
    assert.match(again.stdout, /functions: 1 created/);
    assert.deepEqual(await provider(t.stack.client, 'off').then((p) => [p.status, p.functions]), ['disabled', ['stripe_process_refund']]);
    const third = await applyTo(t.stack.api.url);
    assert.equal(third.code, 0, third.stdout + third.stderr);
    assert.match(third.stdout, /Nothing to do/);

    // An admin of the target made it active: their choice, not an apply left unfinished.
    await ok(t.stack.client.patch(`${B}/provider/off`, { status: 'active' }), 200);
    const after = await applyTo(t.stack.api.url);
    assert.equal(after.code, 1, after.stdout + after.stderr);
    assert.match(after.stderr, /conflict: provider off: it is active, not disabled; left as it is/);
    assert.equal((await provider(t.stack.client, 'off')).status, 'active');
  });

  it('disables, when run again, a disabled OAuth provider never brokered (brokering_initiated) whose disable failed; refuses a user credential shared across clients, writing nothing', async () => {
    const c = a.client;
    const gmail = avail('google_mail', 'oauth_auth_flow');
    const client = await ok(c.post(`${gmail}/credential/resource-server`, { value: { client_id: 'gc', client_secret: 'gs', redirect_uri: 'https://app.example/cb' } }));
    const user = await ok(c.post(`${gmail}/credential/user-credential`, { value: { access_token: 'at', expiry_time: '2099-01-01T00:00:00Z' } }));
    await ok(c.post(gmail, { provider_instance_id: 'goff', display_name: 'Mail, never brokered', resource_server_credential_id: client.id }));
    await ok(c.patch(`${B}/provider/goff`, { status: 'disabled' }), 200);
    await ok(c.post(gmail, { provider_instance_id: 'gmail-1', display_name: 'Mail', resource_server_credential_id: client.id, user_credential_id: user.id }));
    const def = await exported(c);
    // The source as the other tests of this file know it.
    for (const id of ['goff', 'gmail-1']) assert.equal((await c.delete(`${B}/provider/${id}`)).status, 200);
    const file = write('gmail.json', def);

    const t = await freshTarget();
    const failing = await proxy(t.stack.api.url, (req, res) => {
      if (req.method !== 'PATCH' || !req.url?.endsWith('/provider/goff')) return false;
      req.resume();
      res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ message: 'Internal server error' }));
      return true;
    });
    try {
      const first = await applyTo(failing.url, file);
      assert.equal(first.code, 1, first.stdout + first.stderr);
      assert.match(first.stderr, /failed: provider goff: 500 Internal server error/);
    } finally {
      failing.close();
    }
    assert.equal((await provider(t.stack.client, 'goff')).status, 'brokering_initiated');
    const again = await applyTo(t.stack.api.url, file);
    assert.equal(again.code, 0, again.stdout + again.stderr);
    assert.match(again.stdout, /provider goff: disabled \(an earlier run made it brokering_initiated and was cut before disabling it\)/);
    assert.equal((await provider(t.stack.client, 'goff')).status, 'disabled');

    // A second instance of the user credential with another client (as an installation from before
    // that was refused could hold): refused before anything is written.
    const shared = structuredClone(def);
    const g1 = shared.providers.find((p: any) => p.id === 'gmail-1');
    shared.providers.push({ ...structuredClone(g1), id: 'gmail-2', resource_server_credential: { ...structuredClone(g1.resource_server_credential), id: randomUUID() } });
    const fresh = await freshTarget();
    const before = await tableRowCounts([], fresh.scratch.db);
    const refused = await applyTo(fresh.stack.api.url, write('shared.json', shared));
    assert.equal(refused.code, 1, refused.stdout + refused.stderr);
    assert.match(refused.stderr, new RegExp(`providers gmail-1 and gmail-2 share user credential ${user.id} with different resource server credentials`));
    assert.deepEqual(await tableRowCounts([], fresh.scratch.db), before);
  });

  it('refuses a file with a credential nested deeper than the API takes a body, naming it, writing nothing (exit 2)', async () => {
    const t = await freshTarget();
    const def = structuredClone(source);
    const card = def.providers[0].resource_server_credential;
    card.metadata = { deep: '__DEEP__' };
    // Written as text: JSON.stringify of 10,000 levels overflows this process's stack as it did the CLI's.
    const f = path.join(dir, 'deep.json');
    fs.writeFileSync(f, JSON.stringify(def).replace('"__DEEP__"', `${'{"a":'.repeat(10_000)}1${'}'.repeat(10_000)}`));
    const before = await tableRowCounts([], t.scratch.db);
    // Before, its DEKs, aliases and secrets were written, then 'cannot reach the API at …: Maximum call stack size exceeded' (exit 1).
    const r = await applyTo(t.stack.api.url, f);
    assert.equal(r.code, 2, r.stdout + r.stderr);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, new RegExp(`^Error: ${f} cannot be applied: resource server credential ${card.id} of provider off: file\\.providers\\.0\\.resource_server_credential\\.metadata\\.deep(\\.a){62} nests deeper than 64 levels, as the API refuses a body; nothing was written\n$`));
    assert.deepEqual(await tableRowCounts([], t.scratch.db), before);
  });

  it('refuses a file whose names do not all resolve, in the file or on the target, one line per problem, writing nothing (exit 1)', async () => {
    const t = await freshTarget();
    const def = structuredClone(source);
    const [s1, s2] = def.secrets;
    s1.dek_alias = 'ghost';
    s2.data_encryption_key_id = 'no-such-dek';
    def.providers.push(structuredClone(def.providers[0]));
    const before = await tableRowCounts([], t.scratch.db);
    const r = await applyTo(t.stack.api.url, write('unresolved.json', def));
    assert.equal(r.code, 1, r.stdout + r.stderr);
    const lines = r.stderr.trim().split('\n');
    assert.equal(lines[0], 'Error: the file cannot be applied as it is; nothing was written:');
    assert.deepEqual(lines.slice(1).sort(), [
      `  data_encryption_key_id 'no-such-dek' is neither a DEK of the file nor one on the target (secret ${s2.key} (${s2.id}))`,
      `  dek_alias 'ghost' is neither an alias of the file's DEKs nor one on the target (secret ${s1.key} (${s1.id}))`,
      '  provider off is listed twice',
    ]);
    assert.doesNotMatch(r.stdout, /created/);
    assert.deepEqual(await tableRowCounts([], t.scratch.db), before);
  });

  it('imports nothing under an alias the target has on a DEK of its own (a conflict), and compares what is there with the DEK the alias names on the target (exit 1)', async () => {
    const t = await freshTarget();
    const tc = t.stack.client;
    const own = await ok(tc.post(`${E}/envelope/default-envelope.key/dek`, {}));
    await ok(tc.post(`${E}/dek/alias`, { alias: 'payments', dek_id: own.id }));
    const def = structuredClone(source);
    const p1 = def.secrets.find((s: any) => s.dek_alias === 'payments');
    const card = def.providers[0].resource_server_credential;
    card.dek_alias = 'payments';
    // Before, the secret was imported under the target's `payments`, re-sealed with its DEK, and counted created.
    const r = await applyTo(t.stack.api.url, write('alias-clash.json', def));
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, new RegExp(`conflict: alias payments: it names DEK ${own.id}, not \\S+; left as it is`));
    assert.match(r.stderr, new RegExp(`failed: secret p1 \\(${p1.id}\\): its alias 'payments' is a conflict \\(above\\): not imported`));
    assert.match(r.stderr, new RegExp(`failed: resource server credential ${card.id} of provider off: its alias 'payments' is a conflict \\(above\\): not imported`));
    assert.match(r.stderr, new RegExp(`failed: provider off: its credential ${card.id} failed \\(above\\): not made`));
    assert.match(r.stdout, /secrets: 2 created, 0 already there, 0 conflicts, 1 failed/);
    assert.equal((await tc.get(`/api/secret/v1/${p1.id}`)).status, 404);
    assert.equal((await tc.get(`${B}/provider/off`)).status, 404);

    // As an earlier release imported it: re-sealed with the target's DEK of that alias. Still the
    // file's value: there (it was 'conflict: its value differs', on every run).
    await ok(tc.post('/api/secret/v1/import', { id: p1.id, key: p1.key, encrypted_value: p1.encrypted_value, dek_alias: 'payments', data_encryption_key_id: p1.data_encryption_key_id }));
    const again = await applyTo(t.stack.api.url, write('alias-clash.json', def));
    assert.equal(again.code, 1, again.stdout + again.stderr);
    assert.doesNotMatch(again.stderr, /conflict: secret/);
    assert.match(again.stdout, /secrets: 0 created, 3 already there, 0 conflicts, 0 failed/);
  });

  // A file whose `off` and a new `off-too` share one credential, and a target with the file's DEKs,
  // `off` on a credential of its own (`mine`) and the file's credential's id imported as `imported`
  // makes it of the file's.
  async function sharedCredentialTarget(imported: (card: any) => unknown) {
    const t = await freshTarget();
    const tc = t.stack.client;
    const def = structuredClone(source);
    const off = def.providers[0];
    const card = off.resource_server_credential;
    def.providers.push({ ...structuredClone(off), id: 'off-too', status: 'active', functions: [] });
    assert.equal((await applyTo(t.stack.api.url, write('keys-only.json', { ...source, secrets: [], providers: [] }))).code, 0);
    const mine = await ok(tc.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, metadata: {} }));
    await ok(tc.post(avail('stripe', 'api_key'), { provider_instance_id: 'off', display_name: off.display_name, resource_server_credential_id: mine.id }));
    await ok(tc.post(`${avail('stripe', 'api_key')}/credential/resource-server/import`, imported(card)));
    return { t, tc, def, card, mine };
  }

  it('makes no provider on a credential found a conflict at another provider that shares it (exit 1)', async () => {
    // The target's credential of the file's credential's id is unlike it.
    const { t, tc, def, card, mine } = await sharedCredentialTarget((card) => ({ ...card, metadata: { team: 'someone else' } }));
    // Before, `off-too` was made on the target's unlike credential of that id.
    const r = await applyTo(t.stack.api.url, write('shared-conflict.json', def));
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, new RegExp(`conflict: resource server credential ${card.id} of provider off: provider off has credential ${mine.id} in its place; left as it is`));
    assert.match(r.stderr, new RegExp(`failed: provider off-too: its credential ${card.id} on the target is not the file's \\(the conflict above\\): not made`));
    assert.equal((await tc.get(`${B}/provider/off-too`)).status, 404);
  });

  it('makes a provider on a credential the target has as the file has it, though another provider that shares it has a credential of its own in its place (exit 1)', async () => {
    // The target has the file's credential as the file has it.
    const { t, tc, def, card, mine } = await sharedCredentialTarget((card) => card);
    const r = await applyTo(t.stack.api.url, write('shared-alike.json', def));
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, new RegExp(`conflict: resource server credential ${card.id} of provider off: provider off has credential ${mine.id} in its place; left as it is`));
    assert.doesNotMatch(r.stderr, /off-too/);
    // Before, `off-too` was refused: its credential was taken for unlike the file's without being looked up.
    assert.equal((await provider(tc, 'off-too')).resource_server_credential_id, card.id);
  });

  it('applies an export of a source with rows its catalog no longer has: a retired function left out, a provider of a retired controller failed on its own, the rest applied (exit 1)', async () => {
    const db = testDb();
    // As a release that removed them leaves the rows (test/bridge-catalog-removed.test.ts).
    const c = a.client;
    const cred = await ok(c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } }));
    await ok(c.post(avail('stripe', 'api_key'), { provider_instance_id: 'legacy', display_name: 'Legacy', resource_server_credential_id: cred.id }));
    await db('provider_instances').where({ id: 'legacy' }).update({ provider_controller_type_id: 'retired_provider' });
    await db('bridge_credentials').where({ id: cred.id }).update({ provider_controller_type_id: 'retired_provider' });
    await db('function_instances').insert([
      { provider_instance_id: 'off', function_controller_type_id: 'retired_function', provider_controller_type_id: 'stripe' },
      { provider_instance_id: 'legacy', function_controller_type_id: 'retired_function', provider_controller_type_id: 'retired_provider' },
    ]);
    let def: any;
    try {
      def = await exported(c);
    } finally {
      await db('function_instances').where({ function_controller_type_id: 'retired_function' }).delete();
      await db('provider_instances').where({ id: 'legacy' }).delete();
      await db('bridge_credentials').where({ id: cred.id }).delete();
    }
    // Left out, as the API's lists leave it out: the target's catalog has it no more than the source's.
    assert.deepEqual(def.providers.find((p: any) => p.id === 'off').functions, ['stripe_process_refund']);
    // The exporter is told what was left out and why (before, only the API's log said so).
    assert.deepEqual(def.omitted, [{
      kind: 'function_instance', provider_id: 'legacy', provider_controller_type_id: 'retired_provider', function_controller_type_id: 'retired_function',
      reason: "provider controller 'retired_provider' is not in this release's catalog",
    }, {
      kind: 'function_instance', provider_id: 'off', provider_controller_type_id: 'stripe', function_controller_type_id: 'retired_function',
      reason: "function 'retired_function' is not one of provider controller 'stripe' in this release's catalog",
    }]);
    // A hand-edited function the target's catalog lacks, on an instance it can make.
    def.providers.push({ ...structuredClone(def.providers.find((p: any) => p.id === 'off')), id: 'other', status: 'active', functions: ['no_such_function'] });
    const t = await freshTarget();
    // Before, the whole file was refused: "is not in the target's catalog ...; nothing was written".
    const r = await applyTo(t.stack.api.url, write('retired.json', def));
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, new RegExp(`failed: resource server credential ${cred.id} of provider legacy: provider_controller_type_id 'retired_provider' is not in the target's catalog: not imported`));
    assert.match(r.stderr, /failed: provider legacy: provider_controller_type_id 'retired_provider' is not in the target's catalog: not made/);
    assert.match(r.stderr, /failed: function no_such_function of provider other: function 'no_such_function' is not one of provider controller 'stripe' in the target's catalog: not enabled/);
    assert.match(r.stdout, /secrets: 3 created, 0 already there, 0 conflicts, 0 failed/);
    assert.match(r.stdout, /providers: 2 created, 0 updated, 0 already there, 0 conflicts, 1 failed/);
    assert.match(r.stdout, /functions: 1 created, 0 already there, 0 conflicts, 1 failed/);
    assert.match(r.stdout, /the export left out 2 items \(its omitted list\), not applied: function retired_function of provider legacy, function retired_function of provider off/);
    assert.deepEqual((await provider(t.stack.client, 'off')).functions, ['stripe_process_refund']);
    assert.equal((await t.stack.client.get(`${B}/provider/legacy`)).status, 404);
  });

  it('reports a DEK of the file whose id a DEK deleted on the target had as failed, naming why, not as there (exit 1)', async () => {
    const t = await freshTarget();
    const tc = t.stack.client;
    const payments = source.envelope_keys.flatMap((k: any) => k.data_encryption_keys).find((d: any) => d.aliases.includes('payments'));
    // On the target, the DEK of that id made a queued rotation's new DEK (as a worker that died after
    // making it leaves it), deleted as the cancel is applied at once: no worker runs there.
    await ok(tc.post(`${E}/envelope/default-envelope.key/dek/import`, { id: payments.id, encrypted_data_encryption_key: payments.encrypted_data_encryption_key }));
    const rotation = await ok(tc.post(`${E}/dek/alias/default/rotate`), 202);
    const from = (await ok(tc.get(`${E}/dek/alias/default`), 200)).id;
    await t.scratch.db('key_jobs').where({ id: rotation.id }).update({ params: JSON.stringify({ alias: 'default', prepared_dek_id: payments.id, prepared_from_dek_id: from }) });
    assert.equal((await ok(tc.post(`${E}/job/${rotation.id}/cancel`), 200)).status, 'canceled');
    assert.equal(await t.scratch.db('deks').where({ id: payments.id }).first(), undefined, 'the cancel deleted it');

    const r = await applyTo(t.stack.api.url);
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, new RegExp(`failed: DEK ${payments.id}: 409 DEK id '${payments.id}' was used by a DEK deleted at \\S+; the id of a deleted DEK is never used again: choose another`), r.stderr);
    assert.match(r.stdout, /deks: 1 created, 0 already there, 0 conflicts, 1 failed/, r.stdout);
    assert.equal(await t.scratch.db('deks').where({ id: payments.id }).first(), undefined);
  });

  it('goes on past a provider whose controller this command does not know, to the summary (exit 1)', async () => {
    const t = await freshTarget();
    assert.equal((await applyTo(t.stack.api.url)).code, 0);
    // A target of another release, whose catalog has a provider controller this command's lacks.
    const newer = await proxy(t.stack.api.url, async (req, res) => {
      if (!req.url!.startsWith(`${B}/available-providers?`)) return false;
      const page: any = await (await fetch(t.stack.api.url + req.url, { headers: { authorization: req.headers.authorization! } })).json();
      page.items.push({ type_id: 'nope', credential_controllers: [{ type_id: 'api_key' }], functions: [{ type_id: 'stripe_process_refund' }] });
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(page));
      return true;
    });
    const def = structuredClone(source);
    def.providers[0].provider_controller_type_id = 'nope';
    try {
      const r = await applyTo(newer.url, write('newer.json', def));
      assert.equal(r.code, 1, r.stdout + r.stderr);
      assert.match(r.stderr, new RegExp(`failed: resource server credential ${def.providers[0].resource_server_credential.id} of provider off: provider controller 'nope' not found`));
      assert.match(r.stderr, /conflict: provider off: its provider_controller_type_id differs; left as it is/);
      assert.match(r.stdout, /Summary:\n {2}deks: 0 created, 2 already there/);
      assert.match(r.stdout, / {2}credentials: 0 created, 0 already there, 0 conflicts, 1 failed\n {2}providers: 0 created, 0 updated, 0 already there, 1 conflicts, 0 failed\n {2}functions: 0 created, 1 already there/);
    } finally {
      newer.close();
    }
  });

  it('stops, writing nothing, at a --url that answers but is not the API (exit 1)', async () => {
    const page = await proxy('http://127.0.0.1:9', (req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/html' }).end('<html>hello</html>');
      return true;
    });
    try {
      const r = await applyTo(page.url);
      assert.equal(r.code, 1, r.stdout + r.stderr);
      assert.equal(r.stdout, '');
      assert.match(r.stderr, new RegExp(`^Error: GET /api/bridge/v1/available-providers at ${page.url} answered 200 text/html, not JSON: it does not look like the taskbridge API; check --url`));
    } finally {
      page.close();
    }
  });

  it('applies a secret or a provider\'s function the file lists more than once as one (exit 0)', async () => {
    const t = await freshTarget();
    const def = structuredClone(source);
    const [first] = def.secrets;
    // Applied 8 at a time: the copies are looked up and imported at once.
    def.secrets.splice(1, 0, structuredClone(first), structuredClone(first));
    // The second enable was refused (409 already enabled): failed, exit 1.
    def.providers[0].functions.push(...def.providers[0].functions);
    const f = write('twice.json', def);
    // A dry run counts the copies as the run finds them (before: all 5 secrets and 2 functions 'to create').
    const dry = await cli(['definition', 'apply', f, '--url', t.stack.api.url, '--dry-run']);
    assert.equal(dry.code, 0, dry.stdout + dry.stderr);
    assert.match(dry.stdout, /secrets: 3 to create, 2 already there, 0 conflicts, 0 failed/);
    assert.match(dry.stdout, /functions: 1 to create, 1 already there, 0 conflicts, 0 failed/);
    const r = await applyTo(t.stack.api.url, f);
    // The target's first start took the copied key file as its own, and says so (it said 'created').
    assert.ok(t.stack.api.logs.some((l) => l.includes('adopted the key file found in KEYS_DIR as the first local envelope key')), t.stack.api.logs.join('\n'));
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.equal(r.stderr, '');
    assert.match(r.stdout, /secrets: 3 created, 2 already there, 0 conflicts, 0 failed/);
    assert.match(r.stdout, /functions: 1 created, 1 already there, 0 conflicts, 0 failed/);
    const secrets = await ok(t.stack.client.get('/api/secret/v1?page_size=100'), 200);
    assert.deepEqual(secrets.secrets.map((s: any) => s.key).sort(), source.secrets.map((s: any) => s.key).sort());
    assert.deepEqual((await ok(t.stack.client.get(`${B}/provider/off`), 200)).functions.map((f: any) => f.function_controller_type_id), ['stripe_process_refund']);
  });

  it('applies a file holding secrets whose keys earlier releases stored (`a/`, `a/../b`, before such keys were refused): there, they count as there (exit 0); a target without them refuses their import, naming them, and takes the rest (exit 1)', async () => {
    const db = testDb();
    // As earlier releases stored them: keys no secret can be created with now.
    const stored = await db('secrets').where({ key: 's1' }).first();
    const ids = { 'a/': randomUUID(), 'a/../b': randomUUID() };
    await db('secrets').insert(Object.entries(ids).map(([key, id]) => ({ ...stored, id, key })));
    let f: string;
    let count: number;
    try {
      const def = await exported(a.client);
      count = def.secrets.length;
      f = write('old-keys.json', def);
      // Before, the file was refused whole (exit 2): "file.secrets.3.key must not begin or end with "/" ...".
      const r = await applyTo(a.api.url, f);
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.match(r.stdout, new RegExp(`secrets: 0 created, ${count} already there, 0 conflicts, 0 failed`));
      assert.match(r.stdout, /Nothing to do/);
    } finally {
      await db('secrets').whereIn('id', Object.values(ids)).delete();
    }
    // Creating them is what the stricter rules refuse.
    const t = await freshTarget();
    const r = await applyTo(t.stack.api.url, f);
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, new RegExp(`failed: secret a/ \\(${ids['a/']}\\): 400 .*must not begin or end with "/"`));
    assert.match(r.stderr, new RegExp(`failed: secret a/\\.\\./b \\(${ids['a/../b']}\\): 400 .*must not be "\\." or "\\.\\.", nor have such a part between slashes`));
    assert.match(r.stdout, new RegExp(`secrets: ${count - 2} created, 0 already there, 0 conflicts, 2 failed`));
    const keys = (await ok(t.stack.client.get('/api/secret/v1?page_size=100'), 200)).secrets.map((s: any) => s.key);
    assert.deepEqual(keys.filter((k: string) => k.startsWith('a/')), []);
  });

  it('applies a file holding a DEK id and an alias earlier releases stored (`.`, `..`, before such names were refused): a target without them refuses their import, naming them, and takes the rest (exit 1)', async () => {
    const db = testDb();
    // As earlier releases stored them: names no DEK or alias can be created with now.
    const payments = await db('dek_aliases').where({ alias: 'payments' }).first();
    const stored = await db('deks').where({ id: payments.dek_id }).first();
    await db('deks').insert({ ...stored, id: '.' });
    await db('dek_aliases').insert({ ...payments, alias: '..', dek_id: '.' });
    let def: any;
    try {
      def = await exported(a.client);
    } finally {
      await db('dek_aliases').where({ alias: '..' }).delete();
      await db('deks').where({ id: '.' }).delete();
    }
    const t = await freshTarget();
    // Before, the file was refused whole (exit 2): "file.envelope_keys.0.data_encryption_keys.….id must not be "." or ".."".
    const r = await applyTo(t.stack.api.url, write('old-names.json', def));
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stderr, /^failed: DEK \.: 400 .*must not be "\." or "\.\."/m);
    assert.match(r.stderr, /^failed: alias \.\.: 400 .*must not be "\." or "\.\."/m);
    assert.match(r.stdout, new RegExp(`deks: ${dekIds(def).size - 1} created, 0 already there, 0 conflicts, 1 failed`));
    assert.match(r.stdout, new RegExp(`secrets: ${def.secrets.length} created, 0 already there, 0 conflicts, 0 failed`));
    assert.match(r.stdout, /providers: 1 created, 0 updated, 0 already there, 0 conflicts, 0 failed/);
    assert.equal((await t.stack.client.get(`${E}/dek/alias/payments`)).status, 200);
  });

  it('warns of each member of the file it does not know, naming its path, and applies the rest as it is (exit 0)', async () => {
    const def = await exported(a.client);
    def.providers[0].return_on_sucessful_brokering = { type: 'url', url: 'https://app.example/done' };
    def.envelope_keys[0].data_encryption_keys[0].rotates_at = null;
    def.comment = 'hand-edited';
    // Before, dropped without a word: the misspelt member's return address was not made, exit 0.
    const r = await applyTo(a.api.url, write('unknown-members.json', def));
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.equal(r.stderr, [
      'warning: file.envelope_keys.0.data_encryption_keys.0.rotates_at is not a member of a definition export this command knows: ignored (misspelt, or of a newer release\'s export)',
      'warning: file.providers.0.return_on_sucessful_brokering is not a member of a definition export this command knows: ignored (misspelt, or of a newer release\'s export)',
      'warning: file.comment is not a member of a definition export this command knows: ignored (misspelt, or of a newer release\'s export)',
      '',
    ].join('\n'));
    assert.match(r.stdout, /Nothing to do/);
  });

  it('waits out a 429 (the target\'s RATE_LIMIT_PER_SECOND) or 503 (busy a moment) for its Retry-After, the check before any write too, applying everything (exit 0)', async () => {
    const t = await freshTarget({ RATE_LIMIT_PER_SECOND: '5' });
    // The target busy at the first request, the catalog's.
    let seen = 0;
    const busy = await proxy(t.stack.api.url, (req, res) => {
      if (seen++ > 0) return false;
      req.resume();
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1' }).end(JSON.stringify({ message: 'Service unavailable' }));
      return true;
    });
    try {
      const r = await applyTo(busy.url);
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.equal(r.stderr, '');
      assert.match(r.stdout, /secrets: 3 created, 0 already there, 0 conflicts, 0 failed/);
      assert.match(r.stdout, /functions: 1 created, 0 already there, 0 conflicts, 0 failed/);
    } finally {
      busy.close();
    }
    assert.deepEqual((await t.scratch.db('secrets').pluck('key')).sort(), source.secrets.map((s: any) => s.key).sort());
  });

  it('applies an alias named like a DEK id (the alias look-up answers that DEK for a name no alias has) and an alias named like its own DEK; run again, finds them there (exit 0)', async () => {
    const c = a.client;
    // The API allows both: a DEK given an id, and another DEK's alias named like it.
    await ok(c.post(`${E}/envelope/default-envelope.key/dek`, { id: 'dek-one' }));
    const other = await ok(c.post(`${E}/envelope/default-envelope.key/dek`, {}));
    await ok(c.post(`${E}/dek/alias`, { alias: 'dek-one', dek_id: other.id }));
    await ok(c.post(`${E}/dek/alias`, { alias: 'one', dek_id: 'dek-one' }));
    await ok(c.post(`${E}/envelope/default-envelope.key/dek`, { id: 'self' }));
    await ok(c.post(`${E}/dek/alias`, { alias: 'self', dek_id: 'self' }));
    for (const [key, alias] of [['under-one', 'one'], ['under-dek-one', 'dek-one'], ['under-self', 'self']]) await ok(c.post('/api/secret/v1', { key, raw_value: `v-${key}`, dek_alias: alias }));
    const file = write('dek-named.json', await exported(c));

    const t = await freshTarget();
    const first = await applyTo(t.stack.api.url, file);
    assert.equal(first.code, 0, first.stdout + first.stderr);
    assert.equal(first.stderr, '');
    for (const alias of ['dek-one', 'one', 'self']) {
      const res = await t.stack.client.post(`${E}/dek/alias`, { alias, dek_id: other.id });
      assert.equal(res.status, 409, `alias ${alias} was not made: ${res.text}`);
    }
    assert.equal((await ok(t.stack.client.get(`${E}/dek/alias/dek-one`), 200)).id, other.id);
    const values = Object.values(await decrypted(t.stack.client)).map((s: any) => s.value);
    for (const key of ['under-one', 'under-dek-one', 'under-self']) assert.ok(values.includes(`v-${key}`), key);

    const again = await applyTo(t.stack.api.url, file);
    assert.equal(again.code, 0, again.stdout + again.stderr);
    assert.match(again.stdout, /Nothing to do/);
  });

  it('refuses a file too large to read whole, saying how to apply it in parts; applied so, the whole is there (exit 2, then 0)', async () => {
    // Sparse: past the longest string Node.js holds (512 MiB) without writing it. Before, 'cannot read …: Invalid string length'.
    const large = path.join(dir, 'large.json');
    fs.closeSync(fs.openSync(large, 'w'));
    fs.truncateSync(large, constants.MAX_STRING_LENGTH + 1);
    try {
      const r = await applyTo('http://127.0.0.1:9', large);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, /large\.json is too large to read whole \(over 511 MiB\): apply it in parts, each the file with fewer items: first with its envelope_keys only \(secrets and providers empty\), then with no envelope_keys and some of its secrets or providers/);
    } finally {
      fs.rmSync(large);
    }
    // The parts as the message has them: the keys, then the secrets, then the providers.
    const t = await freshTarget();
    const parts = [{ secrets: [], providers: [] }, { envelope_keys: [], providers: [] }, { envelope_keys: [], secrets: [] }];
    for (const [i, part] of parts.entries()) {
      const r = await applyTo(t.stack.api.url, write(`part-${i}.json`, { ...source, ...part }));
      assert.equal(r.code, 0, r.stdout + r.stderr);
    }
    const whole = await applyTo(t.stack.api.url);
    assert.equal(whole.code, 0, whole.stdout + whole.stderr);
    assert.match(whole.stdout, /Nothing to do/);
  });

  it('stops at a request the target does not answer within --timeout (headers or body), naming it; run again, goes on from there (exit 1, then 0)', async () => {
    const c = a.client;
    await ok(c.post('/api/secret/v1', { key: 'slow/1', raw_value: 'v-slow' }));
    const file = write('slow.json', await exported(c));
    const t = await freshTarget();
    // The first secret import held unanswered, as a target stuck behind a lock would hold it: the run
    // said 'cannot reach the API' after 60 s, though the API had been reached.
    const held: http.ServerResponse[] = [];
    const stuck = await proxy(t.stack.api.url, (req, res) => {
      if (req.method !== 'POST' || req.url !== '/api/secret/v1/import' || held.length) return false;
      held.push(res);
      return true;
    });
    try {
      const r = await cli(['definition', 'apply', file, '--url', stuck.url, '--timeout', '1']);
      assert.equal(r.code, 1, r.stdout + r.stderr);
      assert.match(r.stderr.trim().split('\n').at(-1)!, /^Error: the API at \S+ did not answer POST \/api\/secret\/v1\/import within 1 s \(--timeout\); stopped \(what was applied so far stays/);
      assert.equal(held.length, 1);
    } finally {
      for (const res of held) res.destroy();
      stuck.close();
    }
    // An answer whose headers came and whose body stops halfway: a stack trace (an uncaught
    // DOMException) before, as the timeout covered the headers only.
    const halfway = await proxy(t.stack.api.url, (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"items": [');
      held.push(res);
      return true;
    });
    try {
      const r = await cli(['definition', 'apply', file, '--url', halfway.url, '--timeout', '1']);
      assert.equal(r.code, 1, r.stdout + r.stderr);
      assert.match(r.stderr.trim().split('\n').at(-1)!, /^Error: the API at \S+ did not answer (GET|POST) \S+ within 1 s \(--timeout\); stopped \(what was applied so far stays/);
      assert.doesNotMatch(r.stderr, /\n\s+at /);
    } finally {
      for (const res of held) res.destroy();
      halfway.close();
    }
    const r = await applyTo(t.stack.api.url, file);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /secrets: \d+ created, \d+ already there, 0 conflicts, 0 failed/);
  });

  it('stops taking secrets once one of those applied at once finds the API out of reach, and says so once those under way are done (exit 1)', async () => {
    const c = a.client;
    for (let i = 0; i < 40; i++) await ok(c.post('/api/secret/v1', { key: `many/${i}`, raw_value: `v-${i}` }));
    const file = write('many.json', await exported(c));
    const t = await freshTarget();
    // The fifth secret import's connection cut, as a load balancer may: the others went on importing
    // every secret left in the file after the run had said it stopped.
    let imports = 0;
    const cut = await proxy(t.stack.api.url, (req) => {
      if (req.method !== 'POST' || req.url !== '/api/secret/v1/import' || ++imports !== 5) return false;
      req.socket.destroy();
      return true;
    });
    try {
      const r = await applyTo(cut.url, file);
      assert.equal(r.code, 1, r.stdout + r.stderr);
      assert.match(r.stderr.trim().split('\n').at(-1)!, /^Error: cannot reach the API at \S+: .*; stopped \(what was applied so far stays/);
      assert.doesNotMatch(r.stdout, /^secrets:/m);
      // Those under way at the cut (8 at a time) finish; no other is begun.
      assert.ok(imports <= 5 + 7, `${imports} secret imports, of ${JSON.parse(fs.readFileSync(file, 'utf8')).secrets.length}`);
    } finally {
      cut.close();
    }
    const r = await applyTo(t.stack.api.url, file);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /secrets: \d+ created, \d+ already there, 0 conflicts, 0 failed/);
  });
  it('applies an export twice at once, each item made by one run and found there by the other (both exit 0)', async () => {
    const c = a.client;
    for (let i = 0; i < 6; i++) {
      const dek = await ok(c.post(`${E}/envelope/default-envelope.key/dek`, {}));
      for (let j = 0; j < 5; j++) await ok(c.post(`${E}/dek/alias`, { alias: `race-${i}-${j}`, dek_id: dek.id }));
      for (let j = 0; j < 3; j++) await ok(c.post('/api/secret/v1', { key: `race/${i}-${j}`, raw_value: 'v', dek_alias: `race-${i}-${j}` }));
    }
    for (let i = 0; i < 15; i++) {
      const card = await ok(c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: `${STRIPE_KEY}${i}` } }));
      await ok(c.post(avail('stripe', 'api_key'), { provider_instance_id: `race-${i}`, display_name: `Race ${i}`, resource_server_credential_id: card.id }));
      await ok(c.post(`${B}/provider/race-${i}/function/stripe_process_refund/enable`, {}));
      if (i % 3 === 0) await ok(c.patch(`${B}/provider/race-${i}`, { status: 'disabled' }), 200);
    }
    const def = await exported(c);
    const file = write('race.json', def);
    const t = await freshTarget();
    // Before, a 409 of an alias, provider or function made meanwhile by the other run was a failure: both exit 1.
    const runs = await Promise.all([applyTo(t.stack.api.url, file), applyTo(t.stack.api.url, file)]);
    for (const r of runs) assert.equal(r.code, 0, r.stdout + r.stderr);
    const summary = (r: CliRun, kind: string) => {
      const m = r.stdout.match(new RegExp(`^  ${kind}: (\\d+) created, (?:\\d+ updated, )?(\\d+) already there, 0 conflicts, 0 failed$`, 'm'));
      assert.ok(m, `${kind}: ${r.stdout}`);
      return { created: Number(m[1]), present: Number(m[2]) };
    };
    // Every alias of the file but `default`, which the target has from its first start (both runs may point it).
    const totals = {
      deks: dekIds(def).size, aliases: aliasTargets(def).size - 1, secrets: def.secrets.length,
      credentials: new Set(def.providers.flatMap((p: any) => [p.resource_server_credential?.id, p.user_credential?.id].filter(Boolean))).size, providers: def.providers.length, functions: def.providers.reduce((n: number, p: any) => n + p.functions.length, 0),
    };
    for (const [kind, total] of Object.entries(totals)) {
      const [one, other] = runs.map((r) => summary(r, kind));
      assert.equal(one.created + other.created, total, kind);
    }
    const again = await applyTo(t.stack.api.url, file);
    assert.equal(again.code, 0, again.stdout + again.stderr);
    assert.match(again.stdout, /Nothing to do/);
    const onTarget = await exported(t.stack.client);
    assert.deepEqual(onTarget.providers.map((p: any) => [p.id, p.status, p.functions]), def.providers.map((p: any) => [p.id, p.status, p.functions]));
    assert.deepEqual(onTarget.secrets.map((s: any) => s.id).sort(), def.secrets.map((s: any) => s.id).sort());
  });
});

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import { assertError, requestLogsThrough, ROOT, testDb, textMessage, useStack, waitFor, withQueue, type Client } from './helpers/stack.ts';
import { sealByHand } from './helpers/aes-gcm-by-hand.ts';

const S = '/api/secret/v1';
const E = '/api/encryption/v1';

describe('secret API', () => {
  const stack = useStack({}, { workers: 0 });
  let c: Client;
  const values: string[] = []; // every raw value sent, to look for in logs
  const value = () => {
    const v = `sv-${randomUUID()}`;
    values.push(v);
    return v;
  };
  const keyWith = async (scopes: string[]) => (await c.post('/api/auth/v1/api-key', { name: scopes.join(' '), scopes })).body.key as string;

  before(() => { c = stack.client; });

  it('creates a secret under the default alias and never returns its value', async () => {
    const raw = value();
    const r = await c.post(S, { key: 'db.password', raw_value: raw });
    assert.equal(r.status, 201);
    assert.deepEqual(Object.keys(r.body).sort(), ['created_at', 'dek_alias', 'encrypted_secret', 'id', 'key', 'updated_at']);
    assert.equal(r.body.key, 'db.password');
    assert.equal(r.body.dek_alias, 'default');
    assert.match(r.body.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(!r.text.includes(raw));
    const row = await testDb()('secrets').where({ id: r.body.id }).first();
    const alias = await testDb()('dek_aliases').where({ alias: 'default' }).first();
    assert.equal(row.dek_id, alias.dek_id);
    assert.ok(!row.encrypted_secret.includes(raw));
  });

  it('rejects duplicate keys (409), unknown aliases (404) and bad bodies (400) without storing anything', async () => {
    const count = async () => Number((await testDb()('secrets').count({ n: '*' }))[0].n);
    const before = await count();
    const dup = await c.post(S, { key: 'db.password', raw_value: value() });
    assert.equal(dup.status, 409);
    assert.equal(dup.body.data.code, 'conflict');
    const unknown = await c.post(S, { key: 'other', raw_value: value(), dek_alias: 'no-such-alias' });
    assert.equal(unknown.status, 404);
    assert.equal(unknown.body.data.resource, 'dek_alias');
    const bad: [unknown, string][] = [
      [{ key: 'has space', raw_value: 'x' }, 'body.key'],
      [{ key: 'x'.repeat(257), raw_value: 'x' }, 'body.key'],
      [{ key: '', raw_value: 'x' }, 'body.key'],
      [{ key: 'ünï', raw_value: 'x' }, 'body.key'],
      [{ key: 'ok' }, 'body.raw_value'],
      [{ key: 'ok', raw_value: 42 }, 'body.raw_value'],
      [{ key: 'ok', raw_value: 'x', extra: true }, 'body.extra'],
      [{ key: 'ok', raw_value: 'x', dek_alias: 'bad alias' }, 'body.dek_alias'],
    ];
    for (const [body, where] of bad) {
      const r = await c.post(S, body);
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.body.data.code, 'invalid_request');
      assert.ok(r.body.data.errors.some((e: { path: string }) => e.path === where), `${JSON.stringify(body)}: ${JSON.stringify(r.body.data.errors)}`);
    }
    assert.equal((await c.request('POST', S, undefined, { raw: '{"key": ', headers: { 'content-type': 'application/json' } })).status, 400);
    assert.equal(await count(), before);
  });

  it('does not quote a body that is not JSON back in its 400: a raw value sent unquoted stays out of the answer', async () => {
    const raw = value();
    for (const text of [`{"key": "k", "raw_value": ${raw}}`, `${raw}`, `{"key": "k", "raw_value": "${raw}"} ${raw}`]) {
      const r = await c.request('POST', S, undefined, { raw: text, headers: { 'content-type': 'application/json' } });
      assertError(r, 400, 'invalid_request');
      assert.match(r.body.message, /^Request body is not valid JSON/);
      assert.ok(!r.text.includes(raw.slice(0, 6)), `the answer quotes the body: ${r.text}`);
    }
    // MCP reads its body the same way and answers -32700 with that message.
    const mcp = await c.request('POST', '/api/bridge/v1/mcp', undefined, {
      raw: `{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {"api_key": ${raw}}}}`,
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    });
    assert.equal(mcp.status, 400);
    assert.equal(mcp.body.error.code, -32700);
    assert.ok(!mcp.text.includes(raw.slice(0, 6)), `the answer quotes the body: ${mcp.text}`);
  });

  it('accepts keys of 256 chars with / . - _ and gets them by key (slash encoded as %2F) and by id', async () => {
    const long = 'k'.repeat(256);
    assert.equal((await c.post(S, { key: long, raw_value: value() })).status, 201);
    const created = await c.post(S, { key: 'team/stripe.api-key_live', raw_value: value() });
    assert.equal(created.status, 201);
    const byKey = await c.get(`${S}/key/${encodeURIComponent('team/stripe.api-key_live')}`);
    assert.equal(byKey.status, 200);
    assert.deepEqual(byKey.body, created.body);
    assert.equal((await c.get(`${S}/key/${long}`)).body.key, long);
    const byId = await c.get(`${S}/${created.body.id}`);
    assert.equal(byId.status, 200);
    assert.deepEqual(byId.body, created.body);

    // Looked up by key, the 404 names the key as `key` (as a 409 on a taken key does), not as an id.
    const missing = await c.get(`${S}/key/missing.key`);
    assertError(missing, 404, 'not_found');
    assert.equal(missing.body.message, "secret with key 'missing.key' not found");
    assert.deepEqual(missing.body.data, { code: 'not_found', resource: 'secret', key: 'missing.key' });
    // Its slash sent as it is, the key is no route: the answer says how to send it.
    const unencoded = await c.get(`${S}/key/team/stripe.api-key_live`);
    assertError(unencoded, 404, 'not_found');
    assert.equal(unencoded.body.message, `No route for GET ${S}/key/team/stripe.api-key_live (if the key holds '/', send it percent-encoded: %2F)`);
    // However many slashes (compared segment by segment, not by a backtracking pattern).
    assert.match((await c.get(`${S}/key/${'a/'.repeat(1500)}b`)).body.message, /\(if the key holds '\/', send it percent-encoded: %2F\)$/);
    // A parameter that never holds '/' (a UUID) gets no such word.
    const unknown = await c.get(`${S}/${created.body.id}/nothing`);
    assert.equal(unknown.body.message, `No route for GET ${S}/${created.body.id}/nothing`);
    assert.equal((await c.get(`${S}/key/${'k'.repeat(257)}`)).status, 400);
    assert.equal((await c.get(`${S}/key/bad%20key`)).status, 400);
    assert.equal((await c.get(`${S}/${randomUUID()}`)).status, 404);
    const notUuid = await c.get(`${S}/not-a-uuid`);
    assert.equal(notUuid.status, 400);
    assert.equal(notUuid.body.data.errors[0].path, 'path.secret_id');
  });

  // A rule for new keys: each refused key is 400 (saying why) on create and import, storing nothing;
  // the allowed ones are stored; a key stored before the rule still reads.
  const keyRules = [
    {
      what: 'is "." or "..", or has such a part between slashes',
      why: 'must not be "." or "..", nor have such a part between slashes (a URL cannot address it)',
      // fetch sends GET .../key/%2E%2E as GET /api/secret/v1/ (the list): before, these were 201.
      refused: ['..', '.', 'a/../b', 'a/./b', './x', 'x/..'], allowed: ['...', '.hidden', 'a/.b/c..', 'v1..v2'], storedBefore: 'a/../b',
    },
    {
      what: 'has an empty part between slashes',
      why: 'must not begin or end with "/" nor hold "//" (a proxy that merges slashes, or a router that ignores a trailing one, reads it as another key)',
      // Before, these were 201: behind such a proxy GET .../key/a%2F reads the secret 'a'.
      refused: ['/', '//', 'a/', '/a', 'a//b', 'a/b/'], allowed: ['a/b/c'], storedBefore: 'trailing/',
    },
  ];
  for (const [i, rule] of keyRules.entries()) {
    it(`refuses (400, saying why) a new key that ${rule.what}, storing nothing; one stored before still reads`, async () => {
      const { encrypted_secret: encrypted } = (await c.post(S, { key: `rule.${i}.source`, raw_value: value() })).body;
      const count = async () => Number((await testDb()('secrets').count({ n: '*' }))[0].n);
      const before = await count();
      for (const key of rule.refused) {
        const created = await c.post(S, { key, raw_value: value() });
        const imported = await c.post(`${S}/import`, { key, encrypted_value: encrypted, dek_alias: 'default' });
        for (const r of [created, imported]) {
          assert.equal(r.status, 400, `${key}: ${r.text}`);
          assert.deepEqual(r.body.data.errors, [{ path: 'body.key', message: rule.why }], key);
          assert.equal(r.body.message, `Invalid body: body.key ${rule.why}`);
        }
      }
      assert.equal(await count(), before);
      for (const key of rule.allowed) assert.equal((await c.post(S, { key, raw_value: value() })).status, 201, key);

      const old = await c.post(S, { key: `rule.${i}.stored.before`, raw_value: value() });
      await testDb()('secrets').where({ id: old.body.id }).update({ key: rule.storedBefore });
      const read = await c.get(`${S}/key/${encodeURIComponent(rule.storedBefore)}`);
      assert.equal(read.status, 200, read.text);
      assert.equal(read.body.id, old.body.id);
    });
  }

  it('lists secrets in the `secrets` member with keyset pagination, encrypted only', async () => {
    for (let i = 0; i < 5; i++) assert.equal((await c.post(S, { key: `page.${i}`, raw_value: value() })).status, 201);
    const total = Number((await testDb()('secrets').count({ n: '*' }))[0].n);
    const seen: string[] = [];
    let token: string | undefined;
    let pages = 0;
    do {
      const r = await c.get(`${S}?page_size=2${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(r.status, 200);
      assert.deepEqual(Object.keys(r.body).filter((k) => k !== 'next_page_token'), ['secrets']);
      for (const s of r.body.secrets) {
        assert.ok(!('decrypted_value' in s) && !('raw_value' in s));
        seen.push(s.id);
      }
      for (const v of values) assert.ok(!r.text.includes(v));
      token = r.body.next_page_token;
      pages++;
    } while (token);
    assert.equal(seen.length, total);
    assert.equal(new Set(seen).size, total);
    assert.equal(pages, Math.ceil(total / 2));
    const last = await c.get(`${S}?page_size=1000`);
    assert.ok(!('next_page_token' in last.body));
    assert.equal(last.body.secrets[0].key, 'page.4'); // newest first
    assert.equal((await c.get(`${S}?next_page_token=garbage`)).status, 400);
    assert.equal((await c.get(`${S}?page_size=0`)).status, 400);
    assert.equal((await c.get(`${S}?page_size=1001`)).status, 400);
  });

  it('list-decrypted returns the values and needs secret:decrypt', async () => {
    const raw = value();
    const created = await c.post(S, { key: 'decrypt.me', raw_value: raw });
    const r = await c.get(`${S}/list-decrypted?page_size=1000`);
    assert.equal(r.status, 200);
    const item = r.body.secrets.find((s: { id: string }) => s.id === created.body.id);
    assert.deepEqual(Object.keys(item).sort(), ['created_at', 'decrypted_value', 'dek_alias', 'id', 'key', 'updated_at']);
    assert.equal(item.decrypted_value, raw);
    const paged = await c.get(`${S}/list-decrypted?page_size=1`);
    assert.equal(paged.body.secrets.length, 1);
    assert.ok(paged.body.next_page_token);

    const reader = c.as(await keyWith(['secret:read', 'secret:write']));
    const denied = await reader.get(`${S}/list-decrypted`);
    assert.equal(denied.status, 403);
    assert.equal(denied.body.data.required_scope, 'secret:decrypt');
    assert.equal((await reader.get(S)).status, 200);
    const decrypter = c.as(await keyWith(['secret:decrypt']));
    assert.equal((await decrypter.get(`${S}/list-decrypted`)).status, 200);
    assert.equal((await decrypter.get(S)).status, 403);
  });

  it('ends a page of large secrets at 8 MiB of values, with a token to the rest: every secret once, whatever page_size asks', async () => {
    const large = new Map<string, string>();
    for (let i = 0; i < 12; i++) {
      const raw = randomBytes(450_000).toString('hex');
      const r = await c.post(S, { key: `large.${i}`, raw_value: raw });
      assert.equal(r.status, 201, r.text);
      large.set(r.body.id, raw);
    }
    const total = (await testDb()('secrets').count({ n: '*' }))[0].n;
    for (const list of [`${S}/list-decrypted`, S]) {
      const seen: string[] = [];
      let pages = 0;
      for (let token: string | undefined; ;) {
        const r = await c.get(`${list}?page_size=1000${token ? `&next_page_token=${token}` : ''}`);
        assert.equal(r.status, 200, r.text);
        pages += 1;
        const ofLarge = r.body.secrets.filter((x: { id: string }) => large.has(x.id));
        if (list !== S) for (const x of ofLarge) assert.equal(x.decrypted_value, large.get(x.id));
        // The page stops once 8 MiB of stored values are in it: at most one value more.
        assert.ok(ofLarge.length < large.size, `${ofLarge.length} large secrets on one page`);
        if (list === S) {
          const sizes = r.body.secrets.map((x: { encrypted_secret: string }) => Buffer.byteLength(x.encrypted_secret));
          assert.ok(sizes.slice(0, -1).reduce((a: number, b: number) => a + b, 0) < 8 * 1024 * 1024, `${sizes}`);
        }
        seen.push(...r.body.secrets.map((x: { id: string }) => x.id));
        token = r.body.next_page_token;
        if (!token) break;
      }
      assert.ok(pages >= 2, `${list}: ${pages} page(s)`);
      assert.equal(new Set(seen).size, seen.length, `${list}: a secret listed twice`);
      assert.equal(seen.length, Number(total), list);
    }
    for (const id of large.keys()) assert.equal((await c.delete(`${S}/${id}`)).status, 200);
  });

  it('needs a key (401) and the right scope (403) on every route', async () => {
    const id = randomUUID();
    const routes: [string, string, unknown?][] = [
      ['POST', S, { key: 'k', raw_value: 'v' }], ['POST', `${S}/import`, { key: 'k', encrypted_value: 'AAAA', dek_alias: 'default' }],
      ['GET', S], ['GET', `${S}/list-decrypted`], ['GET', `${S}/key/k`], ['GET', `${S}/${id}`],
      ['PUT', `${S}/${id}`, { raw_value: 'v' }], ['DELETE', `${S}/${id}`],
    ];
    const none = c.as(''); // undefined would fall back to the admin key
    const taskOnly = c.as(await keyWith(['task:read', 'task:write']));
    for (const [method, url, body] of routes) {
      assert.equal((await none.request(method, url, body)).status, 401, `${method} ${url}`);
      assert.equal((await taskOnly.request(method, url, body)).status, 403, `${method} ${url}`);
    }
    const readOnly = c.as(await keyWith(['secret:read']));
    assert.equal((await readOnly.post(S, { key: 'ro', raw_value: 'v' })).status, 403);
    assert.equal((await readOnly.delete(`${S}/${id}`)).status, 403);
  });

  it('updates a value (re-encrypted, optionally under another alias) and rejects bad updates', async () => {
    const created = await c.post(S, { key: 'rotating.value', raw_value: value() });
    const id = created.body.id;
    const next = value();
    const r = await c.put(`${S}/${id}`, { raw_value: next });
    assert.equal(r.status, 200);
    assert.equal(r.body.dek_alias, 'default');
    assert.notEqual(r.body.encrypted_secret, created.body.encrypted_secret);
    assert.ok(Date.parse(r.body.updated_at) >= Date.parse(created.body.updated_at));
    assert.ok(!r.text.includes(next));
    const decrypted = async () => (await c.get(`${S}/list-decrypted?page_size=1000`)).body.secrets.find((s: { id: string }) => s.id === id).decrypted_value;
    assert.equal(await decrypted(), next);

    // A second DEK under the bootstrap envelope key, aliased `other`.
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    const dek = await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {});
    assert.equal(dek.status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek.body.id, alias: 'other' })).status, 201);
    const third = value();
    const moved = await c.put(`${S}/${id}`, { raw_value: third, dek_alias: 'other' });
    assert.equal(moved.status, 200);
    assert.equal(moved.body.dek_alias, 'other');
    assert.equal((await testDb()('secrets').where({ id }).first()).dek_id, dek.body.id);
    assert.equal(await decrypted(), third);

    const before = await testDb()('secrets').where({ id }).first();
    assert.equal((await c.put(`${S}/${randomUUID()}`, { raw_value: 'x' })).status, 404);
    assert.equal((await c.put(`${S}/${id}`, { raw_value: 'x', dek_alias: 'no-such-alias' })).status, 404);
    assert.equal((await c.put(`${S}/not-a-uuid`, { raw_value: 'x' })).status, 400);
    assert.equal((await c.put(`${S}/${id}`, { raw_value: 'x', key: 'renamed' })).status, 400);
    assert.equal((await c.put(`${S}/${id}`, {})).status, 400);
    assert.deepEqual(await testDb()('secrets').where({ id }).first(), before);
  });

  it('a value-only update racing a move to another alias keeps the move', async () => {
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id.id;
    const dek = await c.post(`${E}/envelope/${encodeURIComponent(envelope)}/dek`, {});
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek.body.id, alias: 'race-target' })).status, 201);
    const id = (await c.post(S, { key: 'racing.value', raw_value: value() })).body.id;
    for (let i = 0; i < 20; i++) {
      assert.equal((await c.put(`${S}/${id}`, { raw_value: value(), dek_alias: 'default' })).status, 200);
      const [moved, valueOnly] = await Promise.all([
        c.put(`${S}/${id}`, { raw_value: value(), dek_alias: 'race-target' }),
        c.put(`${S}/${id}`, { raw_value: value() }),
      ]);
      assert.equal(moved.status, 200, moved.text);
      assert.equal(valueOnly.status, 200, valueOnly.text);
      // Whichever committed last, the secret is under the alias it was moved to, and decrypts.
      const row = await testDb()('secrets').where({ id }).first();
      assert.equal(row.dek_alias, 'race-target', `pair ${i}`);
      assert.equal(row.dek_id, dek.body.id, `pair ${i}`);
    }
    const listed = (await c.get(`${S}/list-decrypted?page_size=1000`)).body.secrets.find((x: { id: string }) => x.id === id);
    assert.equal(typeof listed.decrypted_value, 'string');
  });

  it('deletes a secret once ({success: true}), then 404', async () => {
    const created = await c.post(S, { key: 'short.lived', raw_value: value() });
    const r = await c.delete(`${S}/${created.body.id}`);
    assert.equal(r.status, 200);
    assert.deepEqual(r.body, { success: true });
    assert.equal((await c.get(`${S}/${created.body.id}`)).status, 404);
    assert.equal((await c.delete(`${S}/${created.body.id}`)).status, 404);
    assert.equal((await c.delete(`${S}/not-a-uuid`)).status, 400);
    // The key is free again.
    assert.equal((await c.post(S, { key: 'short.lived', raw_value: value() })).status, 201);
  });

  it('imports a value encrypted elsewhere with the DEK, and rejects one that does not decrypt with it', async () => {
    // A DEK whose key material the test knows, wrapped with the bootstrap envelope key file.
    const envelope = (await c.get(`${E}/dek/alias/default`)).body.envelope_encryption_key_id;
    const kek = fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', envelope.file_name));
    const dekKey = randomBytes(32);
    const dek = await c.post(`${E}/envelope/${encodeURIComponent(envelope.id)}/dek/import`, { encrypted_data_encryption_key: sealByHand(kek, dekKey) });
    assert.equal(dek.status, 201);
    assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek.body.id, alias: 'known' })).status, 201);

    const raw = value();
    const encrypted = sealByHand(dekKey, Buffer.from(raw));
    const r = await c.post(`${S}/import`, { key: 'imported.value', encrypted_value: encrypted, dek_alias: 'known' });
    assert.equal(r.status, 201);
    assert.equal(r.body.encrypted_secret, encrypted);
    assert.equal(r.body.dek_alias, 'known');
    const listed = (await c.get(`${S}/list-decrypted?page_size=1000`)).body.secrets.find((s: { id: string }) => s.id === r.body.id);
    assert.equal(listed.decrypted_value, raw);

    // An exported secret re-imports under its alias.
    const exported = (await c.get(`${S}/key/db.password`)).body;
    assert.equal((await c.post(`${S}/import`, { key: 'db.password.copy', encrypted_value: exported.encrypted_secret, dek_alias: 'default' })).status, 201);

    const count = async () => Number((await testDb()('secrets').count({ n: '*' }))[0].n);
    const before = await count();
    for (const bad of [sealByHand(randomBytes(32), Buffer.from('x')), encrypted.slice(0, -4) + 'AAAA', 'not base64!', 'AAAA', '']) {
      const res = await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: bad, dek_alias: 'known' });
      assert.equal(res.status, 400, bad);
      assert.equal(res.body.data.errors[0].path, 'body.encrypted_value');
    }
    // It decrypts, but to what no write could send: bytes that are not UTF-8 (they would be stored
    // as U+FFFD, another value), or a NUL character; under this alias's DEK or an older one named.
    for (const [plain, why] of [[Buffer.from([0xff, 0xfe, 0x41, 0x00, 0xc3]), 'not UTF-8'], [Buffer.from([0x61, 0xff, 0x62]), 'not UTF-8'], [Buffer.from('a\u0000b'), 'a NUL character']] as const) {
      for (const body of [{ dek_alias: 'known' }, { dek_alias: 'default', data_encryption_key_id: dek.body.id }]) {
        const res = await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: sealByHand(dekKey, plain), ...body });
        assert.equal(res.status, 400, res.text);
        assert.equal(res.body.data.errors[0].path, 'body.encrypted_value');
        assert.ok(res.body.message.includes(why), res.body.message);
      }
    }
    // A leading byte order mark is part of the value, kept when re-encrypted under the alias's DEK.
    const bom = await c.post(`${S}/import`, { key: 'bom.import', encrypted_value: sealByHand(dekKey, Buffer.from([0xef, 0xbb, 0xbf, 0x61])), dek_alias: 'default', data_encryption_key_id: dek.body.id });
    assert.equal(bom.status, 201, bom.text);
    const bomRead = (await c.get(`${S}/list-decrypted?page_size=1000`)).body.secrets.find((x: { id: string }) => x.id === bom.body.id);
    assert.equal(bomRead.decrypted_value, '\ufeffa');
    assert.equal((await c.delete(`${S}/${bom.body.id}`)).status, 200);
    // Encrypted with the DEK of `known`, but named under `default`.
    assert.equal((await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: encrypted, dek_alias: 'default' })).status, 400);
    assert.equal((await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: encrypted, dek_alias: 'nope' })).status, 404);
    assert.equal((await c.post(`${S}/import`, { key: 'imported.value', encrypted_value: encrypted, dek_alias: 'known' })).status, 409);
    assert.equal((await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: encrypted })).status, 400);
    assert.equal((await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: encrypted, dek_alias: 'known', raw_value: 'x' })).status, 400);
    // A DEK named explicitly must exist and must decrypt the value.
    assert.equal((await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: encrypted, dek_alias: 'default', data_encryption_key_id: 'no-such-dek' })).status, 404);
    const wrongDek = await c.post(`${S}/import`, { key: 'bad.import', encrypted_value: exported.encrypted_secret, dek_alias: 'default', data_encryption_key_id: dek.body.id });
    assert.equal(wrongDek.status, 400);
    assert.match(wrongDek.body.message, new RegExp(`DEK '${dek.body.id}'`));
    assert.equal(await count(), before);
  });

  it('re-imports a secret written with an older DEK than its alias names now, keeping its id, under the DEK the alias names', async () => {
    const old = (await c.get(`${E}/dek/alias/known`)).body.id;
    const written = await c.post(S, { key: 'before.repoint', raw_value: 'older dek', dek_alias: 'known' });
    assert.equal(written.status, 201);
    const envelope = (await c.get(`${E}/dek/alias/known`)).body.envelope_encryption_key_id;
    const newer = await c.post(`${E}/envelope/${encodeURIComponent(envelope.id)}/dek`);
    assert.equal((await c.put(`${E}/dek/alias/known`, { new_dek_id: newer.body.id })).status, 200);
    const exported = (await c.get('/api/a2a/v1/definition')).body.secrets.find((x: { key: string }) => x.key === 'before.repoint');
    assert.deepEqual([exported.dek_alias, exported.data_encryption_key_id], ['known', old]);

    // On a fresh installation the secret would not exist yet; here it is deleted first.
    assert.equal((await c.delete(`${S}/${written.body.id}`)).status, 200);
    const body = { id: exported.id, key: exported.key, encrypted_value: exported.encrypted_value, dek_alias: exported.dek_alias };
    assert.equal((await c.post(`${S}/import`, body)).status, 400, 'the alias names the newer DEK now');
    const again = await c.post(`${S}/import`, { ...body, data_encryption_key_id: exported.data_encryption_key_id });
    assert.equal(again.status, 201, again.text);
    assert.deepEqual([again.body.id, again.body.dek_alias], [written.body.id, 'known']);
    // Re-encrypted with the DEK the alias names now, as every write is.
    assert.equal((await testDb()('secrets').where({ id: written.body.id }).first()).dek_id, newer.body.id);
    assert.notEqual(again.body.encrypted_secret, exported.encrypted_value);
    const read = (await c.get(`${S}/list-decrypted?page_size=1000`)).body.secrets.find((x: { id: string }) => x.id === written.body.id);
    assert.equal(read.decrypted_value, 'older dek');
    const dup = await c.post(`${S}/import`, { ...body, key: 'other.key', data_encryption_key_id: old });
    assert.equal(dup.status, 409, 'the id is taken');
  });

  it('says which of id and key an import found taken (409), the id in the lower case it is read in, storing nothing', async () => {
    const taken = (await c.post(S, { key: 'import.taken', raw_value: value() })).body;
    const sealed = (await c.post(S, { key: 'import.source', raw_value: value() })).body.encrypted_secret;
    const count = async () => Number((await testDb()('secrets').count({ n: '*' }))[0].n);
    const before = await count();
    const byId = await c.post(`${S}/import`, { id: taken.id.toUpperCase(), key: 'import.fresh', encrypted_value: sealed, dek_alias: 'default' });
    assert.deepEqual(byId.body, { message: `A secret with id '${taken.id}' already exists`, data: { code: 'conflict', resource: 'secret', id: taken.id } });
    const byKey = await c.post(`${S}/import`, { id: randomUUID(), key: 'import.taken', encrypted_value: sealed, dek_alias: 'default' });
    assert.deepEqual(byKey.body, { message: "A secret with key 'import.taken' already exists", data: { code: 'conflict', resource: 'secret', key: 'import.taken' } });
    assert.equal(await count(), before);
  });

  it('an alias in use by secrets cannot be deleted (409)', async () => {
    const r = await c.delete(`${E}/dek/alias/known`);
    assert.equal(r.status, 409);
  });

  it('answers list-decrypted (200) with a secret that does not open listed without its value, saying why, logged once; the rest decrypted and paged past', async () => {
    const make = async (key: string, raw: string, dek_alias?: string) => {
      const r = await c.post(S, { key, raw_value: raw, ...(dek_alias ? { dek_alias } : {}) });
      assert.equal(r.status, 201, r.text);
      return r.body.id as string;
    };
    const onKey = async (file_name: string, dek: string) => {
      assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name })).status, 201);
      assert.equal((await c.post(`${E}/envelope/${file_name}/dek`, { id: dek })).status, 201);
      assert.equal((await c.post(`${E}/dek/alias`, { dek_id: dek, alias: dek })).status, 201);
    };
    // A local key's change reaches the caches of every process (creating and deleting one drops them).
    const dropCaches = async () => {
      const name = `drop-${randomUUID()}.key`;
      assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: name })).status, 201);
      assert.equal((await c.delete(`${E}/envelope/${name}`)).status, 200);
    };
    const goodRaw = value();
    const good = await make('opens/before', goodRaw);
    // Its ciphertext changed in the table.
    const damaged = await make('damaged', value());
    await testDb()('secrets').where({ id: damaged }).update({ encrypted_secret: sealByHand(randomBytes(32), Buffer.from('x')) });
    // Its DEK's wrapped key changed in the table.
    await onKey('rewrapped.key', 'rewrapped-dek');
    const rewrapped = await make('on/rewrapped', value(), 'rewrapped-dek');
    await testDb()('deks').where({ id: 'rewrapped-dek' }).update({ encrypted_dek: sealByHand(randomBytes(32), randomBytes(32)) });
    // Its DEK's envelope key file gone.
    await onKey('gone.key', 'gone-dek');
    const gone = await make('on/gone', value(), 'gone-dek');
    const goneFile = path.join(stack.env.DATA_DIR, 'keys', 'gone.key');
    const goneKek = fs.readFileSync(goneFile);
    fs.rmSync(goneFile);
    const lastRaw = value();
    const last = await make('opens/after', lastRaw);
    await dropCaches();
    try {
      const r = await c.get(`${S}/list-decrypted?page_size=1000`);
      assert.equal(r.status, 200, r.text);
      const byId = new Map(r.body.secrets.map((x: { id: string }) => [x.id, x]));
      for (const [id, raw] of [[good, goodRaw], [last, lastRaw]]) {
        assert.deepEqual(Object.keys(byId.get(id) as object).sort(), ['created_at', 'decrypted_value', 'dek_alias', 'id', 'key', 'updated_at']);
        assert.equal((byId.get(id) as { decrypted_value: string }).decrypted_value, raw);
      }
      const marked: [string, string, string][] = [
        [damaged, 'value_does_not_decrypt', `secret 'damaged' does not decrypt with its DEK '${(await testDb()('secrets').where({ id: damaged }).first()).dek_id}'`],
        [rewrapped, 'dek_does_not_unwrap', "DEK 'rewrapped-dek' does not unwrap with envelope key 'rewrapped.key' (encrypted DEK does not decrypt with the key it names): that key is not the one it was wrapped with"],
        [gone, 'envelope_key_unusable', "local envelope key 'gone.key' cannot be read (ENOENT)"],
      ];
      for (const [id, code, message] of marked) {
        const item = byId.get(id) as Record<string, unknown>;
        assert.deepEqual(Object.keys(item).sort(), ['created_at', 'decrypt_error', 'dek_alias', 'id', 'key', 'updated_at'], id);
        assert.deepEqual(item.decrypt_error, { code, message });
      }
      for (const material of [goneKek, fs.readFileSync(path.join(stack.env.DATA_DIR, 'keys', 'rewrapped.key'))]) {
        assert.ok(!r.text.includes(material.toString('base64')) && !r.text.includes(material.toString('hex')));
      }
      // Logged at error once for this request, each secret named by id (never its value).
      const id = r.headers.get('x-request-id');
      const errors = (await requestLogsThrough(stack, r, { all: true })).filter((l) => l.includes(`"req_id":"${id}"`) && l.includes('"level":50'));
      assert.equal(errors.length, 1, errors.join('\n'));
      for (const [secret] of marked) assert.ok(errors[0].includes(secret), errors[0]);

      // One a page: the tokens go past each of them, the same rows in the same order as GET /.
      const listed: string[] = [];
      for (let token: string | undefined; ;) {
        const page = await c.get(`${S}/list-decrypted?page_size=1${token ? `&next_page_token=${token}` : ''}`);
        assert.equal(page.status, 200, page.text);
        listed.push(...page.body.secrets.map((x: { id: string }) => x.id));
        token = page.body.next_page_token;
        if (!token) break;
      }
      assert.deepEqual(listed, (await c.get(`${S}?page_size=1000`)).body.secrets.map((x: { id: string }) => x.id));
    } finally {
      fs.writeFileSync(goneFile, goneKek, { mode: 0o600 });
      await dropCaches();
    }
    for (const id of [damaged, rewrapped, gone]) assert.equal((await c.delete(`${S}/${id}`)).status, 200);
    assert.equal((await c.get(`${S}/list-decrypted?page_size=1000`)).status, 200);
  });

  it('never writes a secret value to the API log', async () => {
    assert.ok(values.length > 10);
    const logs = stack.api.logs.join('\n');
    assert.ok(logs.includes('"path":"/api/secret/v1"'), 'requests are logged');
    for (const v of values) assert.ok(!logs.includes(v), 'a raw value appears in the API log');
  });
});

describe('secrets for agents: ctx.readSecret in an agent module', () => {
  // A fresh database: this stack has its own key directory, which bootstrap fills.
  const stack = useStack({ AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test', 'fixtures', 'secret-agent.ts') });

  const runTask = async (text: string) => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage(text) });
    assert.equal(created.status, 201);
    return waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${created.body.task.id}`);
      return ['completed', 'failed'].includes(r.body.task.status) && r.body;
    }, 'the agent run to finish');
  };

  it('decrypts a stored secret for the agent, and reports a missing one', async () => {
    const raw = `agent-visible-${randomUUID()}`;
    assert.equal((await stack.client.post(S, { key: 'agents/openai.key', raw_value: raw })).status, 201);
    const done = await runTask('agents/openai.key');
    assert.equal(done.task.status, 'completed');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `secret agents/openai.key has ${raw.length} characters` }]);
    const missing = await runTask('agents/missing.key');
    assert.equal(missing.task.status, 'failed');
    assert.match(missing.status_message.parts[0].text, /secret with key 'agents\/missing.key' not found/);
    for (const p of [stack.api, ...stack.workers]) assert.ok(!p.logs.join('\n').includes(raw));
  });

  it("masks a secret the agent read where its failure quotes it: the status message, the timeline, the job's failed attempts and the log", async () => {
    const raw = `agent-quoted-${randomUUID()}`;
    assert.equal((await stack.client.post(S, { key: 'agents/quoted.key', raw_value: raw })).status, 201);
    const done = await runTask('throw agents/quoted.key');
    assert.equal(done.task.status, 'failed');
    // Before: the value itself, in each of them.
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'The agent failed after 3 attempt(s): the provider refused the key ***' }]);
    const timeline = await stack.client.get(`/api/task/v1/${done.task.id}/timeline?page_size=100`);
    assert.ok(JSON.stringify(timeline.body).includes('the provider refused the key ***'));
    await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('agent run failed for good')), 'the final failure in the worker log');
    const jobs = await withQueue(stack.env, 'agent-tasks', async (q) => JSON.stringify(await q.getJobs(['failed', 'completed'])));
    assert.match(jobs, /the provider refused the key \*\*\*/, "the failed attempts' reason in the job");
    for (const text of [JSON.stringify(done), JSON.stringify(timeline.body), jobs, ...stack.workers[0].logs]) assert.ok(!text.includes(raw), text.slice(0, 400));
  });

  it("masks a secret the agent read where a call it left unawaited fails quoting it, during the run or after it, in the worker's log", async () => {
    const raw = `agent-leaked-${randomUUID()}`;
    assert.equal((await stack.client.post(S, { key: 'agents/leaked.key', raw_value: raw })).status, 201);
    const done = await runTask('leak agents/leaked.key');
    assert.equal(done.task.status, 'completed');
    const rejections = () => stack.workers[0].logs.filter((l) => l.includes('unhandled promise rejection'));
    await waitFor(async () => rejections().some((l) => l.includes('after the run')), 'the rejection after the run to be logged');
    const reasons = rejections().map((l) => JSON.parse(l).reason);
    // Before: the value itself, in both.
    assert.ok(reasons.includes('during the run, the provider refused the key ***'), reasons.join('\n'));
    assert.ok(reasons.includes('after the run, the provider refused the key ***'), reasons.join('\n'));
    assert.ok(!stack.workers[0].logs.join('\n').includes(raw));
  });

  it('masks a long secret (20,000 characters) the agent read where its failure quotes it, without the masker failing in its place', async () => {
    // Before: the masker threw (its regular expression too large), and the run failed with that
    // error's message, the secret spelled out character by character.
    const raw = `long-${randomUUID()}-${'0123456789abcdef'.repeat(1250)}`.slice(0, 20_000);
    assert.equal((await stack.client.post(S, { key: 'agents/long.key', raw_value: raw })).status, 201);
    const done = await runTask('throw agents/long.key');
    assert.equal(done.task.status, 'failed');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'The agent failed after 3 attempt(s): the provider refused the key ***' }]);
    const jobs = await withQueue(stack.env, 'agent-tasks', async (q) => JSON.stringify(await q.getJobs(['failed', 'completed'])));
    for (const text of [JSON.stringify(done), jobs, ...stack.workers[0].logs]) {
      assert.ok(!text.includes('Invalid regular expression'), text.slice(0, 400));
      // Every 64-character run of it holds one of these.
      for (let i = 0; i + 48 <= raw.length; i += 16) assert.ok(!text.includes(raw.slice(i, i + 48)), `a run of the secret from ${i}`);
    }
  });

  it('keeps the worker running on rejections whose values cannot be read as errors are (no prototype, a proxy whose traps throw)', async () => {
    // Before: the rejection handler threw on them, and the worker exited.
    assert.equal((await runTask('odd rejections')).task.status, 'completed');
    const after = await runTask('agents/leaked.key');
    assert.equal(after.task.status, 'completed');
    assert.equal(stack.workers[0].child.exitCode, null);
  });

  // Last: the worker exits.
  it("ends the worker on an exception the agent threw outside its promises, as Node does, logging it with the secret it quotes masked", async () => {
    const raw = `agent-crashed-${randomUUID()}`;
    assert.equal((await stack.client.post(S, { key: 'agents/crash.key', raw_value: raw })).status, 201);
    const worker = stack.workers[0];
    // The task's fate is not asked for: the worker may exit before or after the run's last write.
    assert.equal((await stack.client.post('/api/task/v1', { message: textMessage('crash agents/crash.key') })).status, 201);
    await waitFor(async () => worker.child.exitCode !== null || undefined, 'the worker to exit', 20000);
    assert.equal(worker.child.exitCode, 1);
    const line = worker.logs.find((l) => l.includes('uncaught exception'));
    assert.ok(line, worker.logs.slice(-5).join('\n'));
    const { reason, stack: trace, level } = JSON.parse(line);
    assert.equal(level, 60);
    assert.equal(reason, 'the provider refused the key ***');
    assert.match(trace, /^Error: the provider refused the key \*\*\*\n\s+at /);
    // Before: Node printed the error on stderr, the value in it.
    assert.ok(!worker.logs.join('\n').includes(raw));
  });
});

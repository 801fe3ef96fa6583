// API keys and scopes (SPEC.md section 2) through HTTP. Route coverage comes from `allRoutes`,
// so routes added later are checked without touching this file.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { allRoutes } from '../api/app.ts';
import { SCOPES, type Scope } from '../domain/api-keys.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { behindServiceProxy } from './helpers/black-hole-proxy.ts';
import { assertPerSecondLimit } from './helpers/rate-limit.ts';
import { ADMIN_KEY, assertError, Client, resetDb, startApi, startStack, testDb, testEnv, useStack, waitFor, type Proc, type Response, type Stack } from './helpers/stack.ts';

const DUMMY = '00000000-0000-4000-8000-000000000000';
const urlOf = (p: string) => p.replace(/:([A-Za-z0-9_]+)/g, DUMMY);
const scoped = allRoutes.filter((r) => r.spec.scope !== null);
const neededScopes = (scope: Scope | readonly Scope[]): Scope[] => (typeof scope === 'string' ? [scope] : [...scope]);
const publicRoutes = allRoutes.filter((r) => r.spec.scope === null);
// A made-up API key.
const guess = () => `tb_${randomUUID()}`;
// Failed authentications are counted in fixed minutes of the clock: a test whose failures fell at the
// end of one minute and its checks in the next would find the count gone. A test that might come
// near a minute's end starts in the next one.
async function inAFreshMinute(needMs = 20_000) {
  const left = 60_000 - (Date.now() % 60_000);
  if (left < needMs) await sleep(left + 50);
}

function call(client: Client, method: string, url: string, headers: Record<string, string> = {}): Promise<Response> {
  const hasBody = ['POST', 'PUT', 'PATCH'].includes(method);
  return client.request(method, url, hasBody ? {} : undefined, { headers });
}

function assertAuthError(r: Response, status: 401 | 403, what: string) {
  assert.equal(r.status, status, `${what}: ${r.text}`);
  assert.equal(r.body?.data?.code, status === 401 ? 'unauthenticated' : 'forbidden', `${what}: ${r.text}`);
  assert.equal(typeof r.body.message, 'string');
  if (status === 401) assert.match(r.headers.get('www-authenticate') ?? '', /^Bearer/, what);
}

// Credentials in a URL setting, which runtime_config must not show.
const [URL_USER, URL_PASSWORD, URL_PARAM] = ['stripe-user-5e1d', 'stripe-password-9c2a', 'stripe-param-71b0'];
// Credentials in odd places: a comma in a password and in a parameter's value, a parameter without a
// value (a bare token), a fragment.
const ODD_SECRETS = ['comma-pass-3f0e', 'comma-param-a6d1', 'bare-token-c47b', 'fragment-token-0e92'];

describe('authentication and scopes', () => {
  const stack = useStack({
    STRIPE_API_BASE_URL: `https://${URL_USER}:${URL_PASSWORD}@api.stripe.example/v1?key=${URL_PARAM}`,
    AGENT_REMOTE_KEY_ORIGINS: 'https://a.example,https://b.example:8443',
    GOOGLE_MAIL_API_BASE_URL: `https://gm-user:pw,${ODD_SECRETS[0]}@gmail.example/?key=k,${ODD_SECRETS[1]}`,
    AWS_KMS_ENDPOINT: `https://kms.example/?${ODD_SECRETS[2]}#token=${ODD_SECRETS[3]}`,
    // The route matrix below presents a wrong key to every route.
    AUTH_FAILURES_PER_MINUTE: '0',
  }, { workers: 0 });
  let admin: Client;
  const createKey = async (scopes: string[], name = `key ${scopes.join(' ')}`) => {
    const r = await admin.post('/api/auth/v1/api-key', { name, scopes });
    assert.equal(r.status, 201, r.text);
    return r.body as { id: string; name: string; scopes: Scope[]; key: string; created_at: string };
  };

  before(() => { admin = stack.client; });

  it('covers every route: allRoutes has scoped routes for each tag it mounts', () => {
    assert.ok(scoped.length >= 10, `only ${scoped.length} scoped routes`);
    for (const r of scoped) {
      for (const scope of neededScopes(r.spec.scope!)) assert.ok((SCOPES as readonly string[]).includes(scope), `${r.spec.operationId}: unknown scope ${scope}`);
    }
  });

  describe('every non-public route', () => {
    let revokedKey: string;
    let countsBefore: unknown;
    const counts = async () => Promise.all(['tasks', 'api_keys', 'messages'].map((t) => testDb()(t).count({ n: '*' })));

    before(async () => {
      const k = await createKey(['admin'], 'to revoke');
      assert.equal((await admin.delete(`/api/auth/v1/api-key/${k.id}`)).status, 200);
      revokedKey = k.key;
      countsBefore = await counts();
    });

    for (const { spec } of scoped) {
      const method = spec.method.toUpperCase();
      const url = urlOf(spec.path);
      it(`${method} ${spec.path} (${spec.operationId}) answers 401 without a usable key`, async () => {
        // An empty key sends no Authorization header.
        const anon = admin.as('');
        assertAuthError(await call(anon, method, url), 401, 'no key');
        assertAuthError(await call(anon, method, url, { authorization: `Basic ${Buffer.from(`x:${ADMIN_KEY}`).toString('base64')}` }), 401, 'basic scheme');
        assertAuthError(await call(anon, method, url, { authorization: 'Bearer' }), 401, 'empty bearer');
        assertAuthError(await call(admin.as(`tb_${randomUUID()}`), method, url), 401, 'unknown key');
        assertAuthError(await call(admin.as(revokedKey), method, url), 401, 'revoked key');
      });

      const needed = neededScopes(spec.scope!);
      it(`${method} ${spec.path} answers 403 to a key with every other scope but not '${needed.join("' or '")}'`, async () => {
        for (const scope of needed) {
          const others = SCOPES.filter((s) => s !== scope && s !== 'admin');
          const k = await createKey(others);
          const r = await call(admin.as(k.key), method, url);
          assertAuthError(r, 403, `without ${scope}`);
          assert.equal(r.body.data.required_scope, scope);
        }
        if (!needed.includes('admin')) {
          const allowed = await call(admin.as((await createKey(needed)).key), method, url);
          assert.ok(![401, 403].includes(allowed.status), `with ${needed.join(', ')}: ${allowed.text}`);
        }
      });
    }

    it('changed nothing for the requests it refused (beyond the keys this test created)', async () => {
      const [tasks, , messages] = await counts();
      const [tasksBefore, , messagesBefore] = countsBefore as typeof tasks[];
      assert.deepEqual([tasks, messages], [tasksBefore, messagesBefore]);
    });
  });

  it('public routes answer without a key', async () => {
    assert.ok(publicRoutes.some((r) => r.spec.path === '/_internal/v1/health'));
    const anon = admin.as('');
    for (const { spec } of publicRoutes) {
      const r = await call(anon, spec.method.toUpperCase(), urlOf(spec.path));
      assert.ok(![401, 403].includes(r.status), `${spec.operationId}: ${r.status} ${r.text}`);
    }
    assert.equal((await anon.get('/api/openapi.json')).status, 200);
    assert.deepEqual((await anon.get('/_internal/v1/health')).body, { status: 'ok' });
  });

  it('runtime_config (scope internal) shows the configuration and each queue\'s concurrency, without the admin key or credentials in URLs', async () => {
    const r = await admin.get('/_internal/v1/runtime_config');
    assert.equal(r.status, 200);
    assert.equal(r.body.config.BODY_LIMIT_BYTES, 1024 * 1024);
    assert.deepEqual(r.body.queues, [
      { name: 'agent-tasks', concurrency: 200 }, { name: 'key-jobs', concurrency: 2 },
      { name: 'credential-refresh', concurrency: 5 }, { name: 'push-notifications', concurrency: 10 },
    ]);
    for (const secret of [ADMIN_KEY, URL_USER, URL_PASSWORD, URL_PARAM, ...ODD_SECRETS]) assert.ok(!r.text.includes(secret), `a secret in runtime_config: ${r.text}`);
    assert.equal(r.body.config.GOOGLE_MAIL_API_BASE_URL, 'https://***:***@gmail.example/?key=***');
    assert.equal(r.body.config.AWS_KMS_ENDPOINT, 'https://kms.example/?***#***');
    assert.equal(r.body.config.AGENT_REMOTE_KEY_ORIGINS, 'https://a.example,https://b.example:8443');
    // Where the process connects, without the user or the password (the test servers ask for one).
    const masked = (url: string) => url.replace(/\/\/[^@/]*@/, (userinfo) => userinfo.replace(/[^/:@]+/g, '***'));
    assert.equal(r.body.config.DATABASE_URL, masked(stack.env.DATABASE_URL));
    assert.match(r.body.config.DATABASE_URL, /^postgres:\/\/\*\*\*:\*\*\*@127\.0\.0\.1:\d+\/taskbridge$/);
    assert.equal(r.body.config.REDIS_URL, masked(stack.env.REDIS_URL));
    assert.match(r.body.config.REDIS_URL, /^redis:\/\/:\*\*\*@127\.0\.0\.1:\d+$/);
    // Credentials in other URL settings are masked; the rest of the URL shows.
    assert.equal(r.body.config.STRIPE_API_BASE_URL, 'https://***:***@api.stripe.example/v1?key=***');
    assert.equal(r.body.config.AGENT_REMOTE_KEY_ORIGINS, 'https://a.example,https://b.example:8443');
  });

  it('runtime_config shows a DATABASE_URL over a Unix socket (no host after the user info) masked, and the API serves on it', async () => {
    const [dir] = (await testDb().raw('show unix_socket_directories')).rows[0].unix_socket_directories.split(',');
    const tcp = new URL(stack.env.DATABASE_URL);
    // pg takes this form, which is no WHATWG URL: it was shown as '(unparsable URL)'.
    const socketUrl = `postgresql://${tcp.username}:${tcp.password}@${tcp.pathname}?host=${dir.trim()}&port=${tcp.port}`;
    const api = await startApi({ ...stack.env, DATABASE_URL: socketUrl });
    try {
      const c = new Client(api.url, ADMIN_KEY);
      const r = await c.get('/_internal/v1/runtime_config');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.body.config.DATABASE_URL, 'postgresql://***:***@/taskbridge?host=***&port=***');
      assert.ok(!r.text.includes(tcp.password), r.text);
      assert.equal((await c.get('/api/task/v1')).status, 200);
    } finally {
      await api.stop();
    }
  });

  describe('key management', () => {
    it('creates a key: 201 {id, name, scopes, key, created_at}, the key only here, random and usable', async () => {
      const r = await admin.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read', 'task:read', 'a2a'] });
      assert.equal(r.status, 201);
      assert.deepEqual(Object.keys(r.body).sort(), ['created_at', 'id', 'key', 'name', 'scopes']);
      assert.match(r.body.id, /^[0-9a-f-]{36}$/);
      assert.deepEqual(r.body.scopes, ['task:read', 'a2a']);
      assert.match(r.body.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      // At least 256 bits of randomness: 43 base64url characters after the prefix.
      assert.match(r.body.key, /^tb_[A-Za-z0-9_-]{43,}$/);
      const other = await createKey(['task:read']);
      assert.notEqual(other.key, r.body.key);

      const reader = admin.as(r.body.key);
      assert.equal((await reader.get('/api/task/v1')).status, 200);
      const write = await reader.post('/api/task/v1', { message: { role: 'user', parts: [{ type: 'text-part', text: 'x' }] } });
      assertAuthError(write, 403, 'task:write');
      assert.equal(write.body.data.required_scope, 'task:write');

      // Stored only as a hash; never in the list, the database or the logs.
      const list = await admin.get('/api/auth/v1/api-key');
      assert.ok(!list.text.includes(r.body.key));
      const row = await testDb()('api_keys').where({ id: r.body.id }).first();
      assert.ok(!JSON.stringify(row).includes(r.body.key) && !Object.values(row).some((v) => Buffer.isBuffer(v) && v.toString().includes(r.body.key)));
      assert.ok(!stack.api.logs.some((l) => l.includes(r.body.key)), 'key in the API logs');
    });

    it('lists active keys without the keys, newest first, and records last_used_at', async () => {
      const k = await createKey(['task:read'], 'used later');
      const list = await admin.get('/api/auth/v1/api-key?page_size=1000');
      assert.equal(list.status, 200);
      assert.deepEqual(Object.keys(list.body), ['items']);
      const mine = list.body.items.find((i: { id: string }) => i.id === k.id);
      assert.deepEqual(mine, { id: k.id, name: 'used later', scopes: ['task:read'], created_at: k.created_at, last_used_at: null });
      for (const item of list.body.items) assert.deepEqual(Object.keys(item).sort(), ['created_at', 'id', 'last_used_at', 'name', 'scopes']);
      const order = list.body.items.map((i: { created_at: string; id: string }) => `${i.created_at} ${i.id}`);
      assert.deepEqual(order, [...order].sort().reverse());

      // Paged like every list: page by page, the same keys in the same order, no token on the last page.
      // More keys than a default page (50), whatever other tests created.
      for (let n = list.body.items.length; n <= 50; n++) await createKey(['task:read'], `filler ${n}`);
      const all = (await admin.get('/api/auth/v1/api-key?page_size=1000')).body.items.map((i: { id: string }) => i.id);
      assert.equal((await admin.get('/api/auth/v1/api-key')).body.items.length, 50);
      const paged: string[] = [];
      let url = '/api/auth/v1/api-key?page_size=20';
      for (;;) {
        const page = await admin.get(url);
        assert.equal(page.status, 200, page.text);
        assert.ok(page.body.items.length <= 20);
        paged.push(...page.body.items.map((i: { id: string }) => i.id));
        if (!('next_page_token' in page.body)) break;
        url = `/api/auth/v1/api-key?page_size=20&next_page_token=${page.body.next_page_token}`;
      }
      assert.deepEqual(paged, all);
      for (const bad of ['page_size=0', 'page_size=1001', 'next_page_token=bogus']) assertError(await admin.get(`/api/auth/v1/api-key?${bad}`), 400, 'invalid_request');

      const started = Date.now();
      assert.equal((await admin.as(k.key).get('/api/task/v1')).status, 200);
      const used = await waitFor(async () => {
        const items = (await admin.get('/api/auth/v1/api-key')).body.items;
        return items.find((i: { id: string; last_used_at: string | null }) => i.id === k.id && i.last_used_at);
      }, 'last_used_at to be recorded');
      assert.ok(Date.parse(used.last_used_at) >= started - 5000);
    });

    it('revokes a key: 200 {success: true}, then 401 for it, gone from the list, 404 the second time', async () => {
      const k = await createKey(['task:read']);
      const client = admin.as(k.key);
      assert.equal((await client.get('/api/task/v1')).status, 200);
      const r = await admin.delete(`/api/auth/v1/api-key/${k.id}`);
      assert.equal(r.status, 200);
      assert.deepEqual(r.body, { success: true });
      assertAuthError(await client.get('/api/task/v1'), 401, 'revoked');
      assert.ok(!(await admin.get('/api/auth/v1/api-key')).body.items.some((i: { id: string }) => i.id === k.id));
      const again = await admin.delete(`/api/auth/v1/api-key/${k.id}`);
      assert.equal(again.status, 404);
      assert.equal(again.body.data.code, 'not_found');
      assert.equal((await admin.delete(`/api/auth/v1/api-key/${randomUUID()}`)).status, 404);
      assert.equal((await admin.delete('/api/auth/v1/api-key/not-a-uuid')).status, 400);
    });

    it('a key with scope admin can do everything, including managing keys', async () => {
      const k = await createKey(['admin']);
      const c = admin.as(k.key);
      assert.equal((await c.get('/_internal/v1/runtime_config')).status, 200);
      const made = await c.post('/api/auth/v1/api-key', { name: 'made by admin key', scopes: ['internal'] });
      assert.equal(made.status, 201);
      assert.equal((await c.delete(`/api/auth/v1/api-key/${made.body.id}`)).status, 200);
    });

    const badBodies: [string, unknown][] = [
      ['no name', { scopes: ['task:read'] }],
      ['an empty name', { name: '', scopes: ['task:read'] }],
      ['a blank name (as `keys create --name " "` refuses)', { name: '   ', scopes: ['task:read'] }],
      ['a name with control characters (a terminal escape the CLI would list)', { name: 'ci\u001b[2Jreader\n', scopes: ['task:read'] }],
      ['no scopes', { name: 'x' }],
      ['empty scopes', { name: 'x', scopes: [] }],
      ['an unknown scope', { name: 'x', scopes: ['task:read', 'root'] }],
      ['an unknown member', { name: 'x', scopes: ['task:read'], key: 'chosen' }],
      ['scopes as a string', { name: 'x', scopes: 'task:read' }],
    ];
    it('takes a name that is not blank, whatever its spacing (U+2028 and U+2029 included)', async () => {
      for (const name of [' padded ', '\u2028name', ' \u2029 ok', 'émoji 🔑']) {
        const r = await admin.post('/api/auth/v1/api-key', { name, scopes: ['task:read'] });
        assert.equal(r.status, 201, r.text);
        assert.equal(r.body.name, name);
        assert.equal((await admin.delete(`/api/auth/v1/api-key/${r.body.id}`)).status, 200);
      }
    });

    for (const [what, body] of badBodies) {
      it(`refuses to create a key with ${what} (400), creating nothing`, async () => {
        const [before] = await testDb()('api_keys').count({ n: '*' });
        const r = await admin.post('/api/auth/v1/api-key', body);
        assert.equal(r.status, 400, r.text);
        assert.equal(r.body.data.code, 'invalid_request');
        assert.ok(r.body.data.errors.length >= 1);
        assert.deepEqual((await testDb()('api_keys').count({ n: '*' }))[0], before);
      });
    }
  });

  describe('bootstrap admin key (no ADMIN_API_KEY, no keys yet)', () => {
    // Each test's last stack is stopped after it: one left running would sweep the shared outbox
    // into its own queues for the rest of the run (pipeline-faults lost its rows to one).
    let boot: Stack | undefined;
    afterEach(async () => {
      await boot?.stop();
      boot = undefined;
    });

    it('creates one admin key on first start, in an owner-only file under DATA_DIR, and not another on restart', async () => {
      await resetDb();
      boot = await startStack({ ADMIN_API_KEY: undefined }, { workers: 0 });
      const file = path.join(boot.env.DATA_DIR, 'admin-api-key');
      assert.equal(fs.statSync(file).mode & 0o777, 0o600);
      const key = fs.readFileSync(file, 'utf8').trim();
      const c = boot.client.as(key);
      assert.equal((await c.get('/api/auth/v1/api-key')).status, 200);
      assert.equal((await boot.client.get('/api/task/v1')).status, 401, 'ADMIN_API_KEY is not configured here');
      assert.ok(!boot.api.logs.some((l) => l.includes(key)), 'the key itself is never logged');
      assert.ok(boot.api.logs.some((l) => l.includes(file)), 'the log says where the key is');
      await boot.stop();

      boot = await startStack({ ADMIN_API_KEY: undefined, DATA_DIR: boot.env.DATA_DIR }, { workers: 0 });
      assert.equal(fs.readFileSync(file, 'utf8').trim(), key);
      const items = (await boot.client.as(key).get('/api/auth/v1/api-key')).body.items;
      assert.equal(items.length, 1);
      assert.deepEqual(items[0].scopes, ['admin']);
      await boot.stop();

      // With every key revoked, a restart mints no new admin key.
      await testDb()('api_keys').update({ revoked_at: new Date() });
      boot = await startStack({ ADMIN_API_KEY: undefined, DATA_DIR: boot.env.DATA_DIR }, { workers: 0 });
      assert.equal(fs.readFileSync(file, 'utf8').trim(), key);
      assert.equal(Number((await testDb()('api_keys').count({ n: '*' }))[0].n), 1);
      assert.equal((await boot.client.as(key).get('/api/task/v1')).status, 401);
    });

    it('on a fresh database, moves an admin key file already in DATA_DIR aside (owner-only, past any earlier one) rather than overwriting it, and says so without the keys', async () => {
      await resetDb();
      const dataDir = fs.mkdtempSync(path.join(process.env.TEST_DATA_DIR!, 'boot-kept-'));
      const file = path.join(dataDir, 'admin-api-key');
      // Another database's key, the only copy of it, and a file an earlier such start moved aside.
      fs.writeFileSync(file, 'tb-key-of-another-database\n', { mode: 0o644 });
      fs.writeFileSync(`${file}.previous-1`, 'tb-key-moved-aside-before\n', { mode: 0o600 });
      boot = await startStack({ ADMIN_API_KEY: undefined, DATA_DIR: dataDir }, { workers: 0 });
      const moved = `${file}.previous-2`;
      assert.equal(fs.readFileSync(moved, 'utf8'), 'tb-key-of-another-database\n');
      assert.equal(fs.statSync(moved).mode & 0o777, 0o600);
      assert.equal(fs.readFileSync(`${file}.previous-1`, 'utf8'), 'tb-key-moved-aside-before\n');
      const key = fs.readFileSync(file, 'utf8').trim();
      assert.equal(fs.statSync(file).mode & 0o777, 0o600);
      assert.equal((await boot.client.as(key).get('/api/auth/v1/api-key')).status, 200);
      assert.ok(boot.api.logs.some((l) => l.includes('"level":40') && l.includes(file) && l.includes(moved)), `a warning names both files:\n${boot.api.logs.join('\n')}`);
      assert.ok(!boot.api.logs.some((l) => l.includes(key) || l.includes('tb-key-')), 'no key is logged');
    });

    // Not a key file: nothing to move aside, and nothing of it changed (a FIFO is opened without
    // waiting for a writer, so the start ends rather than hangs).
    for (const [what, make] of [['a directory', (p: string) => fs.mkdirSync(p, { mode: 0o755 })], ['a FIFO', (p: string) => execFileSync('mkfifo', ['-m', '0644', p])]] as const) {
      it(`on a fresh database, refuses ${what} at DATA_DIR/admin-api-key: exit 2 naming the path and what it is, its mode unchanged`, async () => {
        await resetDb();
        const dataDir = fs.mkdtempSync(path.join(process.env.TEST_DATA_DIR!, 'boot-odd-'));
        const file = path.join(dataDir, 'admin-api-key');
        make(file);
        const mode = fs.statSync(file).mode;
        await assert.rejects(startApi(testEnv({ ADMIN_API_KEY: undefined, DATA_DIR: dataDir })), (err: Error) => {
          assert.match(err.message, /exited with 2 before it was ready/);
          assert.ok(err.message.includes(`  DATA_DIR: ${file} is ${what}, not an admin API key file: move it out of the way`), err.message);
          return true;
        });
        assert.equal(fs.statSync(file).mode, mode);
        assert.deepEqual(fs.readdirSync(dataDir).filter((f) => f.startsWith('admin-api-key')), ['admin-api-key'], 'nothing moved aside or written');
        assert.equal(Number((await testDb()('api_keys').count({ n: '*' }))[0].n), 0, 'no key stored for a file never written');
      });
    }
  });
});

// TRUST_PROXY=0 means no proxies, as false does.
for (const trustProxy of ['false', '0', 'true', '2']) describe(`failed authentication limit per client address (TRUST_PROXY=${trustProxy}${['false', '0'].includes(trustProxy) ? '' : ': X-Forwarded-For names it'})`, () => {
  const stack = useStack({ AUTH_FAILURES_PER_MINUTE: '5', TRUST_PROXY: trustProxy }, { workers: 0 });
  const hops = trustProxy === 'true' ? 1 : Number(trustProxy) || 0;
  // GET /api/task/v1 with `key` ('' sends none), saying it comes from `address`.
  const list = (key: string, address: string) => stack.client.as(key).request('GET', '/api/task/v1', undefined, { headers: { 'x-forwarded-for': address } });

  it('answers 429 with Retry-After, without a key lookup, to an address past its wrong keys for the minute; keys in use keep working', async () => {
    await inAFreshMinute();
    const fresh = await stack.client.post('/api/auth/v1/api-key', { name: 'not used yet', scopes: ['task:read'] });
    assert.equal(fresh.status, 201);
    // No key at all is a client's mistake, not a guess: not counted.
    for (let i = 0; i < 8; i++) assert.equal((await list('', '198.51.100.7')).status, 401);
    for (let i = 0; i < 5; i++) assertAuthError(await list(guess(), '198.51.100.7'), 401, `wrong key ${i + 1}`);
    const blocked = await list(guess(), '198.51.100.7');
    assert.equal(blocked.status, 429, blocked.text);
    assert.equal(blocked.body.data.code, 'rate_limited');
    assert.match(blocked.body.message, /^Too many failed authentications from this address; retry in \d+ s$/);
    assert.ok(Number(blocked.headers.get('retry-after')) >= 1 && Number(blocked.headers.get('retry-after')) <= 60);
    // A key verified lately still works from there; one not seen yet waits out the minute like a guess.
    assert.equal((await list(ADMIN_KEY, '198.51.100.7')).status, 200);
    const unseen = await list(fresh.body.key, '198.51.100.7');
    if (hops) {
      assert.equal(unseen.status, 429);
      // Another address is counted on its own.
      assert.equal((await list(fresh.body.key, '203.0.113.9')).status, 200);
      assertAuthError(await list(guess(), '203.0.113.9'), 401, 'another address');
    } else {
      // X-Forwarded-For is not believed without TRUST_PROXY: every request here came from one address.
      assert.equal(unseen.status, 429);
      assert.equal((await list(guess(), '203.0.113.9')).status, 429);
    }
    // The queue dashboard's basic-auth password is a key like any other.
    const board = await stack.client.as('').request('GET', '/admin/queues', undefined, { headers: { 'x-forwarded-for': '198.51.100.7', authorization: `Basic ${Buffer.from(`x:${guess()}`).toString('base64')}` } });
    assert.equal(board.status, 429, board.text);
  });

  if (hops) it('takes the address the outermost proxy appended to X-Forwarded-For: the entries a client sends itself before it change nothing', async () => {
    await inAFreshMinute();
    // As the proxies send it on: what the client sent, the client's address, then each inner proxy's.
    const forwarded = (sent: string[], client: string) => [...sent, client, ...Array.from({ length: hops - 1 }, (_, i) => `10.255.0.${i + 1}`)].join(', ');
    const [guesser, other] = ['198.51.100.40', '198.51.100.41'];
    const fresh = await stack.client.post('/api/auth/v1/api-key', { name: 'other client', scopes: ['task:read'] });
    // Wrong keys naming another address first are counted against the guesser's own...
    for (let i = 0; i < 5; i++) assertAuthError(await list(guess(), forwarded([other], guesser)), 401, `wrong key ${i + 1}`);
    // ...so that address is not locked out (its key, not seen yet, would be refused from a blocked address)...
    assert.equal((await list(fresh.body.key, forwarded([], other))).status, 200);
    // ...and a new made-up address each time does not let the guesser guess on.
    for (let i = 0; i < 3; i++) assert.equal((await list(guess(), forwarded([`10.0.${i}.1`], guesser))).status, 429);
  });

  if (hops) it('counts IPv6 addresses by their /64 (one host picks any address in it) and an IPv4-mapped one as its IPv4 address', async () => {
    await inAFreshMinute();
    const fresh = await stack.client.post('/api/auth/v1/api-key', { name: 'next /64', scopes: ['task:read'] });
    // A new address in one /64 for each wrong key, written in the forms an address takes.
    const inOne64 = ['2001:db8:7:1::1', '2001:DB8:7:1::2', '2001:0db8:0007:0001:0000:0000:0000:0003', '2001:db8:7:1:ffff:ffff:ffff:fffe', '2001:db8:7:1:0:5efe:192.0.2.1'];
    for (const [i, address] of inOne64.entries()) assertAuthError(await list(guess(), address), 401, `wrong key ${i + 1}`);
    const refused = await list(guess(), '2001:db8:7:1:abcd::99');
    assert.equal(refused.status, 429, refused.text);
    assert.equal((await list(fresh.body.key, '2001:db8:7:1::100')).status, 429);
    // The next /64 is another client.
    assert.equal((await list(fresh.body.key, '2001:db8:7:2::1')).status, 200);
    // An IPv4 client seen through an IPv6 socket or proxy is the same client as over IPv4.
    for (let i = 0; i < 5; i++) assertAuthError(await list(guess(), i % 2 ? '198.51.100.60' : `::ffff:198.51.100.60`), 401, `wrong key ${i + 1}`);
    assert.equal((await list(guess(), '::FFFF:198.51.100.60')).status, 429);
    assert.equal((await list(guess(), '198.51.100.60')).status, 429);
  });
});

describe('failed authentication limit per client address: keys sent at once, keys in use', () => {
  const stack = useStack({ AUTH_FAILURES_PER_MINUTE: '5', TRUST_PROXY: 'true' }, { workers: 0 });
  const list = (key: string, address: string) => stack.client.as(key).request('GET', '/api/task/v1', undefined, { headers: { 'x-forwarded-for': address } });
  const tally = (rs: Response[]) => rs.reduce<Record<number, number>>((t, r) => ({ ...t, [r.status]: (t[r.status] ?? 0) + 1 }), {});

  it('looks up no more wrong keys from one address than the limit however many come at once; valid keys sent at once all pass', async () => {
    await inAFreshMinute();
    const wrong = await Promise.all(Array.from({ length: 100 }, () => list(guess(), '198.51.100.50')));
    const counted = tally(wrong);
    assert.ok(counted[401] >= 1 && counted[401] <= 5 && counted[401] + counted[429] === 100, JSON.stringify(counted));
    for (const r of wrong.filter((r) => r.status === 429)) assert.match(r.body.message, /^Too many failed authentications from this address; retry in \d+ s$/);
    // Keys not verified yet, each sent five times at once from an address with one failure left: all served.
    const keys = await Promise.all(Array.from({ length: 10 }, async (_, i) => (await stack.client.post('/api/auth/v1/api-key', { name: `at once ${i}`, scopes: ['task:read'] })).body.key as string));
    for (let i = 0; i < 4; i++) assertAuthError(await list(guess(), '198.51.100.51'), 401, `wrong key ${i + 1}`);
    const valid = await Promise.all(keys.flatMap((key) => Array.from({ length: 5 }, () => list(key, '198.51.100.51'))));
    assert.deepEqual(tally(valid), { 200: 50 });
  });

  it('keeps serving a key in use from an address past its failures after the 10 s its check is cached for', async () => {
    await inAFreshMinute(40_000);
    const address = '198.51.100.52';
    const key = (await stack.client.post('/api/auth/v1/api-key', { name: 'in use', scopes: ['task:read'] })).body.key as string;
    assert.equal((await list(key, address)).status, 200);
    for (let i = 0; i < 5; i++) assertAuthError(await list(guess(), address), 401, `wrong key ${i + 1}`);
    // Used every 2 s for 16 s: looked up again once its check is 10 s old, and served all along.
    const start = Date.now();
    while (Date.now() - start < 16_000) {
      const r = await list(key, address);
      assert.equal(r.status, 200, `${Math.round((Date.now() - start) / 1000)} s on: ${r.text}`);
      await sleep(2000);
    }
    assert.equal((await list(guess(), address)).status, 429, 'the address is still past its failures');
  });
});

describe('per-key rate limit', () => {
  // One a second: a burst of fifty shows the limit unless it takes fifty seconds.
  const limit = 1;
  const stack = useStack({ RATE_LIMIT_PER_SECOND: String(limit) }, { workers: 0 });

  it('answers 429 rate_limited with Retry-After beyond the limit, creating nothing for refused requests; other keys keep their own budget', async () => {
    const other = await stack.client.post('/api/auth/v1/api-key', { name: 'other', scopes: ['task:read'] });
    assert.equal(other.status, 201);
    const burst = 50;
    const from = Date.now();
    const results = await Promise.all(Array.from({ length: burst }, (_, i) => stack.client.post('/api/task/v1', { message: { role: 'user', parts: [{ type: 'text-part', text: `burst ${i}` }] } })));
    const created = results.filter((r) => r.status === 201);
    const limited = results.filter((r) => r.status === 429);
    assertPerSecondLimit(from, created.length, burst, limit);
    assert.equal(created.length + limited.length, burst, results.map((r) => r.status).join(','));
    for (const r of limited) {
      assert.equal(r.body.data.code, 'rate_limited');
      assert.match(r.body.message, /retry in \d+ s/);
      assert.match(r.headers.get('retry-after') ?? '', /^[1-9]\d*$/);
    }
    const [{ n }] = await testDb()('tasks').count({ n: '*' });
    assert.equal(Number(n), created.length);
    // Another key is counted on its own.
    assert.equal((await stack.client.as(other.body.key).get('/api/task/v1')).status, 200);
    // Once the window has passed the first key is served again.
    await new Promise((r) => setTimeout(r, 1100));
    assert.equal((await stack.client.get('/api/task/v1')).status, 200);
  });

  it('is described in the OpenAPI document for authenticated routes', async () => {
    const doc = (await stack.client.get('/api/openapi.json')).body;
    assert.ok(doc.paths['/api/task/v1'].post.responses['429']);
    assert.ok(!doc.paths['/_internal/v1/health'].get.responses['429']);
  });
});

describe('request limits across API processes (two on one Redis)', () => {
  const limit = 10;
  const stack = useStack({ AUTH_FAILURES_PER_MINUTE: '5', RATE_LIMIT_PER_SECOND: String(limit), TRUST_PROXY: 'true' }, { workers: 0 });
  let secondApi: Proc | undefined;
  let second: Client;
  before(async () => {
    const api = await startApi(stack.env);
    secondApi = api;
    second = new Client(api.url);
  });
  after(async () => secondApi?.stop());
  const newKey = async () => {
    const r = await stack.client.post('/api/auth/v1/api-key', { name: 'fleet', scopes: ['task:read'] });
    assert.equal(r.status, 201, r.text);
    return r.body as { id: string; key: string };
  };

  it('refuses an address once its wrong keys on all processes together reach AUTH_FAILURES_PER_MINUTE', async () => {
    const list = (client: Client, key: string) => client.as(key).request('GET', '/api/task/v1', undefined, { headers: { 'x-forwarded-for': '198.51.100.20' } });
    await inAFreshMinute();
    for (const [client, wrong] of [[stack.client, 3], [second, 2]] as const) {
      for (let i = 0; i < wrong; i++) assertAuthError(await list(client, guess()), 401, 'wrong key');
    }
    // Each process saw fewer than 5 itself. A key it has not verified yet is checked against the
    // address's failures, and not counted when it passes: each poll shows what the process knows.
    for (const client of [stack.client, second]) {
      const refused = await waitFor(async () => {
        const r = await list(client, (await newKey()).key);
        return r.status === 429 && r;
      }, `${client.baseUrl} to learn the failures counted by both`);
      assert.equal(refused.body.data.code, 'rate_limited');
      assert.match(refused.body.message, /^Too many failed authentications from this address; retry in \d+ s$/);
      assert.equal((await list(client, guess())).status, 429);
    }
  });

  it('refuses a key on one process once both together took RATE_LIMIT_PER_SECOND of its requests this second', async () => {
    // One attempt per new key: it uses up the limit on the first process, then the second is asked
    // (paced, so that a sync may come between requests) until it refuses, or has served the whole
    // limit itself as it would counting alone. A second ending during an attempt starts the count
    // again: the next attempt follows.
    const used: { id: string; key: string }[] = [];
    const redis = new Redis(stack.env.REDIS_URL);
    try {
      const refused = await waitFor(async () => {
        const { id, key } = await newKey();
        used.push({ id, key });
        let taken = 0;
        while ((await stack.client.as(key).get('/api/task/v1')).status === 200) assert.ok(++taken < 3 * limit);
        for (let served = 0; served < limit; served++) {
          const r = await second.as(key).get('/api/task/v1');
          if (r.status === 429) return r;
          assert.equal(r.status, 200, r.text);
          await sleep(50);
        }
        return false;
      }, 'the second process to refuse a key the first used up', 30000);
      assert.equal(refused.body.data.code, 'rate_limited');
      assert.match(refused.headers.get('retry-after') ?? '', /^[1-9]\d*$/);
      // The shared counters (a second's kept for two) name keys by id and addresses as they are, never by a key presented.
      const names = (await redis.keys(`${stack.env.QUEUE_PREFIX}:limit:*`)).join('\n');
      assert.ok(names.includes(':limit:rate:') && names.includes(used.at(-1)!.id), names);
      assert.ok(names.includes(':limit:auth_failures:') && names.includes('198.51.100.20'), names);
      for (const secret of [ADMIN_KEY, ...used.map((u) => u.key)]) assert.ok(!names.includes(secret), 'a key presented names a counter');
    } finally {
      redis.disconnect();
    }
  });
});

describe('request limits with Redis unreachable', () => {
  // One request a second: a burst of twenty shows the limit unless it takes twenty seconds.
  const own = behindServiceProxy('REDIS_URL', { AUTH_FAILURES_PER_MINUTE: '5', RATE_LIMIT_PER_SECOND: '1', TRUST_PROXY: 'true', DB_QUERY_TIMEOUT_MS: '1000' });
  const outageLines = () => own.stack.api.logs.filter((l) => l.includes('Redis unavailable for the request limits'));

  it('answers as before, counting in each process alone, and says so once per outage', async () => {
    const { stack, proxy } = own;
    assert.equal((await stack.client.get('/api/task/v1')).status, 200);
    proxy.swallow();
    const list = (key: string) => stack.client.as(key).request('GET', '/api/task/v1', undefined, { headers: { 'x-forwarded-for': '198.51.100.30' } });
    for (let i = 0; i < 5; i++) assertAuthError(await list(guess()), 401, `wrong key ${i + 1}`);
    const blocked = await list(guess());
    assert.equal(blocked.status, 429, blocked.text);
    assert.equal(blocked.body.data.code, 'rate_limited');
    await waitFor(async () => outageLines().length > 0, 'the outage to be logged');
    const from = Date.now();
    const results = await Promise.all(Array.from({ length: 20 }, () => stack.client.get('/api/task/v1')));
    const passed = results.filter((r) => r.status === 200);
    const limited = results.filter((r) => r.status === 429);
    assertPerSecondLimit(from, passed.length, 20, 1);
    assert.equal(passed.length + limited.length, 20, results.map((r) => r.status).join(','));
    for (const r of limited) assert.match(r.headers.get('retry-after') ?? '', /^[1-9]\d*$/);
    proxy.forward();
    await waitFor(async () => stack.api.logs.some((l) => l.includes('Redis back for the request limits')), 'Redis to be back for the limits');
    assert.equal(outageLines().length, 1, outageLines().join('\n'));
    assert.ok(!outageLines()[0].includes(ADMIN_KEY));
  });
});

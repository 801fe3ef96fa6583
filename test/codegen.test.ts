import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { ADMIN_KEY, assertError, ROOT, resetDb, startStack, testDb, readUntilClosed, unreadAnswer, useStack, waitFor, type Client, type Stack } from './helpers/stack.ts';
import { behindServiceProxy } from './helpers/black-hole-proxy.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const CODEGEN = '/_internal/v1/trigger_codegen';

// Type-checks files with the project's TypeScript in strict mode; returns the diagnostics.
// Not pretty: tsc colours its output where it takes the terminal to be one (FORCE_COLOR), and the
// assertions read 'file(line,col)'.
function typecheck(dir: string, files: string[]): { ok: boolean; output: string } {
  const tsc = path.join(ROOT, 'node_modules/.bin/tsc');
  const r = spawnSync(tsc, ['--noEmit', '--pretty', 'false', '--strict', '--target', 'es2022', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--lib', 'es2022,dom', '--types', '', ...files], { cwd: dir, encoding: 'utf8' });
  return { ok: r.status === 0, output: `${r.stdout}${r.stderr}` };
}

describe('POST /_internal/v1/trigger_codegen: a typed TypeScript client for the enabled function instances', () => {
  let stack: Stack;
  let c: Client;
  let providers: FakeProviders;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-codegen-'));
  const write = (files: { path: string; content: string }[]) => {
    for (const f of files) {
      fs.mkdirSync(path.dirname(path.join(dir, f.path)), { recursive: true });
      fs.writeFileSync(path.join(dir, f.path), f.content);
    }
  };

  before(async () => {
    await resetDb();
    providers = await startFakeProviders();
    stack = await startStack({ STRIPE_API_BASE_URL: providers.url, GOOGLE_MAIL_API_BASE_URL: providers.url, BRIDGE_ALLOW_PRIVATE: 'true' }, { workers: 0 });
    c = stack.client;
    fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ type: 'module' }));
  });
  after(async () => {
    await stack?.stop();
    providers?.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('with nothing enabled: an empty client that still compiles', async () => {
    const r = await c.post('/_internal/v1/trigger_codegen');
    assert.equal(r.status, 200, r.text);
    assert.match(r.body.message, /0 function instance/);
    assert.deepEqual(r.body.files.map((f: { path: string }) => f.path).sort(), ['bridge-client/index.ts', 'bridge-client/runtime.ts', 'bridge-client/types.ts']);
    write(r.body.files);
    const checked = typecheck(dir, ['bridge-client/index.ts']);
    assert.ok(checked.ok, checked.output);
  });

  it('one method per enabled function instance, typed from its schemas: right calls compile and run (with an idempotency key when given), wrong ones do not compile', async () => {
    const stripeCred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'sk_test_gen' } });
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'stripe-main', display_name: 'Stripe', resource_server_credential_id: stripeCred.body.id })).status, 201);
    assert.equal((await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/enable`, {})).status, 201);
    const rs = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, { value: { client_id: 'c', client_secret: 's', redirect_uri: 'https://example.com/cb' } });
    const user = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`, { value: { access_token: 'at', expiry_time: '2099-01-01T00:00:00Z' } });
    assert.equal((await c.post(avail('google_mail', 'oauth_auth_flow'), {
      provider_instance_id: '2nd-mail', display_name: 'Mail', resource_server_credential_id: rs.body.id, user_credential_id: user.body.id,
    })).status, 201);
    assert.equal((await c.post(`${B}/provider/2nd-mail/function/google_mail_send_email/enable`, {})).status, 201);

    const r = await c.post('/_internal/v1/trigger_codegen');
    assert.equal(r.status, 200, r.text);
    assert.match(r.body.message, /2 function instance/);
    write(r.body.files);
    const index = r.body.files.find((f: { path: string }) => f.path === 'bridge-client/index.ts').content as string;
    assert.match(index, /stripeMainStripeProcessRefund\(params: StripeProcessRefundParams, options\?: InvokeOptions\): Promise<InvokeResult<StripeProcessRefundOutput>>/);
    assert.match(index, /_2ndMailGoogleMailSendEmail\(params: GoogleMailSendEmailParams, options\?: InvokeOptions\)/);
    assert.ok(!JSON.stringify(r.body).includes('sk_test_gen'), 'no credential in the generated code');

    fs.writeFileSync(path.join(dir, 'use.ts'), `import { BridgeClient } from './bridge-client/index.js';
declare const process: { env: Record<string, string | undefined> };
const client = new BridgeClient({ baseUrl: process.env.BASE_URL!, apiKey: process.env.API_KEY! });
const refund = await client.stripeMainStripeProcessRefund({ payment_intent: 'pi_gen', amount: 300 });
const mail = await client._2ndMailGoogleMailSendEmail({ to: 'a@example.com', subject: 'Hi', body: 'Hello' });
const keyed = await client.stripeMainStripeProcessRefund({ payment_intent: 'pi_gen_keyed' }, { idempotencyKey: 'order 42 refund' });
if (refund.type === 'success' && mail.type === 'success' && keyed.type === 'success') console.log(JSON.stringify({ refund: refund.amount, mail: mail.message_id, keyed: keyed.payment_intent }));
else console.log(JSON.stringify({ refund, mail, keyed }));
`);
    const good = typecheck(dir, ['use.ts']);
    assert.ok(good.ok, good.output);
    // tsx from this project: the generated client itself needs nothing installed. Not spawnSync:
    // the provider servers run in this process.
    const before = providers.seen.length;
    const run = await promisify(execFile)(process.execPath, ['--import', pathToFileURL(path.join(ROOT, 'node_modules/tsx/dist/loader.mjs')).href, 'use.ts'], {
      cwd: dir, encoding: 'utf8', env: { ...process.env, BASE_URL: stack.api.url, API_KEY: ADMIN_KEY },
    });
    assert.deepEqual(JSON.parse(run.stdout.trim()), { refund: 300, mail: `msg-${before + 2}`, keyed: 'pi_gen_keyed' });
    // The key travels as the provider's Idempotency-Key header; a call without one sends none.
    assert.deepEqual(providers.seen.slice(before).map((s) => [s.url, s.idempotencyKey]), [
      ['/v1/refunds', undefined], ['/gmail/v1/users/me/messages/send', undefined], ['/v1/refunds', 'order 42 refund'],
    ]);

    fs.writeFileSync(path.join(dir, 'wrong.ts'), `import { BridgeClient } from './bridge-client/index.js';
const client = new BridgeClient({ baseUrl: 'http://x', apiKey: 'k' });
await client.stripeMainStripeProcessRefund({ payment_intent: 'pi', amount: 'ten' });
await client._2ndMailGoogleMailSendEmail({ to: 'a@example.com', subject: 'no body' });
await client.stripeMainStripeProcessRefund({ amount: 5 });
await client.stripeMainStripeProcessRefund({ charge: 'ch_1', reason: 'bored' });
await client.stripeMainStripeProcessRefund({ charge: 'ch_1' }, { idempotency_key: 'k' });
`);
    const bad = typecheck(dir, ['wrong.ts']);
    assert.equal(bad.ok, false);
    assert.match(bad.output, /wrong\.ts\(3,.*amount/s);
    assert.match(bad.output, /wrong\.ts\(4,.*body/s);
    assert.match(bad.output, /wrong\.ts\(5,/, 'neither payment_intent nor charge');
    assert.match(bad.output, /wrong\.ts\(6,.*bored/s);
    assert.match(bad.output, /wrong\.ts\(7,.*idempotency_key/s);
  });

  it('leaves out the instances whose provider or function the catalog no longer has, with one warning naming them', async () => {
    // A release that removed a function, and one that removed a provider: the rows stay (function_controller_type_id and provider_controller_type_id are free text).
    const db = testDb();
    await db('function_instances').insert({ provider_instance_id: 'stripe-main', function_controller_type_id: 'stripe_retired_payout', provider_controller_type_id: 'stripe' });
    await db('provider_instances').insert({ id: 'legacy-crm', display_name: 'CRM', provider_controller_type_id: 'retired_crm', credential_controller_type_id: 'api_key', status: 'active' });
    await db('function_instances').insert({ provider_instance_id: 'legacy-crm', function_controller_type_id: 'retired_crm_sync', provider_controller_type_id: 'retired_crm' });
    try {
      const r = await c.post('/_internal/v1/trigger_codegen');
      assert.equal(r.status, 200, r.text);
      assert.match(r.body.message, /for 2 function instance/);
      assert.ok(!/retired|legacy/i.test(r.text), 'neither is in the client');
      const index = r.body.files.find((f: { path: string }) => f.path === 'bridge-client/index.ts').content as string;
      assert.deepEqual([...index.matchAll(/^ {2}(\w+)\(params/gm)].map((m) => m[1]), ['_2ndMailGoogleMailSendEmail', 'stripeMainStripeProcessRefund']);
      write(r.body.files);
      const checked = typecheck(dir, ['bridge-client/index.ts']);
      assert.ok(checked.ok, checked.output);
      // Logged as the document ends, after the request line (written once the answer began).
      const id = r.headers.get('x-request-id');
      const warning = JSON.parse(await waitFor(async () => stack.api.logs.find((l) => l.includes(`"req_id":"${id}"`) && l.includes('left out')), 'the warning'));
      assert.equal(stack.api.logs.filter((l) => l.includes('left out')).length, 1, 'one warning');
      assert.equal(warning.level, 40);
      assert.equal(warning.left_out, 2);
      assert.deepEqual(warning.first, [
        { provider_instance_id: 'legacy-crm', provider_controller_type_id: 'retired_crm', function_controller_type_id: 'retired_crm_sync' },
        { provider_instance_id: 'stripe-main', provider_controller_type_id: 'stripe', function_controller_type_id: 'stripe_retired_payout' },
      ]);
    } finally {
      await db('provider_instances').where({ id: 'legacy-crm' }).delete();
      await db('function_instances').where({ function_controller_type_id: 'stripe_retired_payout' }).delete();
    }
  });

  it('needs scope internal (401, 403)', async () => {
    assert.equal((await c.as(undefined).post('/_internal/v1/trigger_codegen')).status, 401);
    const key = (await c.post('/api/auth/v1/api-key', { name: 'bridge', scopes: ['bridge:read', 'bridge:invoke'] })).body.key;
    assert.equal((await c.as(key).post('/_internal/v1/trigger_codegen')).status, 403);
  });
});

describe('POST /_internal/v1/trigger_codegen with Postgres out of reach', () => {
  const own = behindServiceProxy('DATABASE_URL', { DB_QUERY_TIMEOUT_MS: '1000' });

  it('answers 503 before anything else, and whole once it is back', async () => {
    own.proxy.swallow();
    const during = await own.stack.client.post(CODEGEN);
    assertError(during, 503, 'unavailable');
    own.proxy.forward();
    await waitFor(async () => (await own.stack.client.post(CODEGEN)).status === 200, 'the client again');
  });
});

// Answers waiting on their clients: a snapshot open between two batches (or, for a moment, one
// written on between two of them). Counted, or ended under them (pg_terminate_backend) and counted.
const WAITING = `from pg_stat_activity where state = 'idle in transaction' and query like '%from "function_instances"%'`;
const waitingAnswers = async () => (await testDb().raw(`select count(*)::int as n ${WAITING}`)).rows[0].n as number;
const endWaitingAnswers = async () => (await testDb().raw(`select count(*) filter (where pg_terminate_backend(pid))::int as n ${WAITING}`)).rows[0].n as number;

describe('POST /_internal/v1/trigger_codegen of more function instances than the API heap holds generated', function () {
  this.timeout(120_000);
  const INSTANCES = 100_000;
  // Some 350 bytes of client a method (35 MB in all): built whole, with the rows, the text and its JSON, the client took more than this heap.
  const stack = useStack({ NODE_OPTIONS: '--max-old-space-size=96', RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
  const ids = Array.from({ length: INSTANCES }, (_, i) => `inst-${String(i + 1).padStart(6, '0')}`);

  before(async () => {
    const db = testDb();
    await db.raw(`insert into provider_instances (id, display_name, provider_controller_type_id, credential_controller_type_id, status)
                  select 'inst-' || lpad(i::text, 6, '0'), 'Instance ' || i, case when i % 2 = 0 then 'google_mail' else 'stripe' end,
                         case when i % 2 = 0 then 'oauth2_jwt_bearer_assertion_flow' else 'api_key' end, 'active' from generate_series(1, ?) i`, [INSTANCES]);
    await db.raw(`insert into function_instances (provider_instance_id, function_controller_type_id, provider_controller_type_id)
                  select id, case when provider_controller_type_id = 'stripe' then 'stripe_process_refund' else 'google_mail_send_email' end, provider_controller_type_id
                    from provider_instances`);
  });

  it('streams it whole: one method per instance, in instance order', async () => {
    const res = await stack.client.post(CODEGEN);
    assert.equal(res.status, 200, res.text.slice(0, 300));
    assert.equal(res.headers.get('content-type'), 'application/json; charset=utf-8');
    assert.equal(res.body.message, `Generated a TypeScript client for ${INSTANCES} function instance(s)`);
    assert.deepEqual(res.body.files.map((f: { path: string }) => f.path), ['bridge-client/types.ts', 'bridge-client/runtime.ts', 'bridge-client/index.ts']);
    const index = res.body.files[2].content as string;
    assert.ok(index.length > 30 * 1024 * 1024, `${index.length} characters`);
    assert.deepEqual([...index.matchAll(/return this\.invoke\("([^"]+)", "([^"]+)"/g)].map((m) => m[1]), ids);
    assert.match(index, /^  inst100000GoogleMailSendEmail\(params: GoogleMailSendEmailParams, options\?: InvokeOptions\): Promise<InvokeResult<GoogleMailSendEmailOutput>> \{$/m);
    assert.ok(JSON.stringify(res.body) === res.text, 'the text is JSON.stringify of the answer');
    // It ends as the last part goes out, which may be just after the client has it.
    await waitFor(async () => (await waitingAnswers()) === 0, 'its snapshot to end');
    assert.equal(stack.api.child.exitCode, null, 'the API is still running');
  });

  it('clients that go away mid-answer: two at once, a third refused (503), each snapshot and its connection are released, and the next answer is whole', async () => {
    const clients = [unreadAnswer(stack.api.url, 'POST', CODEGEN), unreadAnswer(stack.api.url, 'POST', CODEGEN)];
    await waitFor(async () => (await waitingAnswers()) === 2, 'both answers to wait on their clients');
    const third = await stack.client.post(CODEGEN);
    assertError(third, 503, 'unavailable');
    assert.equal(third.headers.get('retry-after'), '5');
    for (const client of clients) client.destroy();
    await waitFor(async () => (await waitingAnswers()) === 0, 'the snapshots to end');
    const next = await stack.client.post(CODEGEN);
    assert.equal(next.status, 200, next.text.slice(0, 300));
    assert.equal(next.body.message, `Generated a TypeScript client for ${INSTANCES} function instance(s)`);
    assert.ok(!stack.api.logs.some((l) => l.includes('generated client failed')), 'a client going away is no failure');
  });

  it('an answer whose database connection is lost mid-way: its client gets it cut short, the failure is logged, and the next answers are whole', async () => {
    await waitFor(async () => (await waitingAnswers()) === 0, 'the snapshots of the answers before to end');
    // The request line is logged as the answer begins, after the reads before it (ended under
    // those, the answer is a whole 503, which a loaded run once hit).
    const begun = () => stack.api.logs.filter((l) => l.includes('"msg":"request"') && l.includes(`"path":"${CODEGEN}"`) && l.includes('"status":200')).length;
    const before = begun();
    const client = unreadAnswer(stack.api.url, 'POST', CODEGEN);
    await waitFor(async () => begun() > before, 'the answer to begin');
    // Tried until it hits: seen idle between two batches, a snapshot may be busy with the next by then.
    await waitFor(async () => (await endWaitingAnswers()) === 1, 'its snapshot to be ended under it');
    const received = await readUntilClosed(client);
    assert.match(received, /^HTTP\/1\.1 200 /);
    assert.ok(!received.endsWith('\r\n0\r\n\r\n'), 'the chunked answer is cut, not ended');
    const line = await waitFor(async () => stack.api.logs.find((l) => l.includes('generated client failed')), 'the failure to be logged');
    assert.equal(JSON.parse(line).level, 50);
    // Both places are free again: the cut answer's is once its snapshot has ended, a moment after the
    // failure is logged (asked at once, a loaded run got a 503 for one of the two).
    const next = await waitFor(async () => {
      const pair = await Promise.all([stack.client.post(CODEGEN), stack.client.post(CODEGEN)]);
      return pair.every((r) => r.status === 200) && pair;
    }, 'both places to be free again', 60000, 200);
    assert.deepEqual(next.map((r) => r.status), [200, 200]);
    await waitFor(async () => (await waitingAnswers()) === 0, 'their snapshots to end');
  });
});

import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { ADMIN_KEY, ROOT, resetDb, startStack, type Client, type Stack } from './helpers/stack.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;

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

  it('one method per enabled function instance, typed from its schemas: right calls compile and run, wrong ones do not compile', async () => {
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
    assert.match(index, /stripeMainStripeProcessRefund\(params: StripeProcessRefundParams\): Promise<InvokeResult<StripeProcessRefundOutput>>/);
    assert.match(index, /_2ndMailGoogleMailSendEmail\(params: GoogleMailSendEmailParams\)/);
    assert.ok(!JSON.stringify(r.body).includes('sk_test_gen'), 'no credential in the generated code');

    fs.writeFileSync(path.join(dir, 'use.ts'), `import { BridgeClient } from './bridge-client/index.js';
declare const process: { env: Record<string, string | undefined> };
const client = new BridgeClient({ baseUrl: process.env.BASE_URL!, apiKey: process.env.API_KEY! });
const refund = await client.stripeMainStripeProcessRefund({ payment_intent: 'pi_gen', amount: 300 });
const mail = await client._2ndMailGoogleMailSendEmail({ to: 'a@example.com', subject: 'Hi', body: 'Hello' });
if (refund.type === 'success' && mail.type === 'success') console.log(JSON.stringify({ refund: refund.amount, mail: mail.message_id }));
else console.log(JSON.stringify({ refund, mail }));
`);
    const good = typecheck(dir, ['use.ts']);
    assert.ok(good.ok, good.output);
    // tsx from this project: the generated client itself needs nothing installed. Not spawnSync:
    // the provider servers run in this process.
    const run = await promisify(execFile)(process.execPath, ['--import', pathToFileURL(path.join(ROOT, 'node_modules/tsx/dist/loader.mjs')).href, 'use.ts'], {
      cwd: dir, encoding: 'utf8', env: { ...process.env, BASE_URL: stack.api.url, API_KEY: ADMIN_KEY },
    });
    assert.deepEqual(JSON.parse(run.stdout.trim()), { refund: 300, mail: `msg-${providers.seen.length}` });

    fs.writeFileSync(path.join(dir, 'wrong.ts'), `import { BridgeClient } from './bridge-client/index.js';
const client = new BridgeClient({ baseUrl: 'http://x', apiKey: 'k' });
await client.stripeMainStripeProcessRefund({ payment_intent: 'pi', amount: 'ten' });
await client._2ndMailGoogleMailSendEmail({ to: 'a@example.com', subject: 'no body' });
await client.stripeMainStripeProcessRefund({ amount: 5 });
await client.stripeMainStripeProcessRefund({ charge: 'ch_1', reason: 'bored' });
`);
    const bad = typecheck(dir, ['wrong.ts']);
    assert.equal(bad.ok, false);
    assert.match(bad.output, /wrong\.ts\(3,.*amount/s);
    assert.match(bad.output, /wrong\.ts\(4,.*body/s);
    assert.match(bad.output, /wrong\.ts\(5,/, 'neither payment_intent nor charge');
    assert.match(bad.output, /wrong\.ts\(6,.*bored/s);
  });

  it('needs scope internal (401, 403)', async () => {
    assert.equal((await c.as(undefined).post('/_internal/v1/trigger_codegen')).status, 401);
    const key = (await c.post('/api/auth/v1/api-key', { name: 'bridge', scopes: ['bridge:read', 'bridge:invoke'] })).body.key;
    assert.equal((await c.as(key).post('/_internal/v1/trigger_codegen')).status, 403);
  });
});

// The bridge (SPEC.md section 7) through HTTP: catalog, credentials, provider instances, function
// enable/disable/invoke against local stand-ins for the Stripe and Gmail APIs and an OAuth token
// endpoint, and an agent module invoking a bridge function.
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import { createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes, randomUUID, verify } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv } from 'ajv';
import { callUpstream } from '../domain/bridge/upstream.ts';
import { assertError, Client, requestLogsThrough, ROOT, resetDb, startApi, startStack, testDb, testEnv, type Stack, assertNotFound, useStack, waitFor } from './helpers/stack.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const STRIPE_KEY = `sk_test_${randomUUID().replace(/-/g, '')}`;
const ACCESS_TOKEN = `ya29.${randomUUID()}`;
const CLIENT_SECRET = `cs-${randomUUID()}`;
const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048, privateKeyEncoding: { type: 'pkcs8', format: 'pem' }, publicKeyEncoding: { type: 'spki', format: 'pem' } });

interface Seen { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }
// Token answers to assertions from these issuers that no call could use, and the 502 message each gets:
// an access token that cannot be an Authorization header, or a token type other than bearer.
const HEADER_REFUSAL = 'token endpoint: answered an access_token that cannot be sent in an Authorization header (printable ASCII, at most 8192 characters)';
const TYPE_REFUSAL = 'token endpoint: answered a token_type that is not bearer: only bearer tokens are supported';
const UNUSABLE_TOKENS: Record<string, { answer: { access_token: string; token_type: unknown }; message: string }> = {
  'unicode@example.iam': { answer: { access_token: 'at\u00e9\u4e2d', token_type: 'Bearer' }, message: HEADER_REFUSAL },
  'crlf@example.iam': { answer: { access_token: 'at\r\nX-Injected: 1', token_type: 'Bearer' }, message: HEADER_REFUSAL },
  'dpop@example.iam': { answer: { access_token: 'dpop-access', token_type: 'DPoP' }, message: TYPE_REFUSAL },
  'numeric-type@example.iam': { answer: { access_token: 'typed-access', token_type: 5 }, message: TYPE_REFUSAL },
};

// Answers like the provider APIs: refunds (pi_refused is refused, pi_boom fails on Stripe's
// side, pi_slow answers after 3 s, pi_deep nests 5,000 levels deep), Gmail send, and an RFC 7523 token endpoint that checks the assertion's signature
// (bar UNUSABLE_TOKENS' issuers); /token/hold never answers, and /token/slow answers after
// SLOW_TOKEN_MS with a token whose mails are never answered.
// Refunds honour an Idempotency-Key as Stripe does: a repeat of a key gets the first answer (a
// refusal too) without refunding again, or 400 when its params differ; `made.refunds` counts refunds made.
// Refusals that quote the credential they got: refund pi_echo, a mail with subject "echo", an assertion from echo@example.iam.
const SLOW_TOKEN_MS = 2500;
function startProviders(): Promise<{ server: http.Server; url: string; seen: Seen[]; made: { refunds: number } }> {
  const seen: Seen[] = [];
  const made = { refunds: 0 };
  const byKey = new Map<string, { body: string; status: number; json: unknown }>();
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method!, url: req.url!, headers: req.headers, body });
      const send = (status: number, json: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(json));
      if (req.url === '/v1/refunds') {
        if (req.headers.authorization !== `Bearer ${STRIPE_KEY}`) return send(401, { error: { message: 'Invalid API Key provided' } });
        const key = req.headers['idempotency-key'] as string | undefined;
        const first = key === undefined ? undefined : byKey.get(key);
        if (first) {
          return first.body === body ? send(first.status, first.json)
            : send(400, { error: { type: 'idempotency_error', message: 'Keys for idempotent requests can only be used with the same parameters they were first used with.' } });
        }
        const answer = (status: number, json: unknown) => {
          if (key !== undefined) byKey.set(key, { body, status, json });
          send(status, json);
        };
        const form = new URLSearchParams(body);
        if (form.get('payment_intent') === 'pi_refused') return answer(400, { error: { type: 'invalid_request_error', message: "No such payment_intent: 'pi_refused'" } });
        if (form.get('payment_intent') === 'pi_echo') return send(400, { error: { message: `No such payment_intent for key ${STRIPE_KEY} (${req.headers.authorization})` } });
        if (form.get('payment_intent') === 'pi_boom') return send(500, { error: { message: 'internal' } });
        if (form.get('payment_intent') === 'pi_null') return send(200, { id: 're_null', object: 'refund', amount: 1000, status: null, payment_intent: null, charge: null, reason: null, balance_transaction: null, metadata: null });
        if (form.get('payment_intent') === 'pi_odd') return send(200, { id: 're_odd', object: 'charge', amount: 1000, status: 'succeeded' });
        if (form.get('payment_intent') === 'pi_slow') return void setTimeout(() => send(200, { id: 're_late', object: 'refund' }), 3000);
        if (form.get('payment_intent') === 'pi_deep') return void res.writeHead(200, { 'content-type': 'application/json' }).end(`{"id":"re_deep","n":${'['.repeat(5000)}${']'.repeat(5000)}}`);
        if (form.get('payment_intent') === 'pi_cut') {
          res.writeHead(200, { 'content-type': 'application/json' }).write('{"id": "re_');
          return void setTimeout(() => res.destroy(), 50);
        }
        made.refunds++;
        return answer(200, { id: 're_1', object: 'refund', amount: Number(form.get('amount') ?? 1000), status: 'succeeded', payment_intent: form.get('payment_intent') });
      }
      if (req.url === '/token/hold') return;
      if (req.url === '/token/slow') return void setTimeout(() => send(200, { access_token: 'slow-access', token_type: 'Bearer' }), SLOW_TOKEN_MS);
      if (req.url === '/gmail/v1/users/me/messages/send') {
        if (req.headers.authorization === 'Bearer slow-access') return;
        if (!['Bearer jwt-access', `Bearer ${ACCESS_TOKEN}`].includes(req.headers.authorization ?? '')) return send(401, { error: { message: 'Request had invalid authentication credentials.' } });
        if (/\r\nSubject: echo\r\n/.test(Buffer.from(JSON.parse(body).raw, 'base64url').toString())) return send(403, { error: { message: `Token ${req.headers.authorization} may not send this` } });
        return send(200, { id: `msg-${seen.length}`, threadId: 't1' });
      }
      if (req.url === '/token') {
        const form = new URLSearchParams(body);
        const [h, c, sig] = (form.get('assertion') ?? '').split('.');
        const iss = JSON.parse(Buffer.from(c ?? '', 'base64url').toString() || '{}').iss;
        if (iss === 'echo@example.iam') return send(400, { error: 'invalid_grant', error_description: `Invalid JWT: ${form.get('assertion')} (${body})` });
        if (UNUSABLE_TOKENS[iss]) return send(200, { ...UNUSABLE_TOKENS[iss].answer, expires_in: 3600 });
        const ok = form.get('grant_type') === 'urn:ietf:params:oauth:grant-type:jwt-bearer' && sig
          && verify('sha256', Buffer.from(`${h}.${c}`), createPublicKey(publicKey), Buffer.from(sig, 'base64url'));
        if (!ok) return send(400, { error: 'invalid_grant', error_description: 'bad assertion' });
        return send(200, { access_token: 'jwt-access', token_type: 'Bearer', expires_in: 3600 });
      }
      return send(404, { error: { message: 'no such route' } });
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen, made })));
}

describe('bridge API', () => {
  let stack: Stack;
  let c: Client;
  let providers: Awaited<ReturnType<typeof startProviders>>;
  const answers: string[] = [];
  const lastSeen = (url: string) => [...providers.seen].reverse().find((s) => s.url === url)!;

  const stripeInstance = async (id: string) => {
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, metadata: { team: 'billing' } });
    assert.equal(cred.status, 201, cred.text);
    const inst = await c.post(avail('stripe', 'api_key'), { provider_instance_id: id, display_name: 'Stripe', resource_server_credential_id: cred.body.id });
    assert.equal(inst.status, 201, inst.text);
    return { cred: cred.body, inst: inst.body };
  };
  const invoke = (id: string, fn: string, params: unknown) => c.post(`${B}/provider/${id}/function/${fn}/invoke`, { params });

  before(async () => {
    await resetDb();
    providers = await startProviders();
    stack = await startStack({
      STRIPE_API_BASE_URL: providers.url, GOOGLE_MAIL_API_BASE_URL: `${providers.url}/`, BRIDGE_ALLOW_PRIVATE: 'true',
      // The fake providers answer from this busy test process: a short timeout would turn a slow answer into a 502.
      BRIDGE_TIMEOUT_MS: '10000',
      AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/bridge-agent.ts'),
    });
    c = stack.client;
    // Every answer this file gets, success or error, is scanned for secrets at the end.
    const request = c.request.bind(c);
    c.request = async (...args: Parameters<Client['request']>) => {
      const r = await request(...args);
      answers.push(`${args[0]} ${args[1]} ${r.status}: ${r.text}`);
      return r;
    };
  });
  after(async () => {
    await stack?.stop();
    providers?.server.close();
  });

  it('serves the catalog: google_mail and stripe with their credential controllers and function schemas', async () => {
    const r = await c.get(`${B}/available-providers`);
    assert.equal(r.status, 200, r.text);
    const byId = Object.fromEntries(r.body.items.map((p: any) => [p.type_id, p]));
    assert.deepEqual(Object.keys(byId).sort(), ['google_mail', 'stripe']);
    assert.deepEqual(byId.stripe.credential_controllers.map((cc: any) => cc.type_id), ['api_key']);
    assert.deepEqual(byId.google_mail.credential_controllers.map((cc: any) => cc.type_id), ['oauth_auth_flow', 'oauth2_jwt_bearer_assertion_flow']);
    const refund = byId.stripe.functions[0];
    assert.equal(refund.type_id, 'stripe_process_refund');
    assert.equal(refund.parameters.type, 'object');
    assert.deepEqual(Object.keys(refund.parameters.properties).sort(), ['amount', 'charge', 'payment_intent', 'reason']);
    const oauth = byId.google_mail.credential_controllers[0];
    assert.equal(oauth.requires_brokering, true);
    assert.deepEqual(oauth.configuration_schema.user_credential.required.sort(), ['access_token', 'expiry_time']);
    assert.deepEqual(byId.google_mail.functions.map((f: any) => f.type_id), ['google_mail_send_email']);

    // Paged in type_id order like every list.
    const first = await c.get(`${B}/available-providers?page_size=1`);
    assert.deepEqual(first.body.items.map((p: any) => p.type_id), ['google_mail']);
    const second = await c.get(`${B}/available-providers?page_size=1&next_page_token=${first.body.next_page_token}`);
    assert.deepEqual(second.body.items.map((p: any) => p.type_id), ['stripe']);
    assert.ok(!('next_page_token' in second.body));
    assert.equal((await c.get(`${B}/available-providers?next_page_token=bogus`)).status, 400);
  });

  it('stores credentials with sensitive members encrypted and rejects bad ones without storing anything', async () => {
    const r = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
    assert.equal(r.status, 201, r.text);
    assert.deepEqual(Object.keys(r.body).sort(), ['created_at', 'dek_alias', 'id', 'metadata', 'type_id', 'updated_at', 'value']);
    assert.equal(r.body.type_id, 'api_key');
    assert.equal(r.body.dek_alias, 'default');
    assert.ok(!r.text.includes(STRIPE_KEY));
    const row = await testDb()('bridge_credentials').where({ id: r.body.id }).first();
    assert.ok(!JSON.stringify(row).includes(STRIPE_KEY), 'the raw key is not stored');

    const before = await testDb()('bridge_credentials').count({ n: '*' });
    const weakKey = generateKeyPairSync('rsa', { modulusLength: 1024, privateKeyEncoding: { type: 'pkcs8', format: 'pem' }, publicKeyEncoding: { type: 'spki', format: 'pem' } }).privateKey;
    // Parses as a 2048-bit RSA key, but a prime of 0 cannot sign.
    const jwk = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' });
    const brokenKey = createPrivateKey({ key: { ...jwk, p: 'AA' }, format: 'jwk' }).export({ type: 'pkcs1', format: 'pem' });
    const bad: [string, unknown, number, RegExp][] = [
      [`${avail('stripe', 'api_key')}/credential/resource-server`, { value: {} }, 400, /body\.value\.api_key is required/],
      [`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'has space' } }, 400, /body\.value\.api_key/],
      [`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'k', extra: 1 } }, 400, /body\.value\.extra is not an allowed member/],
      [`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'k' }, dek_alias: 'nope' }, 404, /dek_alias 'nope' not found/],
      [`${avail('stripe', 'api_key')}/credential/user-credential`, { value: {} }, 400, /has no user credential/],
      [`${avail('stripe', 'oauth_auth_flow')}/credential/resource-server`, { value: {} }, 404, /^credential controller 'oauth_auth_flow' not found for provider 'stripe'$/],
      [`${avail('nope', 'api_key')}/credential/resource-server`, { value: {} }, 404, /provider controller 'nope' not found/],
      [`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc', private_key: 'not a key', token_uri: `${providers.url}/token` } }, 400, /private_key is not a PEM RSA private key/],
      [`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc', private_key: weakKey, token_uri: `${providers.url}/token` } }, 400, /private_key is a 1024-bit RSA key; RS256 needs 2048 bits or more/],
      [`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc', private_key: brokenKey, token_uri: `${providers.url}/token` } }, 400, /private_key cannot sign: its RSA components do not fit together/],
      [`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`, { value: { access_token: 'a', expiry_time: 'tomorrow' } }, 400, /expiry_time/],
      // URLs fetch and the provider could not take as written: unparsable, or with a tab or newline (WHATWG URL drops them).
      [`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`,
        { value: { client_id: 'c', client_secret: 's', redirect_uri: 'https://[app.example.com/cb', scopes: ['x'] } }, 400, /^Invalid body\.value: body\.value\.redirect_uri must be an http\(s\) URL$/],
      [`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`,
        { value: { client_id: 'c', client_secret: 's', redirect_uri: 'https://app.example.com/c\nb', scopes: ['x'] } }, 400, /body\.value\.redirect_uri must be an http\(s\) URL/],
      [`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc', private_key: 'not a key', token_uri: 'https://tok\ten.example/token' } }, 400, /body\.value\.token_uri must be an http\(s\) URL/],
    ];
    for (const [url, body, status, message] of bad) {
      const res = await c.post(url, body);
      assert.equal(res.status, status, `${url} ${JSON.stringify(body)}: ${res.text}`);
      assert.match(res.body.message, message);
    }
    // data.resource is a fixed snake_case name clients match on; the message says it in words.
    assertNotFound(await c.post(`${avail('stripe', 'oauth_auth_flow')}/credential/resource-server`, { value: {} }), 'credential_controller', 'oauth_auth_flow');
    assertNotFound(await c.post(`${avail('nope', 'api_key')}/credential/resource-server`, { value: {} }), 'provider_controller', 'nope');
    assert.deepEqual(await testDb()('bridge_credentials').count({ n: '*' }), before);
  });

  it('invokes an enabled stripe refund: success, provider refusal, upstream failure, and every refusal of ours', async () => {
    const { inst, cred } = await stripeInstance('stripe-main');
    assert.equal(inst.status, 'active');
    assert.equal(inst.resource_server_credential_id, cred.id);

    // 404s name the resource by a fixed type name (data.resource) and the missing one's id (data.id).
    assertNotFound(await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_1' }), 'function_instance', 'stripe_process_refund');
    assertNotFound(await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/disable`, {}), 'function_instance', 'stripe_process_refund');
    assertNotFound(await c.post(`${B}/provider/stripe-main/function/google_mail_send_email/enable`, {}), 'function_controller', 'google_mail_send_email');
    const enabled = await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/enable`, {});
    assert.equal(enabled.status, 201, enabled.text);
    assert.equal(enabled.body.controller.type_id, 'stripe_process_refund');
    assert.equal((await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/enable`, {})).status, 409);
    assert.equal((await c.post(`${B}/provider/stripe-main/function/google_mail_send_email/enable`, {})).status, 404);
    assert.equal((await c.post(`${B}/provider/nope/function/stripe_process_refund/enable`, {})).status, 404);

    const ok = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_123', amount: 500 });
    assert.equal(ok.status, 200, ok.text);
    assert.deepEqual(ok.body, { type: 'success', id: 're_1', object: 'refund', amount: 500, status: 'succeeded', payment_intent: 'pi_123' });
    const sent = lastSeen('/v1/refunds');
    assert.equal(sent.headers['content-type'], 'application/x-www-form-urlencoded');
    assert.equal(sent.headers.authorization, `Bearer ${STRIPE_KEY}`);
    assert.equal(sent.body, 'payment_intent=pi_123&amount=500');
    assert.equal(sent.headers['idempotency-key'], undefined, 'none unless the client gives one');
    // A client's idempotency key travels as Stripe's Idempotency-Key header, so a retry after a 502
    // or a hang-up does not refund twice; a key that cannot be a header value is refused, calling nothing.
    const keyed = await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_123' }, idempotency_key: 'order 42 refund' });
    assert.equal(keyed.status, 200, keyed.text);
    assert.equal(lastSeen('/v1/refunds').headers['idempotency-key'], 'order 42 refund');
    const before = providers.seen.length;
    for (const key of ['', ' lead', 'trail ', 'x'.repeat(256), 'tab\there', 'caf\u00e9', 42]) {
      const r = await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_123' }, idempotency_key: key });
      assert.equal(r.status, 400, `${JSON.stringify(key)}: ${r.text}`);
      assert.equal(r.body.data.errors[0].path, 'body.idempotency_key', JSON.stringify(key));
    }
    assert.equal(providers.seen.length, before, 'no call made');

    const refused = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_refused' });
    assert.equal(refused.status, 200);
    assert.deepEqual(refused.body, { type: 'error', message: "No such payment_intent: 'pi_refused'" });
    const boom = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_boom' });
    assert.equal(boom.status, 502, boom.text);
    assert.equal(boom.body.data.code, 'bad_gateway');
    // A success is one (the refund went through; a 502 would say it failed, and a retry with its key
    // would get the same): a member Stripe declares nullable may be null, one that does not fit the
    // function's output is left out.
    const nulls = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_null' });
    assert.equal(nulls.status, 200, nulls.text);
    assert.deepEqual(nulls.body, { type: 'success', id: 're_null', object: 'refund', amount: 1000, status: null, payment_intent: null, charge: null, reason: null, balance_transaction: null, metadata: null });
    const odd = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_odd' });
    assert.equal(odd.status, 200, odd.text);
    assert.deepEqual(odd.body, { type: 'success', id: 're_odd', amount: 1000, status: 'succeeded' });
    // An answer nested past what can be sent on is the provider's fault, not a 500.
    const deep = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_deep' });
    assert.equal(deep.status, 502, deep.text);
    assert.equal(deep.body.message, 'stripe: answered JSON that nests deeper than 64 levels');

    const calls = providers.seen.length;
    for (const params of [{}, { amount: 'ten' }, { payment_intent: 'pi_1', amount: 0 }, { payment_intent: 'pi_1', surprise: true }, { payment_intent: 'pi_1', charge: 'ch_1' }]) {
      const r = await invoke('stripe-main', 'stripe_process_refund', params);
      assert.equal(r.status, 400, `${JSON.stringify(params)}: ${r.text}`);
      assert.match(r.body.message, /body\.params/);
    }
    assert.equal((await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/invoke`, {})).status, 400, 'params is required');
    assert.equal(providers.seen.length, calls, 'refused invocations never reach the provider');

    assert.equal((await c.patch(`${B}/provider/stripe-main`, { status: 'disabled', display_name: 'Stripe (paused)' })).body.status, 'disabled');
    const disabled = await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_1' });
    assert.equal(disabled.status, 409);
    assert.match(disabled.body.message, /is disabled, not active/);
    assert.equal((await c.patch(`${B}/provider/stripe-main`, { status: 'active' })).body.status, 'active');
    assert.equal((await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_1' })).body.type, 'success');
    assert.equal((await c.patch(`${B}/provider/stripe-main`, { status: 'refresh_failed' })).status, 400);

    assert.equal((await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/disable`, {})).status, 200);
    assert.equal((await invoke('stripe-main', 'stripe_process_refund', { payment_intent: 'pi_1' })).status, 404);
    assert.equal((await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/disable`, {})).status, 404);
  });

  it('answers 502, never success, when a provider answer is cut off', async () => {
    await stripeInstance('stripe-cut');
    await c.post(`${B}/provider/stripe-cut/function/stripe_process_refund/enable`, {});
    const r = await invoke('stripe-cut', 'stripe_process_refund', { payment_intent: 'pi_cut' });
    assert.equal(r.status, 502, r.text);
    assert.match(r.body.message, /stripe: answer cut off/);
    // An upstream failing is not a fault of ours (and a client can cause it): warn, without a stack.
    const line = (await requestLogsThrough(stack, r, { all: true })).filter((l) => l.includes(`"req_id":"${r.headers.get('x-request-id')}"`));
    assert.ok(line.some((l) => l.includes('"level":40') && l.includes('request failed: bad_gateway') && l.includes('answer cut off')), line.join('\n'));
    assert.ok(!line.some((l) => l.includes('"level":50')), line.join('\n'));
    const neither = await invoke('stripe-cut', 'stripe_process_refund', { reason: 'duplicate', amount: 5 });
    assert.equal(neither.status, 400, 'a refund names a payment intent or a charge');
  });

  it('refuses credentials and instances that later steps could not use', async () => {
    const user = (value: Record<string, unknown>) => c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`, { value });
    assert.equal((await user({ access_token: 'has space', expiry_time: '2030-01-01T00:00:00Z' })).status, 400, 'tokens go into a header');
    assert.equal((await user({ access_token: 'a', expiry_time: '0000-01-01T00:00:00Z' })).status, 400);
    const offset = await user({ access_token: 'a', expiry_time: '2030-01-01T10:00:00+01:00' });
    assert.equal(offset.status, 201, offset.text);
    assert.equal(offset.body.value.expiry_time, '2030-01-01T09:00:00.000Z');
    assert.equal(offset.body.next_rotation_time, '2030-01-01T08:55:00.000Z');

    const rs = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`,
      { value: { client_id: 'client-2', client_secret: 'x', redirect_uri: 'https://app.example/cb' } });
    const wrongKind = await c.post(avail('google_mail', 'oauth_auth_flow'), { display_name: 'swapped', resource_server_credential_id: offset.body.id });
    assert.equal(wrongKind.status, 400, wrongKind.text);
    assert.match(wrongKind.body.message, /is a user credential/);
    const reserved = await c.post(avail('google_mail', 'oauth_auth_flow'), { provider_instance_id: 'grouped-by-function', display_name: 'x', resource_server_credential_id: rs.body.id });
    assert.equal(reserved.status, 400);
  });

  it('reads an instance whose id is grouped-by-function in another letter case as that instance, not as the grouped list', async () => {
    const { inst } = await stripeInstance('Grouped-By-Function');
    const got = await c.get(`${B}/provider/Grouped-By-Function`);
    assert.equal(got.status, 200, got.text);
    assert.deepEqual([got.body.id, got.body.display_name, got.body.created_at], [inst.id, inst.display_name, inst.created_at]);
    assert.ok(Array.isArray((await c.get(`${B}/provider/grouped-by-function`)).body.items));
    assert.equal((await c.delete(`${B}/provider/Grouped-By-Function`)).status, 200);
  });

  it('keeps a DEK alias that credentials use from being deleted', async () => {
    const dek = await c.post('/api/encryption/v1/envelope/default-envelope.key/dek', {});
    assert.equal(dek.status, 201, dek.text);
    assert.equal((await c.post('/api/encryption/v1/dek/alias', { dek_id: dek.body.id, alias: 'bridge-only' })).status, 201);
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, dek_alias: 'bridge-only' });
    assert.equal(cred.status, 201, cred.text);
    assert.equal(cred.body.dek_alias, 'bridge-only');
    const del = await c.delete('/api/encryption/v1/dek/alias/bridge-only');
    assert.equal(del.status, 409, del.text);
    assert.match(del.body.message, /bridge credentials/);
  });

  it('refuses provider instances with missing, unknown or foreign credentials and duplicate ids', async () => {
    const { cred } = await stripeInstance('stripe-dup');
    const cases: [string, unknown, number][] = [
      [avail('stripe', 'api_key'), { provider_instance_id: 'stripe-dup', display_name: 'again', resource_server_credential_id: cred.id }, 409],
      [avail('stripe', 'api_key'), { display_name: 'no credential' }, 400],
      [avail('stripe', 'api_key'), { display_name: 'unknown', resource_server_credential_id: randomUUID() }, 404],
      [avail('stripe', 'api_key'), { display_name: 'user cred', resource_server_credential_id: cred.id, user_credential_id: randomUUID() }, 400],
      [avail('google_mail', 'oauth2_jwt_bearer_assertion_flow'), { display_name: 'foreign', resource_server_credential_id: cred.id }, 400],
      [avail('stripe', 'api_key'), { provider_instance_id: 'bad id!', display_name: 'x', resource_server_credential_id: cred.id }, 400],
    ];
    const before = await testDb()('provider_instances').count({ n: '*' });
    for (const [url, body, status] of cases) {
      const r = await c.post(url, body);
      assert.equal(r.status, status, `${JSON.stringify(body)}: ${r.text}`);
    }
    // An unknown credential is named by its kind, as a fixed snake_case data.resource.
    const missingRs = randomUUID();
    const noRs = await c.post(avail('stripe', 'api_key'), { display_name: 'unknown', resource_server_credential_id: missingRs });
    assertNotFound(noRs, 'resource_server_credential', missingRs);
    assert.equal(noRs.body.message, `resource server credential '${missingRs}' not found`);
    const rs = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`,
      { value: { client_id: 'client-3', client_secret: 'x', redirect_uri: 'https://app.example/cb' } });
    assert.equal(rs.status, 201, rs.text);
    const missingUser = randomUUID();
    const noUser = await c.post(avail('google_mail', 'oauth_auth_flow'), { display_name: 'unknown user', resource_server_credential_id: rs.body.id, user_credential_id: missingUser });
    assertNotFound(noUser, 'user_credential', missingUser);
    assert.equal(noUser.body.message, `user credential '${missingUser}' not found`);
    assert.deepEqual(await testDb()('provider_instances').count({ n: '*' }), before);
  });

  it('names only the rule an empty display_name breaks, on create and on PATCH', async () => {
    const { cred } = await stripeInstance('stripe-empty-name');
    const created = await c.post(avail('stripe', 'api_key'), { display_name: '', resource_server_credential_id: cred.id });
    const patched = await c.patch(`${B}/provider/stripe-empty-name`, { display_name: '' });
    for (const r of [created, patched]) {
      assertError(r, 400, 'invalid_request');
      assert.deepEqual(r.body.data.errors, [{ path: 'body.display_name', message: 'must NOT have fewer than 1 characters' }], r.text);
    }
  });

  // A client polling updated_at for changes must not see one where nothing changed.
  it('PATCH that changes nothing ({}, or members set to what they are) answers the instance as it was, updated_at kept', async () => {
    await stripeInstance('stripe-unchanged');
    const url = `${B}/provider/stripe-unchanged`;
    const fields = (body: Record<string, unknown>) => Object.fromEntries(Object.entries(body).filter(([k]) => !['controller', 'credential_controller', 'functions', 'resource_server_credential', 'user_credential'].includes(k)));
    const read = async () => fields((await c.get(url)).body) as { updated_at: string };
    const unchanged = async (patch: object) => {
      const before = await read();
      await sleep(20);
      const r = await c.patch(url, patch);
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.body, before, `PATCH ${JSON.stringify(patch)}`);
      assert.deepEqual(await read(), before, `PATCH ${JSON.stringify(patch)}`);
    };
    await unchanged({});
    await unchanged({ display_name: 'Stripe' });
    await unchanged({ status: 'active' });
    await unchanged({ display_name: 'Stripe', status: 'active' });
    const before = await read();
    await sleep(20);
    const disabled = await c.patch(url, { status: 'disabled' });
    assert.equal(disabled.body.status, 'disabled');
    assert.ok(disabled.body.updated_at > before.updated_at, 'a change moves updated_at');
    await unchanged({ status: 'disabled' });
    await unchanged({});
    await sleep(20);
    const renamed = await c.patch(url, { display_name: 'Stripe (paused)', status: 'disabled' });
    assert.equal(renamed.body.display_name, 'Stripe (paused)');
    assert.ok(renamed.body.updated_at > disabled.body.updated_at, 'a change moves updated_at');
  });

  it('instances share a user credential only with the same resource server credential (its refresh uses that client): else 409, nothing created', async () => {
    const gmail = avail('google_mail', 'oauth_auth_flow');
    const client = (id: string) => c.post(`${gmail}/credential/resource-server`, { value: { client_id: id, client_secret: 's', redirect_uri: 'https://app.example/cb' } });
    const [rs1, rs2] = [await client('client-a'), await client('client-b')];
    const user = await c.post(`${gmail}/credential/user-credential`, { value: { access_token: 'at', refresh_token: 'rt', expiry_time: '2099-01-01T00:00:00Z' } });
    assert.equal((await c.post(gmail, { provider_instance_id: 'share-1', display_name: 'A', resource_server_credential_id: rs1.body.id, user_credential_id: user.body.id })).status, 201);
    const other = await c.post(gmail, { provider_instance_id: 'share-2', display_name: 'B', resource_server_credential_id: rs2.body.id, user_credential_id: user.body.id });
    assert.equal(other.status, 409, other.text);
    assert.match(other.body.message, new RegExp(`used by provider instance 'share-1' with resource server credential '${rs1.body.id}'`));
    assert.equal((await c.get(`${B}/provider/share-2`)).status, 404);
    const same = await c.post(gmail, { provider_instance_id: 'share-3', display_name: 'C', resource_server_credential_id: rs1.body.id, user_credential_id: user.body.id });
    assert.equal(same.status, 201, same.text);
    assert.equal(same.body.status, 'active');
  });

  it('google_mail: an OAuth instance waits for its user credential, then sends with the access token', async () => {
    const rs = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`,
      { value: { client_id: 'client-1', client_secret: CLIENT_SECRET, redirect_uri: 'https://app.example/cb', scopes: ['gmail.send'] } });
    assert.equal(rs.status, 201, rs.text);
    assert.ok(!rs.text.includes(CLIENT_SECRET));
    const pending = await c.post(avail('google_mail', 'oauth_auth_flow'), { provider_instance_id: 'gmail-pending', display_name: 'Gmail', resource_server_credential_id: rs.body.id });
    assert.equal(pending.body.status, 'brokering_initiated');
    await c.post(`${B}/provider/gmail-pending/function/google_mail_send_email/enable`, {});
    const params = { to: 'a@example.com', subject: 'Hello', body: 'Hi there' };
    const pendingInvoke = await invoke('gmail-pending', 'google_mail_send_email', params);
    assert.equal(pendingInvoke.status, 409);
    assert.equal(pendingInvoke.body.message, "Provider instance 'gmail-pending' is brokering_initiated, not active: broker its user credential first");
    assert.equal((await c.patch(`${B}/provider/gmail-pending`, { status: 'active' })).status, 409);

    const expiry = new Date(Date.now() + 3600_000).toISOString();
    const user = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`,
      { value: { access_token: ACCESS_TOKEN, refresh_token: 'rt-1', expiry_time: expiry, sub: 'a@example.com' } });
    assert.equal(user.status, 201, user.text);
    assert.ok(!user.text.includes(ACCESS_TOKEN));
    assert.equal(user.body.next_rotation_time, new Date(Date.parse(expiry) - 5 * 60_000).toISOString());
    const inst = await c.post(avail('google_mail', 'oauth_auth_flow'),
      { provider_instance_id: 'gmail-user', display_name: 'Gmail', resource_server_credential_id: rs.body.id, user_credential_id: user.body.id });
    assert.equal(inst.body.status, 'active');
    await c.post(`${B}/provider/gmail-user/function/google_mail_send_email/enable`, {});
    const sent = await invoke('gmail-user', 'google_mail_send_email', params);
    assert.equal(sent.status, 200, sent.text);
    assert.equal(sent.body.type, 'success');
    assert.match(sent.body.message_id, /^msg-\d+$/);
    const call = lastSeen('/gmail/v1/users/me/messages/send');
    assert.equal(call.headers.authorization, `Bearer ${ACCESS_TOKEN}`);
    const raw = Buffer.from(JSON.parse(call.body).raw, 'base64url').toString();
    assert.match(raw, /^To: a@example\.com\r\nSubject: Hello\r\n/);
    assert.match(raw, /\r\n\r\nHi there$/);

    const injected = await invoke('gmail-user', 'google_mail_send_email', { ...params, subject: 'Hi\r\nBcc: x@evil.example' });
    assert.equal(injected.status, 400, 'no header injection through the subject');
  });

  it('google_mail with a service account: signs a JWT, exchanges it at token_uri and sends with that token', async () => {
    const rs = await c.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
      { value: { client_id: 'svc@example.iam', private_key: privateKey, token_uri: `${providers.url}/token`, scopes: ['gmail.send'] } });
    assert.equal(rs.status, 201, rs.text);
    assert.ok(!rs.text.includes('PRIVATE KEY'));
    const inst = await c.post(avail('google_mail', 'oauth2_jwt_bearer_assertion_flow'), { provider_instance_id: 'gmail-svc', display_name: 'Gmail svc', resource_server_credential_id: rs.body.id });
    assert.equal(inst.body.status, 'active');
    await c.post(`${B}/provider/gmail-svc/function/google_mail_send_email/enable`, {});
    const sent = await invoke('gmail-svc', 'google_mail_send_email', { to: 'b@example.com', subject: 'S', body: 'B' });
    assert.equal(sent.status, 200, sent.text);
    assert.equal(sent.body.type, 'success');
    const token = lastSeen('/token');
    const claims = JSON.parse(Buffer.from(new URLSearchParams(token.body).get('assertion')!.split('.')[1], 'base64url').toString());
    assert.equal(claims.iss, 'svc@example.iam');
    assert.equal(claims.aud, `${providers.url}/token`);
    assert.equal(claims.scope, 'gmail.send');
    assert.equal(lastSeen('/gmail/v1/users/me/messages/send').headers.authorization, 'Bearer jwt-access');
  });

  it('lists instances (filters, pages, details), functions and the grouping by function, never with raw secrets', async () => {
    const all = await c.get(`${B}/provider?page_size=1000`);
    assert.equal(all.status, 200, all.text);
    const ids = all.body.items.map((i: any) => i.id);
    assert.ok(ids.includes('stripe-main') && ids.includes('gmail-user'));
    const gmail = all.body.items.find((i: any) => i.id === 'gmail-user');
    assert.equal(gmail.controller.type_id, 'google_mail');
    assert.equal(gmail.credential_controller.type_id, 'oauth_auth_flow');
    assert.deepEqual(gmail.functions.map((f: any) => f.function_controller_type_id), ['google_mail_send_email']);
    assert.equal(gmail.user_credential.id, gmail.user_credential_id);

    const stripeOnly = await c.get(`${B}/provider?provider_controller_type_id=stripe&status=active`);
    assert.ok(stripeOnly.body.items.length >= 2 && stripeOnly.body.items.every((i: any) => i.provider_controller_type_id === 'stripe' && i.status === 'active'));
    assert.deepEqual((await c.get(`${B}/provider?status=brokering_initiated`)).body.items.map((i: any) => i.id), ['gmail-pending']);
    assert.equal((await c.get(`${B}/provider?status=sleeping`)).status, 400);

    const seen: string[] = [];
    let token: string | undefined;
    do {
      const page = await c.get(`${B}/provider?page_size=2${token ? `&next_page_token=${token}` : ''}`);
      assert.ok(page.body.items.length <= 2);
      seen.push(...page.body.items.map((i: any) => i.id));
      token = page.body.next_page_token;
    } while (token);
    assert.deepEqual(seen, ids, 'pages in order, nothing twice, nothing skipped');
    assert.equal((await c.get(`${B}/provider?next_page_token=garbage`)).status, 400);

    const fns = await c.get(`${B}/function-instances?provider_instance_id=gmail-user`);
    assert.deepEqual(fns.body.items.map((f: any) => [f.provider_instance_id, f.function_controller_type_id]), [['gmail-user', 'google_mail_send_email']]);

    const grouped = await c.get(`${B}/provider/grouped-by-function?function_category=email`);
    assert.equal(grouped.status, 200, grouped.text);
    assert.deepEqual(grouped.body.items.map((g: any) => g.function_controller.type_id), ['google_mail_send_email']);
    assert.deepEqual(grouped.body.items[0].provider_instances.map((p: any) => p.provider_instance.id).sort(), ['gmail-pending', 'gmail-svc', 'gmail-user']);
    const paged = await c.get(`${B}/provider/grouped-by-function?page_size=1`);
    assert.equal(paged.body.items.length, 1);
    const rest = await c.get(`${B}/provider/grouped-by-function?page_size=1&next_page_token=${paged.body.next_page_token}`);
    assert.notEqual(rest.body.items[0].function_controller.type_id, paged.body.items[0].function_controller.type_id);
    assert.equal(rest.body.next_page_token, undefined);
    // The token belongs to this list and its filters: not the catalog, not another category.
    for (const other of ['available-providers?page_size=1', 'provider/grouped-by-function?page_size=1&function_category=email']) {
      assertError(await c.get(`${B}/${other}&next_page_token=${paged.body.next_page_token}`), 400, 'invalid_request');
    }

    const doc = (await c.get(`${B}/function-instances/openapi.json`)).body;
    const validator = new Validator();
    const valid = await validator.validate(structuredClone(doc));
    assert.ok(valid.valid, JSON.stringify(valid.errors)?.slice(0, 2000));
    const gmailOp = doc.paths['/api/bridge/v1/provider/gmail-user/function/google_mail_send_email/invoke'].post;
    assert.deepEqual(gmailOp.requestBody.content['application/json'].schema.properties.params.required.sort(), ['body', 'subject', 'to']);
    // What the endpoint takes, a retry's idempotency_key too, and not what it refuses.
    const takes = new Ajv({ strict: false }).compile(gmailOp.requestBody.content['application/json'].schema);
    const sent = { params: { to: 'a@example.com', subject: 's', body: 'b' }, idempotency_key: 'retry-1' };
    assert.ok(takes(sent), JSON.stringify(takes.errors));
    assert.ok(!takes({ ...sent, idempotency_key: '' }) && !takes({ ...sent, surprise: 1 }));
    assert.ok(!Object.keys(doc.paths).some((p) => p.includes('/stripe-main/')), 'the disabled stripe function has no operation');

    const one = await c.get(`${B}/provider/gmail-user`);
    assert.equal(one.status, 200);
    assert.equal(one.body.resource_server_credential.value.client_id, 'client-1');
    assert.equal((await c.get(`${B}/provider/nope`)).status, 404);

    for (const text of [all.text, grouped.text, one.text, stack.api.logs.join('\n'), ...stack.workers.map((w) => w.logs.join('\n'))]) {
      for (const secret of [STRIPE_KEY, ACCESS_TOKEN, CLIENT_SECRET, 'rt-1', 'jwt-access', 'BEGIN PRIVATE KEY']) assert.ok(!text.includes(secret), `${secret} leaked`);
    }
  });

  it('leaves out of openapi.json the instances whose provider or function the catalog no longer has, with one warning naming them', async () => {
    // A release that removed a function, and one that removed a provider: the rows stay (function_controller_type_id and provider_controller_type_id are free text).
    const db = testDb();
    await db('function_instances').insert({ provider_instance_id: 'gmail-user', function_controller_type_id: 'google_mail_retired_archive', provider_controller_type_id: 'google_mail' });
    await db('provider_instances').insert({ id: 'legacy-crm', display_name: 'CRM', provider_controller_type_id: 'retired_crm', credential_controller_type_id: 'api_key', status: 'active' });
    await db('function_instances').insert({ provider_instance_id: 'legacy-crm', function_controller_type_id: 'retired_crm_sync', provider_controller_type_id: 'retired_crm' });
    try {
      const res = await c.get(`${B}/function-instances/openapi.json`);
      assert.equal(res.status, 200, res.text.slice(0, 300));
      const valid = await new Validator().validate(structuredClone(res.body));
      assert.ok(valid.valid, JSON.stringify(valid.errors)?.slice(0, 2000));
      assert.ok(!/retired|legacy/i.test(res.text), 'neither is in the document');
      assert.ok(res.body.paths[`${B}/provider/gmail-user/function/google_mail_send_email/invoke`], 'the others are');
      // Logged as the document ends, after the request line (written once the answer began).
      const id = res.headers.get('x-request-id');
      const warning = JSON.parse(await waitFor(async () => stack.api.logs.find((l) => l.includes(`"req_id":"${id}"`) && l.includes('left out')), 'the warning'));
      assert.equal(stack.api.logs.filter((l) => l.includes('left out')).length, 1, 'one warning');
      assert.equal(warning.level, 40);
      assert.equal(warning.left_out, 2);
      assert.deepEqual(warning.first, [
        { provider_instance_id: 'gmail-user', provider_controller_type_id: 'google_mail', function_controller_type_id: 'google_mail_retired_archive' },
        { provider_instance_id: 'legacy-crm', provider_controller_type_id: 'retired_crm', function_controller_type_id: 'retired_crm_sync' },
      ]);
    } finally {
      await db('provider_instances').where({ id: 'legacy-crm' }).delete();
      await db('function_instances').where({ function_controller_type_id: 'google_mail_retired_archive' }).delete();
    }
  });

  it('an agent module invokes a bridge function through ctx.invokeFunction', async () => {
    await stripeInstance('stripe-agent');
    await c.post(`${B}/provider/stripe-agent/function/stripe_process_refund/enable`, {});
    const send = (call: unknown) => c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'message/send',
      params: { message: { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text: JSON.stringify(call) }] } } });
    const done = (await send({ provider_instance_id: 'stripe-agent', function_type_id: 'stripe_process_refund', params: { charge: 'ch_9', amount: 250 } })).body.result;
    assert.equal(done.status.state, 'completed');
    assert.deepEqual(done.status.message.parts, [{ kind: 'data', data: { result: { type: 'success', id: 're_1', object: 'refund', amount: 250, status: 'succeeded', payment_intent: null } } }]);
    assert.equal(lastSeen('/v1/refunds').body, 'charge=ch_9&amount=250');
    const asked = await testDb()('messages').where({ task_id: done.id, role: 'user' }).first();
    assert.equal(lastSeen('/v1/refunds').headers['idempotency-key'], `taskbridge-run:${done.id}:${asked.id}:1`, "the run's first call's key when the agent gives none");
    // A key of the agent's (one a retried run sends again) goes to Stripe; one that could not is refused.
    const keyed = (await send({ provider_instance_id: 'stripe-agent', function_type_id: 'stripe_process_refund', params: { charge: 'ch_9' }, options: { idempotencyKey: 'task-1:refund' } })).body.result;
    assert.equal(keyed.status.state, 'completed');
    assert.equal(lastSeen('/v1/refunds').headers['idempotency-key'], 'task-1:refund');
    const calls = providers.seen.length;
    const badKey = (await send({ provider_instance_id: 'stripe-agent', function_type_id: 'stripe_process_refund', params: { charge: 'ch_9' }, options: { idempotencyKey: 'x'.repeat(256) } })).body.result;
    assert.equal(badKey.status.state, 'failed');
    assert.match(badKey.status.message.parts[0].text, /^invoke refused: .*options\.idempotencyKey/);
    assert.equal(providers.seen.length, calls, 'no call made');

    const refused = (await send({ provider_instance_id: 'stripe-agent', function_type_id: 'stripe_process_refund', params: { amount: -1 } })).body.result;
    assert.equal(refused.status.state, 'failed');
    assert.equal(refused.status.message.parts[0].text, 'invoke refused: Invalid params: params must have exactly one of payment_intent or charge');
  });

  it("an agent run tried again sends its bridge calls with the first try's keys: Stripe answers them with the first refunds, made once", async () => {
    // stripe-agent: enabled by the test above. Before, an agent's calls carried no key unless it gave
    // one, and the run tried again refunded again (4 refunds made for 2).
    const refunds = providers.made.refunds;
    const seen = providers.seen.length;
    const sent = await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'message/send', params: { message: { kind: 'message', messageId: randomUUID(), role: 'user',
      parts: [{ kind: 'text', text: JSON.stringify({ provider_instance_id: 'stripe-agent', function_type_id: 'stripe_process_refund', params: { charge: 'ch_twice' }, calls: 2, retry: true }) }] } } });
    const task = sent.body.result;
    assert.equal(task.status.state, 'completed', sent.text);
    assert.equal(providers.made.refunds, refunds + 2, 'each call refunded once');
    const asked = await testDb()('messages').where({ task_id: task.id, role: 'user' }).first();
    const keys = providers.seen.slice(seen).filter((s) => s.url === '/v1/refunds').map((s) => s.headers['idempotency-key']);
    // Numbered by the call's place in the run, the same on each try.
    const key = (n: number) => `taskbridge-run:${task.id}:${asked.id}:${n}`;
    assert.deepEqual(keys, [key(1), key(2), key(1), key(2)]);
    const tried = (await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id: task.id } })).body.result;
    const firstTry = tried.history.find((m: any) => m.role === 'agent').parts[0].data;
    assert.equal(firstTry.results.length, 2);
    assert.deepEqual(task.status.message.parts[0].data, firstTry, 'the second try got the first refunds');
  });

  it('deletes an instance with its function instances and the credentials only it used', async () => {
    const { cred } = await stripeInstance('stripe-gone');
    await c.post(`${B}/provider/stripe-gone/function/stripe_process_refund/enable`, {});
    const shared = await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'stripe-shares', display_name: 'shares', resource_server_credential_id: cred.id });
    assert.equal(shared.status, 201);
    assert.equal((await c.delete(`${B}/provider/stripe-gone`)).status, 200);
    assert.equal((await c.get(`${B}/provider/stripe-gone`)).status, 404);
    assert.equal((await c.delete(`${B}/provider/stripe-gone`)).status, 404);
    assert.equal((await testDb()('function_instances').where({ provider_instance_id: 'stripe-gone' })).length, 0);
    assert.ok(await testDb()('bridge_credentials').where({ id: cred.id }).first(), 'still used by stripe-shares');
    assert.equal((await c.delete(`${B}/provider/stripe-shares`)).status, 200);
    assert.equal(await testDb()('bridge_credentials').where({ id: cred.id }).first(), undefined);
  });

  it('deletes an instance while others are created with its credential at the same moment: the delete goes through and the credential stays', async () => {
    for (let trial = 0; trial < 10; trial++) {
      const { cred } = await stripeInstance(`stripe-racing-${trial}`);
      const [deleted, ...created] = await Promise.all([
        c.delete(`${B}/provider/stripe-racing-${trial}`),
        ...Array.from({ length: 5 }, (_, i) => c.post(avail('stripe', 'api_key'), {
          provider_instance_id: `stripe-racing-${trial}-${i}`, display_name: 'racing', resource_server_credential_id: cred.id,
        })),
      ]);
      assert.equal(deleted.status, 200, `trial ${trial}: ${deleted.text}`);
      const made = created.filter((r) => r.status === 201).length;
      for (const r of created) assert.ok([201, 404].includes(r.status), r.text);
      // An instance that was created uses the credential, which is then still there; one refused found it gone.
      const kept = await testDb()('bridge_credentials').where({ id: cred.id }).first();
      assert.equal(!!kept, made > 0, `trial ${trial}: ${made} created`);
    }
  });

  it('lists credentials newest first with the instances that use them, in pages, filtered by use and provider, never with raw secrets', async () => {
    const { cred: used } = await stripeInstance('cred-list-a');
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'cred-list-b', display_name: 'b', resource_server_credential_id: used.id })).status, 201);
    const store = async (url: string, value: unknown) => {
      const r = await c.post(url, { value });
      assert.equal(r.status, 201, r.text);
      return r.body;
    };
    const idle = await store(`${avail('stripe', 'api_key')}/credential/resource-server`, { api_key: STRIPE_KEY });
    const rs = await store(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, { client_id: 'client-list', client_secret: CLIENT_SECRET, redirect_uri: 'https://app.example/cb' });
    const user = await store(`${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential`,
      { access_token: ACCESS_TOKEN, refresh_token: 'rt-1', expiry_time: new Date(Date.now() + 3600_000).toISOString() });
    const list = async (query: string) => {
      const items: any[] = [];
      let token: string | undefined;
      do {
        const r = await c.get(`${B}/credential?${query}${token ? `&next_page_token=${encodeURIComponent(token)}` : ''}`);
        assert.equal(r.status, 200, r.text);
        for (const secret of [STRIPE_KEY, CLIENT_SECRET, ACCESS_TOKEN, 'rt-1']) assert.ok(!r.text.includes(secret), `${secret} listed`);
        items.push(...r.body.items);
        token = r.body.next_page_token;
      } while (token);
      return items;
    };
    const all = await list('page_size=1000');
    const mine = [user, rs, idle, used].map((m) => all.find((i) => i.id === m.id));
    assert.deepEqual(all.map((i) => i.id).filter((id) => mine.some((m) => m.id === id)), [user.id, rs.id, idle.id, used.id], 'newest first');
    assert.deepEqual(all.map((i) => i.created_at), all.map((i) => i.created_at).sort().reverse());
    assert.deepEqual(mine.map((m) => [m.kind, m.provider_controller_type_id, m.type_id, m.provider_instance_ids, m.provider_instance_count]), [
      ['user', 'google_mail', 'oauth_auth_flow', [], 0], ['resource_server', 'google_mail', 'oauth_auth_flow', [], 0],
      ['resource_server', 'stripe', 'api_key', [], 0], ['resource_server', 'stripe', 'api_key', ['cred-list-a', 'cred-list-b'], 2]]);
    // The Credential shape the other answers use, secret members encrypted as they show them.
    const { kind: _k, provider_controller_type_id: _p, provider_instance_ids: _i, provider_instance_count: _n, ...shown } = mine[3];
    assert.deepEqual(shown, (await c.get(`${B}/provider/cred-list-a`)).body.resource_server_credential);
    // One looked up by id, as the list shows it.
    for (const m of mine) {
      const one = await c.get(`${B}/credential/${m.id}`);
      assert.equal(one.status, 200, one.text);
      assert.deepEqual(one.body, m);
      for (const secret of [STRIPE_KEY, CLIENT_SECRET, ACCESS_TOKEN, 'rt-1']) assert.ok(!one.text.includes(secret), `${secret} shown`);
    }
    const unknown = randomUUID();
    assertNotFound(await c.get(`${B}/credential/${unknown}`), 'credential', unknown);
    assertError(await c.get(`${B}/credential/not-a-uuid`), 400, 'invalid_request');

    const unused = await list('page_size=2&unused=true');
    assert.ok(unused.length > 3 && unused.every((i) => i.provider_instance_count === 0 && i.provider_instance_ids.length === 0));
    assert.deepEqual(unused.map((i) => i.id), all.filter((i) => i.provider_instance_count === 0).map((i) => i.id), 'paged whole, each once');
    const inUse = await list('page_size=1000&unused=false');
    assert.deepEqual(inUse.map((i) => i.id), all.filter((i) => i.provider_instance_count > 0).map((i) => i.id));
    const gmailUnused = await list('page_size=1000&unused=true&provider_controller_type_id=google_mail');
    assert.ok(gmailUnused.every((i) => i.provider_controller_type_id === 'google_mail'));
    assert.deepEqual(gmailUnused.slice(0, 2).map((i) => i.id), [user.id, rs.id]);

    const first = await c.get(`${B}/credential?page_size=1&unused=true`);
    assertError(await c.get(`${B}/credential?page_size=1&unused=false&next_page_token=${first.body.next_page_token}`), 400, 'invalid_request');
    assertError(await c.get(`${B}/credential?unused=yes`), 400, 'invalid_request');
    assertError(await c.get(`${B}/credential?kind=user`), 400, 'invalid_request');
  });

  it('deletes a credential no instance uses (its instance create refused: 409 id taken), which frees its DEK alias; 409 naming the instances that use one', async () => {
    const dek = await c.post('/api/encryption/v1/envelope/default-envelope.key/dek', {});
    assert.equal((await c.post('/api/encryption/v1/dek/alias', { dek_id: dek.body.id, alias: 'cred-unused' })).status, 201);
    const { cred: used } = await stripeInstance('cred-del-a');
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY }, dek_alias: 'cred-unused' });
    assert.equal(cred.status, 201, cred.text);
    const id = cred.body.id;
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'cred-del-a', display_name: 'dup', resource_server_credential_id: id })).status, 409);
    assert.deepEqual((await c.get(`${B}/credential?page_size=1&unused=true`)).body.items.map((i: any) => i.id), [id], 'found as unused');
    assert.equal((await c.delete('/api/encryption/v1/dek/alias/cred-unused')).status, 409, 'pinned while it is stored');

    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'cred-del-b', display_name: 'b', resource_server_credential_id: used.id })).status, 201);
    const refused = await c.delete(`${B}/credential/${used.id}`);
    assertError(refused, 409, 'conflict');
    assert.deepEqual(refused.body.data, { code: 'conflict', resource: 'credential', id: used.id, provider_instance_ids: ['cred-del-a', 'cred-del-b'], provider_instance_count: 2 });
    assert.match(refused.body.message, /provider instances 'cred-del-a', 'cred-del-b'/);
    assert.ok(await testDb()('bridge_credentials').where({ id: used.id }).first(), 'kept');

    const del = await c.delete(`${B}/credential/${id}`);
    assert.equal(del.status, 200, del.text);
    assert.deepEqual(del.body, { success: true });
    assert.equal(await testDb()('bridge_credentials').where({ id }).first(), undefined);
    assertNotFound(await c.delete(`${B}/credential/${id}`), 'credential', id);
    assertError(await c.delete(`${B}/credential/not-a-uuid`), 400, 'invalid_request');
    assertNotFound(await c.post(avail('stripe', 'api_key'), { display_name: 'late', resource_server_credential_id: id }), 'resource_server_credential', id);
    const alias = await c.delete('/api/encryption/v1/dek/alias/cred-unused');
    assert.equal(alias.status, 200, alias.text);
  });

  it('deletes a credential while instances are created with it at the same moment: the delete (then 404 for them) or the instances win, never both', async () => {
    for (let trial = 0; trial < 10; trial++) {
      const cred = (await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } })).body;
      // Sent before, among and after the creates, so that either wins.
      const creates = Array.from({ length: 5 }, (_, i) => () => c.post(avail('stripe', 'api_key'), {
        provider_instance_id: `cred-racing-${trial}-${i}`, display_name: 'racing', resource_server_credential_id: cred.id,
      }));
      const at = trial % 6;
      const created = await Promise.all([...creates.slice(0, at), () => c.delete(`${B}/credential/${cred.id}`), ...creates.slice(at)].map((send) => send()));
      const [deleted] = created.splice(at, 1);
      const made = created.filter((r) => r.status === 201).length;
      if (deleted.status === 200) for (const r of created) assertNotFound(r, 'resource_server_credential', cred.id);
      else {
        assertError(deleted, 409, 'conflict');
        assert.equal(made, 5, `trial ${trial}: ${created.map((r) => r.text).join(' ')}`);
      }
      assert.equal(!!await testDb()('bridge_credentials').where({ id: cred.id }).first(), made > 0, `trial ${trial}: ${made} created, delete ${deleted.status}`);
    }
  });

  it('answers 500 internal, sending nothing, when a stored credential does not decrypt (damage on our side, not a bad request)', async () => {
    const { cred } = await stripeInstance('stripe-damaged');
    await c.post(`${B}/provider/stripe-damaged/function/stripe_process_refund/enable`, {});
    const row = await testDb()('bridge_credentials').where({ id: cred.id }).first();
    await testDb()('bridge_credentials').where({ id: cred.id }).update({ value: { ...row.value, api_key: randomBytes(48).toString('base64') } });
    const sent = providers.seen.length;
    const r = await invoke('stripe-damaged', 'stripe_process_refund', { payment_intent: 'pi_damaged' });
    assert.equal(r.status, 500, r.text);
    assert.equal(r.body.data.code, 'internal');
    assert.match(r.body.message, new RegExp(`credential '${cred.id}' does not decrypt`));
    assert.equal(providers.seen.length, sent, 'nothing sent upstream');
  });

  it('answers 502 when a provider does not answer within BRIDGE_TIMEOUT_MS', async () => {
    await stripeInstance('stripe-slow');
    await c.post(`${B}/provider/stripe-slow/function/stripe_process_refund/enable`, {});
    // Through an API of its own with a timeout well short of pi_slow's 3 s.
    const api = await startApi({ ...stack.env, BRIDGE_TIMEOUT_MS: '1000' });
    try {
      const r = await new Client(api.url).post(`${B}/provider/stripe-slow/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_slow' } });
      answers.push(`POST stripe-slow invoke ${r.status}: ${r.text}`);
      assert.equal(r.status, 502, r.text);
      assert.match(r.body.message, /stripe: no answer within 1000 ms/);
    } finally {
      await api.stop();
    }
  });

  it('keeps a service-account invocation, token exchange and provider call together, to one BRIDGE_TIMEOUT_MS', async () => {
    const instance = async (id: string, tokenPath: string) => {
      const rs = await c.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc@example.iam', private_key: privateKey, token_uri: `${providers.url}${tokenPath}`, scopes: ['gmail.send'] } });
      assert.equal(rs.status, 201, rs.text);
      assert.equal((await c.post(avail('google_mail', 'oauth2_jwt_bearer_assertion_flow'), { provider_instance_id: id, display_name: id, resource_server_credential_id: rs.body.id })).status, 201);
      assert.equal((await c.post(`${B}/provider/${id}/function/google_mail_send_email/enable`, {})).status, 201);
    };
    await instance('gmail-token-hold', '/token/hold');
    await instance('gmail-token-slow', '/token/slow');
    const limitMs = 3000;
    const api = await startApi({ ...stack.env, BRIDGE_TIMEOUT_MS: String(limitMs) });
    const sends = () => providers.seen.filter((x) => x.url === '/gmail/v1/users/me/messages/send').length;
    try {
      const call = (id: string) => new Client(api.url).post(`${B}/provider/${id}/function/google_mail_send_email/invoke`, { params: { to: 'b@example.com', subject: 'S', body: 'B' } });
      const before = sends();
      const held = await call('gmail-token-hold');
      answers.push(`POST gmail-token-hold invoke ${held.status}: ${held.text}`);
      assert.equal(held.status, 502, held.text);
      assert.equal(held.body.message, `token endpoint: no answer within ${limitMs} ms`);
      assert.equal(sends(), before, 'no mail without a token');

      // The token comes SLOW_TOKEN_MS into the call and the mail is never answered: the call ends when
      // its limit does, not a whole limit after the token came (which it could not before SLOW_TOKEN_MS + limitMs).
      const started = Date.now();
      const slow = await call('gmail-token-slow');
      const tookMs = Date.now() - started;
      answers.push(`POST gmail-token-slow invoke ${slow.status}: ${slow.text}`);
      assert.equal(slow.status, 502, slow.text);
      assert.equal(slow.body.message, `google_mail: no answer within ${limitMs} ms`);
      assert.equal(sends(), before + 1, 'the mail was sent with the token');
      assert.ok(tookMs < SLOW_TOKEN_MS + limitMs, `answered after ${tookMs} ms`);
    } finally {
      await api.stop();
    }
  });

  it('answers 502 naming the token endpoint when it refuses the assertion, and sends nothing', async () => {
    const other = generateKeyPairSync('rsa', { modulusLength: 2048, privateKeyEncoding: { type: 'pkcs8', format: 'pem' }, publicKeyEncoding: { type: 'spki', format: 'pem' } });
    const rs = await c.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
      { value: { client_id: 'stranger@example.iam', private_key: other.privateKey, token_uri: `${providers.url}/token`, scopes: ['gmail.send'] } });
    assert.equal(rs.status, 201, rs.text);
    await c.post(avail('google_mail', 'oauth2_jwt_bearer_assertion_flow'), { provider_instance_id: 'gmail-stranger', display_name: 'Gmail stranger', resource_server_credential_id: rs.body.id });
    await c.post(`${B}/provider/gmail-stranger/function/google_mail_send_email/enable`, {});
    const sends = providers.seen.filter((x) => x.url === '/gmail/v1/users/me/messages/send').length;
    const r = await invoke('gmail-stranger', 'google_mail_send_email', { to: 'b@example.com', subject: 'S', body: 'B' });
    assert.equal(r.status, 502, r.text);
    assert.match(r.body.message, /token endpoint refused the assertion: bad assertion/);
    assert.ok(!r.text.includes('PRIVATE KEY') && !r.text.includes(lastSeen('/token').body), 'neither the key nor the assertion is echoed');
    assert.equal(providers.seen.filter((x) => x.url === '/gmail/v1/users/me/messages/send').length, sends, 'no mail without a token');
  });

  it('answers 502 naming the token endpoint when it answers an access token that cannot be an Authorization header or a token_type other than bearer, and sends nothing', async () => {
    for (const [i, [clientId, { message }]] of Object.entries(UNUSABLE_TOKENS).entries()) {
      const rs = await c.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: clientId, private_key: privateKey, token_uri: `${providers.url}/token`, scopes: ['gmail.send'] } });
      assert.equal(rs.status, 201, rs.text);
      assert.equal((await c.post(avail('google_mail', 'oauth2_jwt_bearer_assertion_flow'), { provider_instance_id: `gmail-bad-token-${i}`, display_name: clientId, resource_server_credential_id: rs.body.id })).status, 201);
      assert.equal((await c.post(`${B}/provider/gmail-bad-token-${i}/function/google_mail_send_email/enable`, {})).status, 201);
      const tokens = providers.seen.filter((x) => x.url === '/token').length;
      const sends = providers.seen.filter((x) => x.url === '/gmail/v1/users/me/messages/send').length;
      const r = await invoke(`gmail-bad-token-${i}`, 'google_mail_send_email', { to: 'b@example.com', subject: 'S', body: 'B' });
      assert.equal(r.status, 502, r.text);
      assert.equal(r.body.message, message, clientId);
      assert.equal(providers.seen.filter((x) => x.url === '/token').length, tokens + 1, 'the token endpoint was asked');
      assert.equal(providers.seen.filter((x) => x.url === '/gmail/v1/users/me/messages/send').length, sends, 'no mail without a usable token');
    }
  });

  it("masks the credential a provider quotes in its refusal (API key, access token, JWT assertion), in the answer and the log", async () => {
    await stripeInstance('stripe-echo');
    await c.post(`${B}/provider/stripe-echo/function/stripe_process_refund/enable`, {});
    const stripe = await invoke('stripe-echo', 'stripe_process_refund', { payment_intent: 'pi_echo' });
    assert.deepEqual(stripe.body, { type: 'error', message: 'No such payment_intent for key *** (***)' });

    const mail = await invoke('gmail-user', 'google_mail_send_email', { to: 'a@example.com', subject: 'echo', body: 'B' });
    assert.deepEqual(mail.body, { type: 'error', message: 'Token *** may not send this' });

    const rs = await c.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
      { value: { client_id: 'echo@example.iam', private_key: privateKey, token_uri: `${providers.url}/token`, scopes: ['gmail.send'] } });
    await c.post(avail('google_mail', 'oauth2_jwt_bearer_assertion_flow'), { provider_instance_id: 'gmail-echo', display_name: 'Gmail echo', resource_server_credential_id: rs.body.id });
    await c.post(`${B}/provider/gmail-echo/function/google_mail_send_email/enable`, {});
    const jwt = await invoke('gmail-echo', 'google_mail_send_email', { to: 'b@example.com', subject: 'S', body: 'B' });
    assert.equal(jwt.status, 502, jwt.text);
    const assertion = new URLSearchParams(lastSeen('/token').body).get('assertion')!;
    // The refusal quotes the assertion (hundreds of characters) first: the 500 characters quoted end
    // inside it, so the rest of the provider's words are cut with it.
    assert.ok(assertion.length > 500 - 'Invalid JWT: '.length, `${assertion.length}`);
    assert.equal(jwt.body.message, 'token endpoint refused the assertion: Invalid JWT: ***');
    const logs = await requestLogsThrough(stack, jwt, { all: true });
    assert.ok(logs.some((l) => l.includes('token endpoint refused the assertion')), 'the 502 is logged');
    assert.ok(!logs.some((l) => l.includes(assertion.split('.')[2])), 'no log line holds the assertion');
  });

  it('no answer, success or error, and no log line of this file held a secret', async () => {
    assert.ok(answers.length > 100, `${answers.length} answers recorded`);
    assert.ok(answers.some((a) => / 502: /.test(a)) && answers.some((a) => / 400: /.test(a)), 'error answers are among them');
    const texts = [...answers, stack.api.logs.join('\n'), ...stack.workers.map((w) => w.logs.join('\n'))];
    for (const secret of [STRIPE_KEY, ACCESS_TOKEN, CLIENT_SECRET, 'rt-1', 'jwt-access', 'BEGIN PRIVATE KEY']) {
      const leak = texts.find((t) => t.includes(secret));
      assert.equal(leak, undefined, `${secret} leaked in: ${leak?.slice(0, 300)}`);
    }
  });
});

describe('GET /function-instances/openapi.json of more function instances than the API heap holds described', function () {
  this.timeout(120_000);
  const INSTANCES = 36_000;
  // Some 3.2 KB of text a path (114 MB in all) and 10 KB described: built whole, the document took more than this heap.
  const stack = useStack({ NODE_OPTIONS: '--max-old-space-size=96', RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
  const ids = Array.from({ length: INSTANCES }, (_, i) => `inst-${String(i + 1).padStart(5, '0')}`);

  before(async () => {
    const db = testDb();
    await db.raw(`insert into provider_instances (id, display_name, provider_controller_type_id, credential_controller_type_id, status)
                  select 'inst-' || lpad(i::text, 5, '0'), 'Instance ' || i, case when i % 2 = 0 then 'google_mail' else 'stripe' end,
                         case when i % 2 = 0 then 'oauth2_jwt_bearer_assertion_flow' else 'api_key' end, 'active' from generate_series(1, ?) i`, [INSTANCES]);
    await db.raw(`insert into function_instances (provider_instance_id, function_controller_type_id, provider_controller_type_id)
                  select id, case when provider_controller_type_id = 'stripe' then 'stripe_process_refund' else 'google_mail_send_email' end, provider_controller_type_id
                    from provider_instances`);
  });

  it('streams it whole: one path per instance, in instance order, as JSON.stringify writes the document', async () => {
    const res = await stack.client.get(`${B}/function-instances/openapi.json`);
    assert.equal(res.status, 200, res.text.slice(0, 300));
    assert.equal(res.headers.get('content-type'), 'application/json; charset=utf-8');
    assert.ok(res.text.length > 96 * 1024 * 1024, `${res.text.length} bytes`);
    const doc = res.body;
    // Written again from what it parses to, the text is the same: no path twice (the parse keeps one of a repeated key).
    assert.ok(JSON.stringify(doc) === res.text, 'the text is JSON.stringify of the document');
    assert.deepEqual(Object.keys(doc.paths), ids.map((id, i) => `${B}/provider/${id}/function/${i % 2 ? 'google_mail_send_email' : 'stripe_process_refund'}/invoke`));
    assert.equal(doc.paths[`${B}/provider/inst-36000/function/google_mail_send_email/invoke`].post.operationId, 'inst-36000.google_mail_send_email');
    assert.equal(doc.components.securitySchemes.bearer.scheme, 'bearer');
    assert.equal(stack.api.child.exitCode, null, 'the API is still running');
  });
});

describe('bridge API without BRIDGE_ALLOW_PRIVATE', () => {
  let api: Awaited<ReturnType<typeof startApi>>;
  before(async () => {
    await resetDb();
    api = await startApi(testEnv());
  });
  after(async () => api?.stop());

  it('refuses a service-account credential whose token_uri is private, loopback or link-local, storing nothing', async () => {
    const client = new Client(api.url);
    for (const tokenUri of ['http://127.0.0.1:9/token', 'http://10.1.2.3/token', 'http://169.254.169.254/latest/meta-data', 'http://[::1]/token', 'http://localhost/token']) {
      const r = await client.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc@example.iam', private_key: privateKey, token_uri: tokenUri, scopes: ['gmail.send'] } });
      assert.equal(r.status, 400, `${tokenUri}: ${r.text}`);
      assert.match(r.body.message, /token_uri host .* private, loopback or link-local .* BRIDGE_ALLOW_PRIVATE=true/);
      assert.ok(!r.text.includes('PRIVATE KEY'));
    }
    const { rows } = await testDb().raw('select count(*)::int as n from bridge_credentials');
    assert.equal(rows[0].n, 0);
  });

  it('refuses a service-account credential whose token_uri host does not exist or no resolver takes (400, not 503 "retry shortly"), storing nothing', async () => {
    const client = new Client(api.url);
    for (const [tokenUri, code] of [[`https://x.${'a'.repeat(300)}.com/token`, 'EINVAL'], ['https://no-such-host.invalid/token', 'ENOTFOUND']]) {
      const r = await client.post(`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/resource-server`,
        { value: { client_id: 'svc@example.iam', private_key: privateKey, token_uri: tokenUri, scopes: ['gmail.send'] } });
      assert.equal(r.status, 400, `${tokenUri}: ${r.text}`);
      assert.match(r.body.message, new RegExp(`^token_uri host '.*' cannot be resolved \\(${code}\\)$`));
    }
    const { rows } = await testDb().raw('select count(*)::int as n from bridge_credentials');
    assert.equal(rows[0].n, 0);
  });

  it('calls a token endpoint on public addresses only, checked again when connecting (a name checked public may resolve internal by then)', async () => {
    // The check at connect time, as a token call makes it: a name that now resolves to loopback.
    const hits: string[] = [];
    const server = http.createServer((req, res) => { hits.push(req.url ?? ''); res.end('{}'); });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://localhost:${(server.address() as AddressInfo).port}/token`;
      await assert.rejects(callUpstream('token endpoint', url, { method: 'POST' }, 5000, { publicOnly: true }),
        (err: Error & { status?: number }) => err.status === 502 && /token endpoint: host 'localhost' resolves to an internal address/.test(err.message));
      // An IP literal is never looked up (net.connect skips `lookup` for one), so it is checked before
      // the call: a token_uri stored while BRIDGE_ALLOW_PRIVATE was on, or restored from a backup.
      const port = (server.address() as AddressInfo).port;
      for (const [literal, host] of [[`127.0.0.1:${port}`, '127.0.0.1'], [`[::ffff:127.0.0.1]:${port}`, '::ffff:7f00:1'], ['169.254.169.254', '169.254.169.254']]) {
        await assert.rejects(callUpstream('token endpoint', `http://${literal}/token`, { method: 'POST' }, 5000, { publicOnly: true }),
          (err: Error & { status?: number }) => err.status === 502 && err.message === `token endpoint: host '${host}' is an internal address`);
      }
      assert.deepEqual(hits, [], 'nothing reached the internal server');
      assert.equal((await callUpstream('token endpoint', url, { method: 'POST' }, 5000)).status, 200, 'allowed when private addresses are');
      assert.equal((await callUpstream('token endpoint', `http://127.0.0.1:${port}/token`, { method: 'POST' }, 5000)).status, 200, 'an IP literal too');
      await assert.rejects(callUpstream('token endpoint', 'https://no-such-host.invalid/token', { method: 'POST' }, 5000, { publicOnly: true }),
        (err: Error & { status?: number }) => err.status === 502 && err.message === "token endpoint: host 'no-such-host.invalid' cannot be resolved (ENOTFOUND)");
    } finally {
      server.close();
    }
  });
});

import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { requestLogsThrough, resetDb, startWorker, testDb, waitFor, type Client, type Stack, assertNotFound } from './helpers/stack.ts';
import { consent, startOAuthStack, type OAuthServer, type OAuthStack } from './helpers/oauth-server.ts';
import type { FakeProviders } from './helpers/fake-providers.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const BROKER = `${avail('google_mail', 'oauth_auth_flow')}/credential/user-credential/broker`;
const CLIENT_SECRET = `cs-${randomUUID()}`;
const SCOPE = 'https://www.googleapis.com/auth/gmail.send';
const TIMEOUT_MS = 3000;


const jwtPayload = (bearer: string) => JSON.parse(Buffer.from(bearer.replace(/^Bearer /, '').split('.')[1], 'base64url').toString()) as Record<string, unknown>;

describe('OAuth brokering of user credentials against a real OAuth server process', () => {
  let stack: Stack;
  let c: Client;
  let oauth: OAuthServer;
  let gmail: FakeProviders;
  let all: OAuthStack;
  let callbackUrl: string;

  // `scopes: []` stores a resource server credential that names none.
  async function instance(id: string, opts: { secret?: string; returnUrl?: string; scopes?: string[] } = {}) {
    const scopes = opts.scopes ?? [SCOPE];
    const cred = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, {
      value: { client_id: 'taskbridge-test-client', client_secret: opts.secret ?? CLIENT_SECRET, redirect_uri: callbackUrl, ...(scopes.length ? { scopes } : {}) },
    });
    assert.equal(cred.status, 201, cred.text);
    const inst = await c.post(avail('google_mail', 'oauth_auth_flow'), {
      provider_instance_id: id, display_name: id, resource_server_credential_id: cred.body.id,
      ...(opts.returnUrl ? { return_on_successful_brokering: { type: 'url', url: opts.returnUrl } } : {}),
    });
    assert.equal(inst.status, 201, inst.text);
    assert.equal(inst.body.status, 'brokering_initiated');
    return inst.body;
  }
  const broker = async (id: string) => {
    const r = await c.post(BROKER, { provider_instance_id: id });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const callback = (url: string) => fetch(url, { redirect: 'manual' });
  const userCredentials = async () => Number((await testDb()('bridge_credentials').where({ kind: 'user' }).count({ n: '*' }))[0].n);
  // With the token endpoint answering each value of `mode` in turn, brokering `instanceId` is 502 with
  // `message` and stores nothing.
  const refusesTokenAnswers = async (instanceId: string, mode: 'expires-in' | 'token-type', values: string[], message: string) => {
    for (const value of values) {
      await oauth.inMode(`${mode}:${value}`, async () => {
        const stored = await userCredentials();
        const r = await callback(await consent((await broker(instanceId)).action.Redirect.url));
        assert.equal(r.status, 502, value);
        assert.equal(((await r.json()) as { message: string }).message, message);
        assert.equal(await userCredentials(), stored, `${value}: nothing stored`);
      });
    }
  };

  before(async () => {
    await resetDb();
    // A token endpoint that never answers costs a test this long.
    all = await startOAuthStack(CLIENT_SECRET, { BRIDGE_TIMEOUT_MS: String(TIMEOUT_MS) }, { workers: 0 });
    ({ stack, oauth, providers: gmail } = all);
    c = stack.client;
    callbackUrl = `${stack.api.url}${B}/generic-oauth-callback`;
  });
  after(async () => all?.stop());

  it('broker answers the BrokerState: the authorize URL with state (256 bits, kept only hashed) and PKCE S256', async () => {
    await instance('mail-a');
    const state = await broker('mail-a');
    assert.equal(state.type, 'broker_state');
    assert.deepEqual([state.provider_instance_id, state.provider_controller_type_id, state.credential_controller_type_id], ['mail-a', 'google_mail', 'oauth_auth_flow']);
    assert.deepEqual(state.metadata, {});
    const url = new URL(state.action.Redirect.url);
    assert.equal(`${url.origin}${url.pathname}`, `${oauth.url}/authorize`);
    const q = Object.fromEntries(url.searchParams);
    assert.deepEqual(
      [q.response_type, q.client_id, q.redirect_uri, q.scope, q.code_challenge_method, q.access_type, q.prompt],
      ['code', 'taskbridge-test-client', callbackUrl, SCOPE, 'S256', 'offline', 'consent'],
    );
    assert.match(q.state, /^[A-Za-z0-9_-]{43}$/);
    assert.match(q.code_challenge, /^[A-Za-z0-9_-]{43}$/);
    const rows = await testDb()('broker_states').select('*');
    assert.equal(rows.length, 1);
    assert.ok(!JSON.stringify(rows).includes(q.state), 'the state is not stored as it was sent');
    assert.ok(!JSON.stringify(state).includes(CLIENT_SECRET));
  });

  it('asks for the scope send_email needs when the resource server credential names none (Google refuses an authorize URL without one)', async () => {
    await instance('mail-no-scopes', { scopes: [] });
    const q = new URL((await broker('mail-no-scopes')).action.Redirect.url).searchParams;
    assert.equal(q.get('scope'), SCOPE);
    // A token endpoint that names no scope granted those asked for (RFC 6749 5.1): the credential names them.
    const done = await oauth.inMode('no-scope', async () => callback(await consent((await broker('mail-no-scopes')).action.Redirect.url)));
    assert.equal(done.status, 200);
    assert.deepEqual(((await done.json()) as Record<string, any>).value.scopes, [SCOPE]);
    await instance('mail-own-scopes', { scopes: ['openid', 'email'] });
    assert.equal(new URL((await broker('mail-own-scopes')).action.Redirect.url).searchParams.get('scope'), 'openid email', 'scopes named are asked for as they are');
  });

  it('the callback exchanges the code, stores the tokens encrypted, activates the instance, and functions call with the token', async () => {
    await instance('mail-b');
    await c.post(`${B}/provider/mail-b/function/google_mail_send_email/enable`, {});
    const back = await consent((await broker('mail-b')).action.Redirect.url);
    assert.ok(back.startsWith(`${callbackUrl}?`), back);
    // Providers add members of their own (Google: scope, authuser, prompt): the callback takes them.
    const r = await callback(`${back}&authuser=0&prompt=consent`);
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('cache-control'), 'no-store', 'the new credential is kept by no cache (the route is public)');
    const body = (await r.json()) as Record<string, any>;
    assert.equal(body.type, 'user_credential');
    assert.equal(body.type_id, 'oauth_auth_flow');
    assert.equal(body.dek_alias, 'default');
    assert.equal(body.value.sub, 'johndoe', 'the user the ID token names');
    assert.deepEqual(body.value.scopes, ['dummy'], 'the scopes the token endpoint says it granted (this mock grants "dummy")');
    const expiry = Date.parse(body.next_rotation_time) + 5 * 60 * 1000;
    assert.ok(Math.abs(expiry - (Date.now() + 3600 * 1000)) < 60_000, `expiry about an hour from now: ${body.next_rotation_time}`);

    const inst = (await c.get(`${B}/provider/mail-b`)).body;
    assert.equal(inst.status, 'active');
    assert.equal(inst.user_credential_id, body.id);

    const sent = await c.post(`${B}/provider/mail-b/function/google_mail_send_email/invoke`, { params: { to: 'a@example.com', subject: 'hi', body: 'hello' } });
    assert.equal(sent.status, 200, sent.text);
    assert.equal(sent.body.type, 'success');
    const bearer = gmail.seen.at(-1)!.authorization!;
    const claims = jwtPayload(bearer);
    assert.equal(claims.iss, oauth.url, 'an access token issued by the OAuth server');
    assert.equal(claims.sub, 'johndoe');
    const token = bearer.replace(/^Bearer /, '');
    const stored = await testDb()('bridge_credentials').where({ id: body.id }).first();
    for (const member of ['access_token', 'refresh_token', 'code']) {
      assert.equal(typeof stored.value[member], 'string', member);
      assert.ok(!stored.value[member].startsWith('ey') && stored.value[member] !== token, `${member} stored encrypted`);
    }
    assert.ok(!JSON.stringify(body).includes(token) && !JSON.stringify(inst).includes(token));
    assert.equal(await testDb()('broker_states').where({ provider_instance_id: 'mail-b' }).count({ n: '*' }).then((x) => Number(x[0].n)), 0, 'the state is used up');

    // The same callback again: the state was single use.
    const again = await callback(back);
    assert.equal(again.status, 404);
  });

  it('brokering again replaces the user credential (the old one is deleted)', async () => {
    const before = (await c.get(`${B}/provider/mail-b`)).body.user_credential_id;
    const r = await callback(await consent((await broker('mail-b')).action.Redirect.url));
    assert.equal(r.status, 200);
    const after = (await c.get(`${B}/provider/mail-b`)).body.user_credential_id;
    assert.notEqual(after, before);
    assert.equal(await testDb()('bridge_credentials').where({ id: before }).first(), undefined);

    // An instance an admin disabled gets its new credential but stays disabled.
    assert.equal((await c.patch(`${B}/provider/mail-b`, { status: 'disabled' })).status, 200);
    assert.equal((await callback(await consent((await broker('mail-b')).action.Redirect.url))).status, 200);
    assert.equal((await c.get(`${B}/provider/mail-b`)).body.status, 'disabled');
    assert.equal((await c.patch(`${B}/provider/mail-b`, { status: 'active' })).status, 200);
  });

  it('a completed brokering voids the instance\'s other flows: their callbacks answer 404 as a used state, the credential unchanged; another instance\'s flow is untouched', async () => {
    await instance('mail-two');
    await instance('mail-other');
    // Consent is given at the authorize URL; the callback is what the user's browser brings back.
    const first = await consent((await broker('mail-two')).action.Redirect.url);
    const second = await consent((await broker('mail-two')).action.Redirect.url);
    const other = await consent((await broker('mail-other')).action.Redirect.url);
    const done = await callback(first);
    assert.equal(done.status, 200, await done.clone().text());
    const credential = ((await done.json()) as { id: string }).id;
    const stored = await userCredentials();

    const late = await callback(second);
    assert.equal(late.status, 404);
    assert.deepEqual(await late.json(), { message: 'No brokering flow waits for this state: it is unknown, was used already, or its callback is under way', data: { code: 'not_found', resource: 'broker_state' } });
    const inst = (await c.get(`${B}/provider/mail-two`)).body;
    assert.deepEqual([inst.status, inst.user_credential_id], ['active', credential]);
    assert.equal(await userCredentials(), stored, 'nothing stored');
    assert.equal(Number((await testDb()('broker_states').where({ provider_instance_id: 'mail-two' }).count({ n: '*' }))[0].n), 0);
    assert.equal((await callback(other)).status, 200, "another instance's flow still completes");
  });

  // Flow `b`'s callback is sent and its token request held at the token endpoint; `during` runs then.
  // Its answer, once the token endpoint answers it (released after `during`) or not (BRIDGE_TIMEOUT_MS).
  async function heldWhile(b: string, during: () => Promise<void>, opts: { release: boolean }): Promise<Response> {
    await oauth.setMode('hold-next');
    const late = callback(b);
    try {
      await waitFor(async () => (await oauth.held()) === 1, 'the token request to be held');
      await during();
      if (opts.release) await oauth.release();
      return await late;
    } finally {
      await oauth.release();
      await oauth.setMode('ok');
    }
  }

  it('a flow whose code exchange is under way when another flow of the instance completes is refused when its tokens come: 404 as a used state (no redirect), the credential the completed flow\'s', async () => {
    await instance('mail-held', { returnUrl: 'https://app.example.com/connected' });
    const first = await consent((await broker('mail-held')).action.Redirect.url);
    const second = await consent((await broker('mail-held')).action.Redirect.url);
    const stored = await userCredentials();
    let credential = '';
    const late = await heldWhile(second, async () => {
      assert.equal((await callback(first)).status, 303);
      credential = (await c.get(`${B}/provider/mail-held`)).body.user_credential_id;
    }, { release: true });
    assert.equal(late.status, 404, await late.clone().text());
    assert.deepEqual(await late.json(), { message: 'No brokering flow waits for this state: it is unknown, was used already, or its callback is under way', data: { code: 'not_found', resource: 'broker_state' } });
    const inst = (await c.get(`${B}/provider/mail-held`)).body;
    assert.deepEqual([inst.status, inst.user_credential_id], ['active', credential]);
    assert.equal(await userCredentials(), stored + 1, "only the completed flow's credential is stored");
  });

  it('a flow whose token request gets no answer after another flow of the instance completed is not kept for a retry: 404 as a used state, and so is the retry', async () => {
    await instance('mail-held-t');
    const first = await consent((await broker('mail-held-t')).action.Redirect.url);
    const second = await consent((await broker('mail-held-t')).action.Redirect.url);
    let credential = '';
    const late = await heldWhile(second, async () => {
      const done = await callback(first);
      assert.equal(done.status, 200);
      credential = ((await done.json()) as { id: string }).id;
    }, { release: false });
    assert.equal(late.status, 404, await late.clone().text());
    assert.deepEqual(await late.json(), { message: 'No brokering flow waits for this state: it is unknown, was used already, or its callback is under way', data: { code: 'not_found', resource: 'broker_state' } });
    assert.equal(Number((await testDb()('broker_states').where({ provider_instance_id: 'mail-held-t' }).count({ n: '*' }))[0].n), 0, 'the state is not put back');
    assert.equal((await callback(second)).status, 404);
    assert.equal((await c.get(`${B}/provider/mail-held-t`)).body.user_credential_id, credential);
  });

  it('a flow whose instance is deleted, or deleted and made again under its id, while its code is exchanged stores nothing: 404 as a used state, the new instance left to be brokered, no state kept for it', async () => {
    const NO_FLOW = { message: 'No brokering flow waits for this state: it is unknown, was used already, or its callback is under way', data: { code: 'not_found', resource: 'broker_state' } };
    const id = 'mail-again';
    const remake = async () => {
      assert.equal((await c.delete(`${B}/provider/${id}`)).status, 200);
      await instance(id);
    };
    const stillToBroker = async () => {
      const inst = (await c.get(`${B}/provider/${id}`)).body;
      assert.deepEqual([inst.status, inst.user_credential_id], ['brokering_initiated', undefined]);
    };
    await instance(id);
    // Deleted before the callback: the delete takes the flow's state with it.
    const before = await consent((await broker(id)).action.Redirect.url);
    await remake();
    const early = await callback(before);
    assert.equal(early.status, 404);
    assert.deepEqual(await early.json(), NO_FLOW);
    const stored = await userCredentials();

    // The tokens come after the new instance is made: they are not its.
    const answered = await heldWhile(await consent((await broker(id)).action.Redirect.url), remake, { release: true });
    assert.equal(answered.status, 404, await answered.clone().text());
    assert.deepEqual(await answered.json(), NO_FLOW);
    await stillToBroker();
    assert.equal(await userCredentials(), stored, 'nothing stored');

    // No answer from the token endpoint: the state is not kept for the new instance, so no retry completes there.
    const unanswered = await consent((await broker(id)).action.Redirect.url);
    const late = await heldWhile(unanswered, remake, { release: false });
    assert.equal(late.status, 404, await late.clone().text());
    assert.deepEqual(await late.json(), NO_FLOW);
    assert.equal(Number((await testDb()('broker_states').where({ provider_instance_id: id }).count({ n: '*' }))[0].n), 0, 'the state is not put back');
    assert.equal((await callback(unanswered)).status, 404);
    await stillToBroker();

    // Deleted and not made again: the same 404.
    const gone = await heldWhile(await consent((await broker(id)).action.Redirect.url), async () => {
      assert.equal((await c.delete(`${B}/provider/${id}`)).status, 200);
    }, { release: true });
    assert.equal(gone.status, 404, await gone.clone().text());
    assert.deepEqual(await gone.json(), NO_FLOW);
    assert.equal(await userCredentials(), stored, 'nothing stored');
  });

  it('redirects (303) to return_on_successful_brokering when the instance has one', async () => {
    await instance('mail-c', { returnUrl: 'https://app.example.com/connected?x=1' });
    const r = await callback(await consent((await broker('mail-c')).action.Redirect.url));
    assert.equal(r.status, 303);
    assert.equal(r.headers.get('location'), 'https://app.example.com/connected?x=1');
    assert.equal(r.headers.get('cache-control'), 'no-store');
    // As documented: the Location header, and a body of a type listed (Koa's note, not no content).
    const documented = (await c.get('/api/openapi.json')).body.paths[`${B}/generic-oauth-callback`].get.responses['303'];
    assert.equal(documented.headers?.Location?.required, true);
    const body = await r.text();
    assert.ok(body.length > 0);
    assert.ok(Object.keys(documented.content ?? {}).includes(r.headers.get('content-type')?.split(';')[0] ?? ''), `${r.headers.get('content-type')}: ${body}`);
    assert.equal((await c.get(`${B}/provider/mail-c`)).body.status, 'active');
  });

  it('refuses a return address the callback could not redirect to (400, storing nothing); one stored before is answered with the credential, not a 500', async () => {
    const cred = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, {
      value: { client_id: 'taskbridge-test-client', client_secret: CLIENT_SECRET, redirect_uri: callbackUrl, scopes: [SCOPE] },
    });
    const instances = async () => Number((await testDb()('provider_instances').count({ n: '*' }))[0].n);
    const before = await instances();
    const bad = await c.post(avail('google_mail', 'oauth_auth_flow'), {
      provider_instance_id: 'mail-bad-return', display_name: 'x', resource_server_credential_id: cred.body.id,
      return_on_successful_brokering: { type: 'url', url: 'https://[app.example.com/connected' },
    });
    assert.equal(bad.status, 400, bad.text);
    assert.deepEqual(bad.body, {
      message: 'Invalid body: body.return_on_successful_brokering.url must be an http(s) URL',
      data: { code: 'invalid_request', errors: [{ path: 'body.return_on_successful_brokering.url', message: 'must be an http(s) URL' }] },
    });
    // The seed's constant type `url`: the answer names it, not just that some constant was missed.
    const badType = await c.post(avail('google_mail', 'oauth_auth_flow'), {
      provider_instance_id: 'mail-bad-return', display_name: 'x', resource_server_credential_id: cred.body.id,
      return_on_successful_brokering: { type: 'uri', url: 'https://app.example.com/connected' },
    });
    assert.equal(badType.status, 400, badType.text);
    assert.deepEqual(badType.body.data.errors, [{ path: 'body.return_on_successful_brokering.type', message: 'must be "url"' }]);
    assert.equal(await instances(), before);

    // As if stored before creation checked it: the callback used to store the credential, then answer 500.
    await instance('mail-old-return', { returnUrl: 'https://app.example.com/connected' });
    await testDb()('provider_instances').where({ id: 'mail-old-return' }).update({ return_on_successful_brokering: JSON.stringify({ type: 'url', url: 'https://[app.example.com/connected' }) });
    const r = await callback(await consent((await broker('mail-old-return')).action.Redirect.url));
    assert.equal(r.status, 200);
    const body = (await r.json()) as { type: string; id: string };
    assert.equal(body.type, 'user_credential');
    const inst = (await c.get(`${B}/provider/mail-old-return`)).body;
    assert.deepEqual([inst.status, inst.user_credential_id], ['active', body.id]);
  });

  it('answers 400 for a provider error, 404 for an unknown state, 410 for an expired one, changing nothing; a callback with neither code nor error, or with a code that cannot be stored, leaves its state usable', async () => {
    await instance('mail-d');
    const stored = await userCredentials();
    const denied = new URL(await consent((await broker('mail-d')).action.Redirect.url));
    denied.searchParams.delete('code');
    denied.searchParams.set('error', 'access_denied');
    denied.searchParams.set('error_description', 'The user denied access');
    const d = await callback(denied.toString());
    assert.equal(d.status, 400);
    assert.equal(d.headers.get('cache-control'), 'no-store', 'errors too');
    const dBody = (await d.json()) as { message: string };
    assert.match(dBody.message, /access_denied: The user denied access/);

    const unknown = await callback(`${callbackUrl}?state=${'A'.repeat(43)}&code=x`);
    assert.equal(unknown.status, 404);
    assert.equal(unknown.headers.get('cache-control'), 'no-store');
    // The state itself is not echoed, and no made-up text stands in data.id for it: there is no id to name.
    assert.deepEqual(await unknown.json(), { message: 'No brokering flow waits for this state: it is unknown, was used already, or its callback is under way', data: { code: 'not_found', resource: 'broker_state' } });
    const missing = await callback(`${callbackUrl}?code=x`);
    assert.equal(missing.status, 400);
    assert.equal(missing.headers.get('cache-control'), 'no-store', 'a query refused before the handler runs too');
    assert.match(((await missing.json()) as { message: string }).message, /state/);

    const back = await consent((await broker('mail-d')).action.Redirect.url);
    await testDb()('broker_states').where({ provider_instance_id: 'mail-d' }).update({ expires_at: new Date(Date.now() - 1000) });
    const expired = await callback(back);
    assert.equal(expired.status, 410);
    assert.equal(expired.headers.get('cache-control'), 'no-store');
    assert.equal((await callback(back)).status, 404, 'an expired state is used up too');

    // Neither a code nor an error is not the provider's answer: the state stays usable.
    const noCode = new URL(await consent((await broker('mail-d')).action.Redirect.url));
    const code = noCode.searchParams.get('code')!;
    for (const value of [null, '']) {
      if (value === null) noCode.searchParams.delete('code');
      else noCode.searchParams.set('code', value);
      const r = await callback(noCode.toString());
      assert.equal(r.status, 400);
      assert.match(((await r.json()) as { message: string }).message, /neither a code nor an error/);
    }
    // A code no user credential could hold is refused before it is redeemed: the state stays usable too.
    noCode.searchParams.set('code', `${code} x`);
    const spaced = await callback(noCode.toString());
    assert.equal(spaced.status, 400);
    assert.match(((await spaced.json()) as { message: string }).message, /query\.code must be printable ASCII without spaces/);
    noCode.searchParams.set('code', code);
    assert.equal((await callback(noCode.toString())).status, 200, 'the state is still there for the real answer');

    assert.equal(await userCredentials(), stored + 1);
    assert.equal((await c.get(`${B}/provider/mail-d`)).body.status, 'active');
  });

  it('a worker purges states expired over a day ago; younger expired ones stay and still answer 410', async () => {
    await instance('mail-p');
    const old = await consent((await broker('mail-p')).action.Redirect.url);
    const recent = await consent((await broker('mail-p')).action.Redirect.url);
    // States are stored as their SHA-256.
    const row = async (url: string) => testDb()('broker_states').where({ state_hash: createHash('sha256').update(new URL(url).searchParams.get('state')!).digest('hex') }).first();
    const [a, b] = [await row(old), await row(recent)];
    await testDb()('broker_states').where({ id: a.id }).update({ expires_at: new Date(Date.now() - 25 * 3600_000) });
    await testDb()('broker_states').where({ id: b.id }).update({ expires_at: new Date(Date.now() - 23 * 3600_000) });
    // Its passes would take later tests' fresh work for lost: it runs for this test only.
    const worker = await startWorker({ ...stack.env, JOB_RECOVERY_MS: '200' });
    try {
      await waitFor(async () => !(await testDb()('broker_states').where({ id: a.id }).first()), 'the old state to be purged');
    } finally {
      await worker.stop();
    }
    assert.ok(await testDb()('broker_states').where({ id: b.id }).first(), 'the younger expired state stays');
    assert.equal((await callback(old)).status, 404);
    assert.equal((await callback(recent)).status, 410);
  });

  it('answers 502 when the token endpoint refuses the code, storing nothing', async () => {
    await instance('mail-e', { secret: 'not-the-secret' });
    const stored = await userCredentials();
    const back = await consent((await broker('mail-e')).action.Redirect.url);
    const r = await callback(back);
    assert.equal(r.status, 502);
    const body = (await r.json()) as { message: string };
    assert.match(body.message, /token endpoint refused the code: The client secret is not valid/);
    assert.ok(!body.message.includes('not-the-secret'));
    assert.equal(await userCredentials(), stored);
    assert.equal((await c.get(`${B}/provider/mail-e`)).body.status, 'brokering_initiated');
    assert.equal((await callback(back)).status, 404, "the provider's answer used the state up");
  });

  it('keeps the state when the token endpoint gives no answer (none in time, connection closed): 502 saying the callback may be retried, and the retry completes; two callbacks at once exchange once', async () => {
    await instance('mail-t');
    const stateRow = (url: string) => testDb()('broker_states').where({ state_hash: createHash('sha256').update(new URL(url).searchParams.get('state')!).digest('hex') }).first();
    for (const [mode, says] of [['silent', `no answer within ${TIMEOUT_MS} ms`], ['hang-up', 'unreachable']] as const) {
      const back = await consent((await broker('mail-t')).action.Redirect.url);
      const [taken, stored] = [await stateRow(back), await userCredentials()];
      await oauth.inMode(mode, async () => {
        const r = await callback(back);
        assert.equal(r.status, 502, mode);
        assert.equal(((await r.json()) as { message: string }).message, `token endpoint: ${says}; the state is kept: the same callback may be retried until it expires`);
      });
      const kept = await stateRow(back);
      assert.deepEqual([kept?.id, kept?.expires_at], [taken.id, taken.expires_at], `${mode}: the state is back, expiring as before`);
      assert.equal(await userCredentials(), stored, `${mode}: nothing stored`);
      assert.equal((await callback(back)).status, 200, `${mode}: the same callback again completes`);
      assert.equal((await c.get(`${B}/provider/mail-t`)).body.status, 'active');
      assert.equal((await callback(back)).status, 404, `${mode}: then the state is used up`);
    }
    // While one callback waits on the token endpoint, the other finds no state.
    const back = await consent((await broker('mail-t')).action.Redirect.url);
    const both = await oauth.inMode('silent', () => Promise.all([callback(back), callback(back)]));
    assert.deepEqual(both.map((r) => r.status).sort(), [404, 502]);
    assert.equal((await callback(back)).status, 200);
  });

  it("masks the client secret and code a token endpoint quotes in its refusal, in the 502 and the log", async () => {
    await instance('mail-q');
    await oauth.inMode('echo', async () => {
      const back = await consent((await broker('mail-q')).action.Redirect.url);
      const code = new URL(back).searchParams.get('code')!;
      const r = await callback(back);
      assert.equal(r.status, 502);
      const { message } = (await r.json()) as { message: string };
      assert.match(message, /^token endpoint refused the code: Rejected grant_type=authorization_code&code=\*\*\*&.*&client_secret=\*\*\*/);
      // Every line of this request, its closing request line included, not only those written so far.
      const logs = await requestLogsThrough(stack, r, { all: true });
      assert.ok(logs.some((l) => l.includes('token endpoint refused the code: Rejected')), 'the 502 in the API log');
      for (const secret of [CLIENT_SECRET, code]) {
        assert.ok(!message.includes(secret), message);
        assert.ok(!logs.some((l) => l.includes(secret)), `${secret} in an API log line`);
      }
    });
  });

  it('masks a client secret and code the token endpoint quotes encoded (lowercase escapes, JSON, HTML, Basic base64, cut short), in the 502 and the log', async () => {
    const secret = `s/é+ 😀${randomUUID()}`;
    await instance('mail-enc', { secret });
    for (const form of ['pct', 'form', 'json', 'html', 'hex', 'basic', 'code', 'cut'] as const) {
      await oauth.inMode(`echo-encoded:${form}`, async () => {
        const back = await consent((await broker('mail-enc')).action.Redirect.url);
        const code = new URL(back).searchParams.get('code')!;
        const r = await callback(back);
        assert.equal(r.status, 502);
        const { message } = (await r.json()) as { message: string };
        assert.equal(message, `token endpoint refused the code: ${form}=***`);
        const logs = await requestLogsThrough(stack, r, { all: true });
        assert.ok(logs.some((l) => l.includes(`token endpoint refused the code: ${form}=***`)), `the 502 in the API log (${form})`);
        assert.ok(!logs.some((l) => l.includes(secret.slice(-12)) || l.includes(code.slice(0, 12))), `no log line holds the secret or the code (${form})`);
      });
    }
  });

  it('masks a client secret that the 500 characters quoted of a long refusal cut inside its encoding', async () => {
    const secret = `s/é+ 😀${randomUUID()}`;
    await instance('mail-long', { secret });
    await oauth.inMode('echo-long', async () => {
      const r = await callback(await consent((await broker('mail-long')).action.Redirect.url));
      assert.equal(r.status, 502);
      // The first 6 of the secret's characters (30 encoded ones), then half of the 7th's first escape.
      assert.equal(((await r.json()) as { message: string }).message, `token endpoint refused the code: ${'x'.repeat(469)}***`);
    });
  });

  it('takes an absurd expires_in as ten years, and answers 502 for an access token no header can carry, storing nothing', async () => {
    await instance('mail-f');
    const body = await oauth.inMode('eternal', async () => {
      const r = await callback(await consent((await broker('mail-f')).action.Redirect.url));
      assert.equal(r.status, 200);
      const body = (await r.json()) as Record<string, any>;
      const expiry = Date.parse(body.next_rotation_time) + 5 * 60 * 1000;
      assert.ok(Math.abs(expiry - (Date.now() + 10 * 365 * 86400 * 1000)) < 60_000, `expiry ten years from now: ${body.next_rotation_time}`);
      return body;
    });
    await oauth.inMode('unprintable', async () => {
      const stored = await userCredentials();
      const bad = await callback(await consent((await broker('mail-f')).action.Redirect.url));
      assert.equal(bad.status, 502);
      assert.match(((await bad.json()) as { message: string }).message, /access_token that cannot be sent in an Authorization header/);
      assert.equal(await userCredentials(), stored);
      assert.equal((await c.get(`${B}/provider/mail-f`)).body.user_credential_id, body.id, 'the earlier credential stays');
    });
  });

  it('takes expires_in 0 as expired now (due for refresh at once); answers 502 for one that is negative or not a number, storing nothing', async () => {
    await instance('mail-z');
    await oauth.inMode('expires-in:0', async () => {
      const r = await callback(await consent((await broker('mail-z')).action.Redirect.url));
      assert.equal(r.status, 200);
      const body = (await r.json()) as Record<string, any>;
      assert.ok(Date.parse(body.value.expiry_time) <= Date.now(), `expired: ${body.value.expiry_time}`);
      assert.ok(Date.parse(body.next_rotation_time) <= Date.now(), `due now: ${body.next_rotation_time}`);
    });
    await refusesTokenAnswers('mail-z', 'expires-in', ['-1', '"soon"', '""', 'true'], 'token endpoint: answered an expires_in that is not a number of seconds (0 or more)');
  });

  it('answers 502 for a token_type other than bearer (DPoP: it would be sent as a bearer token), storing nothing; bearer in any case is taken', async () => {
    await instance('mail-ty');
    await refusesTokenAnswers('mail-ty', 'token-type', ['"DPoP"', '"mac"', '5'], 'token endpoint: answered a token_type that is not bearer: only bearer tokens are supported');
    await oauth.inMode('token-type:"bearer"', async () => {
      assert.equal((await callback(await consent((await broker('mail-ty')).action.Redirect.url))).status, 200);
    });
  });

  it('answers 502 for tokens it could not store or export again (a NUL in scope, more scopes than a user credential holds), storing nothing', async () => {
    await instance('mail-n');
    for (const [mode, says] of [['nul-scope', /^token endpoint: answered a credential\.scopes\.0 that contains a NUL character/], ['many-scopes', /^token endpoint: answered tokens that do not fit the user credential \(.*scopes must NOT have more than 100 items\)$/]] as const) {
      await oauth.inMode(mode, async () => {
        const stored = await userCredentials();
        const r = await callback(await consent((await broker('mail-n')).action.Redirect.url));
        assert.equal(r.status, 502, mode);
        assert.match(((await r.json()) as { message: string }).message, says);
        assert.equal(await userCredentials(), stored, `${mode}: nothing stored`);
        assert.equal((await c.get(`${B}/provider/mail-n`)).body.status, 'brokering_initiated');
      });
    }
  });

  it('answers HEAD on the callback with 405, leaving the state for the GET', async () => {
    await instance('mail-g');
    const back = await consent((await broker('mail-g')).action.Redirect.url);
    const head = await fetch(back, { method: 'HEAD', redirect: 'manual' });
    assert.equal(head.status, 405);
    assert.equal(head.headers.get('allow'), 'GET');
    assert.equal(head.headers.get('cache-control'), 'no-store');
    // The router also takes the path with a trailing slash: refused alike.
    const slashed = new URL(back);
    slashed.pathname += '/';
    assert.equal((await fetch(slashed, { method: 'HEAD', redirect: 'manual' })).status, 405);
    // Nor does any other answer offer HEAD in Allow (SPEC section 1: Allow names what the path takes).
    for (const method of ['POST', 'OPTIONS']) {
      const r = await fetch(back, { method });
      assert.equal(r.status, method === 'POST' ? 405 : 200, method);
      assert.equal(r.headers.get('allow'), 'GET', method);
    }
    // Nor in another letter case, which is no route (the router matches case-sensitively).
    for (const [method, path] of [['HEAD', '/api/bridge/v1/Generic-OAuth-Callback'], ['GET', '/API/BRIDGE/V1/GENERIC-OAUTH-CALLBACK'], ['POST', '/api/bridge/v1/GENERIC-OAUTH-CALLBACK']]) {
      const other = new URL(back);
      other.pathname = path;
      const r = await fetch(other, { method, redirect: 'manual' });
      assert.equal(r.status, 404, `${method} ${path}`);
      assert.equal(r.headers.get('allow'), null, `${method} ${path}`);
    }
    assert.equal((await c.get(`${B}/provider/mail-g`)).body.status, 'brokering_initiated');
    assert.equal((await callback(back)).status, 200);
    assert.equal((await c.get(`${B}/provider/mail-g`)).body.status, 'active');
  });

  it('refuses to broker what cannot be brokered (400, 404) and bad requests (400, 401, 403)', async () => {
    const stripeCred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'sk_test_x' } });
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'pay', display_name: 'pay', resource_server_credential_id: stripeCred.body.id })).status, 201);
    const cases: [string, unknown, number, RegExp][] = [
      [BROKER, { provider_instance_id: 'nope' }, 404, /provider_instance 'nope' not found/],
      [BROKER, { provider_instance_id: 'pay' }, 400, /is a stripe instance with api_key, not google_mail with oauth_auth_flow/],
      [`${avail('stripe', 'api_key')}/credential/user-credential/broker`, { provider_instance_id: 'pay' }, 400, /'api_key' does not broker/],
      [`${avail('google_mail', 'oauth2_jwt_bearer_assertion_flow')}/credential/user-credential/broker`, { provider_instance_id: 'mail-a' }, 400, /does not broker/],
      [`${avail('nope', 'oauth_auth_flow')}/credential/user-credential/broker`, { provider_instance_id: 'mail-a' }, 404, /provider controller 'nope' not found/],
      [BROKER, {}, 400, /provider_instance_id/],
      [BROKER, { provider_instance_id: 'bad id!' }, 400, /provider_instance_id/],
    ];
    const states = Number((await testDb()('broker_states').count({ n: '*' }))[0].n);
    for (const [url, body, status, pattern] of cases) {
      const r = await c.post(url, body);
      assert.equal(r.status, status, `${url} ${JSON.stringify(body)}: ${r.text}`);
      assert.match(r.body.message, pattern);
    }
    assertNotFound(await c.post(`${avail('nope', 'oauth_auth_flow')}/credential/user-credential/broker`, { provider_instance_id: 'mail-a' }), 'provider_controller', 'nope');
    assertNotFound(await c.post(BROKER, { provider_instance_id: 'nope' }), 'provider_instance', 'nope');
    assert.equal((await c.as(undefined).post(BROKER, { provider_instance_id: 'mail-a' })).status, 401);
    const reader = (await c.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['bridge:read'] })).body.key;
    assert.equal((await c.as(reader).post(BROKER, { provider_instance_id: 'mail-a' })).status, 403);
    assert.equal(Number((await testDb()('broker_states').count({ n: '*' }))[0].n), states, 'no state was created');
  });
  it('a broker call racing a delete of its instance answers 200 (its state goes with the instance) or 404, never 409 or 400', async () => {
    for (let i = 0; i < 30; i++) {
      const id = `race-broker-${i}`;
      await instance(id);
      const [brokered, deleted] = await Promise.all([c.post(BROKER, { provider_instance_id: id }), c.delete(`${B}/provider/${id}`)]);
      assert.equal(deleted.status, 200, deleted.text);
      if (brokered.status !== 200) assertNotFound(brokered, 'provider_instance', id);
      assert.equal((await testDb()('broker_states').where({ provider_instance_id: id }).first()), undefined);
    }
  });
  // Brokers instance `id` again `rounds` times, sending `call` one after another from three clients
  // for as long as each callback runs, so that some fall across its commit; their answers by round.
  async function whileRebrokering<T>(id: string, rounds: number, call: () => Promise<T>): Promise<T[][]> {
    const byRound: T[][] = [];
    for (let i = 0; i < rounds; i++) {
      const back = await consent((await broker(id)).action.Redirect.url);
      let brokered = false;
      const rebroker = callback(back).finally(() => { brokered = true; });
      const calls = async () => {
        const answers: T[] = [];
        while (!brokered) answers.push(await call());
        return answers;
      };
      const [r, answers] = await Promise.all([rebroker, Promise.all([calls(), calls(), calls()])]);
      assert.equal(r.status, 200);
      byRound.push(answers.flat());
    }
    return byRound;
  }

  it('functions invoked while the instance is brokered again all answer 200, never 404 for the instance', async () => {
    await instance('mail-rebroker');
    await c.post(`${B}/provider/mail-rebroker/function/google_mail_send_email/enable`, {});
    assert.equal((await callback(await consent((await broker('mail-rebroker')).action.Redirect.url))).status, 200);
    const invoke = () => c.post(`${B}/provider/mail-rebroker/function/google_mail_send_email/invoke`, { params: { to: 'a@example.com', subject: 'hi', body: 'hello' } });
    for (const [i, answers] of (await whileRebrokering('mail-rebroker', 10, invoke)).entries()) {
      for (const a of answers) assert.equal(a.status, 200, `round ${i}: ${a.text}`);
    }
  });

  it('an instance read while it is brokered again shows the user credential it names, in the instance, the list and the grouped list', async () => {
    await instance('mail-reread');
    await c.post(`${B}/provider/mail-reread/function/google_mail_send_email/enable`, {});
    assert.equal((await callback(await consent((await broker('mail-reread')).action.Redirect.url))).status, 200);
    const reads = [
      async () => (await c.get(`${B}/provider/mail-reread`)).body,
      async () => (await c.get(`${B}/provider?provider_controller_type_id=google_mail&page_size=1000`)).body.items.find((p: any) => p.id === 'mail-reread'),
      async () => (await c.get(`${B}/provider/grouped-by-function?provider_controller_type_id=google_mail&page_size=1000`)).body.items
        .flatMap((g: any) => g.provider_instances).find((p: any) => p.provider_instance.id === 'mail-reread'),
    ];
    let n = 0;
    const answers = (await whileRebrokering('mail-reread', 10, () => reads[n++ % reads.length]())).flat();
    assert.ok(answers.length >= 30, `reads across the callbacks: ${answers.length}`);
    for (const got of answers) {
      const inst = got.provider_instance ?? got;
      assert.ok(inst.user_credential_id, JSON.stringify(got));
      assert.equal(got.user_credential?.id, inst.user_credential_id, `the credential the instance names: ${JSON.stringify(got)}`);
    }
  });
});

// Stored bridge rows that name what this release's catalog no longer has (a release removed a
// provider, a credential controller or a function; the type ids are free text, so the rows stay):
// lists and details still answer, with the rest intact and every page reachable; actions on such an
// instance are a 404 naming what is gone; background jobs fail that item and go on.
import assert from 'node:assert/strict';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import type { TSchema } from '@sinclair/typebox';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';
import { ADMIN_KEY, assertNotFound, resetDb, startStack, testDb, waitFor, type Client, type Response, type Stack } from './helpers/stack.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';
import { FunctionInstance, ProviderInstanceDetail } from '../domain/shapes/bridge.ts';
import { Paginated } from '../domain/shapes/common.ts';
import { TOOLS_PAGE } from '../domain/bridge/mcp.ts';
import { compileSchema } from '../domain/schema-check.ts';

const B = '/api/bridge/v1';
const E = '/api/encryption/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const STRIPE_KEY = `sk_test_${randomUUID().replace(/-/g, '')}`;
const ATTEMPTS = 2;
// Instances: a healthy one; one with a retired function beside a real one; one of a retired
// provider; one whose credential controller is retired; an OAuth one whose credential controller is
// retired, due for refresh.
const ALL = ['stripe-ok', 'stripe-gone-fn', 'legacy', 'stripe-old-cred', 'mail-old'];

// Whether an answer fits the documented schema. Its $ids are dropped: a detail holds CredentialController twice.
const conforms = (schema: TSchema, body: unknown) => {
  const validate = compileSchema(JSON.parse(JSON.stringify(schema, (k, v) => (k === '$id' ? undefined : v))));
  assert.ok(validate(body), JSON.stringify(validate.errors));
};

describe('bridge rows naming what the catalog no longer has', () => {
  let stack: Stack;
  let c: Client;
  let upstream: FakeProviders;
  const clients: McpClient[] = [];
  const db = () => testDb();

  const stripeInstance = async (id: string) => {
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
    assert.equal(cred.status, 201, cred.text);
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: id, display_name: id, resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await c.post(`${B}/provider/${id}/function/stripe_process_refund/enable`, {})).status, 201);
    return cred.body.id as string;
  };
  const invoke = (id: string, fn: string) => c.post(`${B}/provider/${id}/function/${fn}/invoke`, { params: { payment_intent: 'pi_1' } });
  // The API's log lines of one answer (by its request id) that say what was left out.
  const leftOutWarnings = (r: Response) => stack.api.logs.filter((l) => l.includes(`"req_id":"${r.headers.get('x-request-id')}"`) && l.includes('left out')).map((l) => JSON.parse(l));
  // Every item of a list, page by page.
  async function allPages(url: string, pageSize: number): Promise<{ items: any[]; pages: Response[] }> {
    const items: any[] = [];
    const pages: Response[] = [];
    let token: string | undefined;
    do {
      const r = await c.get(`${url}${url.includes('?') ? '&' : '?'}page_size=${pageSize}${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(r.status, 200, r.text);
      pages.push(r);
      items.push(...r.body.items);
      token = r.body.next_page_token;
    } while (token);
    return { items, pages };
  }

  before(async () => {
    await resetDb();
    upstream = await startFakeProviders({ stripeKey: STRIPE_KEY });
    stack = await startStack({
      STRIPE_API_BASE_URL: upstream.url, BRIDGE_ALLOW_PRIVATE: 'true',
      CREDENTIAL_REFRESH_SCAN_MS: '200', CREDENTIAL_REFRESH_ATTEMPTS: String(ATTEMPTS), CREDENTIAL_REFRESH_BACKOFF_MS: '50',
    });
    c = stack.client;
    await stripeInstance('stripe-ok');
    await stripeInstance('stripe-gone-fn');
    await db()('function_instances').insert({ provider_instance_id: 'stripe-gone-fn', function_controller_type_id: 'retired_function', provider_controller_type_id: 'stripe' });
    // A provider a release removed: its instance, credential and function, as that release stored them.
    const legacyCred = await stripeInstance('legacy');
    await db()('provider_instances').where({ id: 'legacy' }).update({ provider_controller_type_id: 'retired_provider' });
    await db()('bridge_credentials').where({ id: legacyCred }).update({ provider_controller_type_id: 'retired_provider' });
    await db()('function_instances').where({ provider_instance_id: 'legacy' }).update({ provider_controller_type_id: 'retired_provider', function_controller_type_id: 'retired_provider_sync' });
    // A credential controller a release removed from a provider that stays.
    const oldCred = await stripeInstance('stripe-old-cred');
    await db()('provider_instances').where({ id: 'stripe-old-cred' }).update({ credential_controller_type_id: 'retired_key' });
    await db()('bridge_credentials').where({ id: oldCred }).update({ type_id: 'retired_key' });
    // An OAuth instance with a user credential, its controller then removed.
    const oauth = avail('google_mail', 'oauth_auth_flow');
    const rs = await c.post(`${oauth}/credential/resource-server`, { value: { client_id: 'cid', client_secret: `cs-${randomUUID()}`, redirect_uri: `${stack.api.url}${B}/generic-oauth-callback` } });
    assert.equal(rs.status, 201, rs.text);
    const user = await c.post(`${oauth}/credential/user-credential`, { value: { access_token: 'at-1', refresh_token: 'rt-1', expiry_time: new Date(Date.now() + 86_400_000).toISOString() } });
    assert.equal(user.status, 201, user.text);
    const mail = await c.post(oauth, { provider_instance_id: 'mail-old', display_name: 'mail', resource_server_credential_id: rs.body.id, user_credential_id: user.body.id });
    assert.equal(mail.status, 201, mail.text);
    assert.equal(mail.body.status, 'active');
    await db()('provider_instances').where({ id: 'mail-old' }).update({ credential_controller_type_id: 'retired_oauth' });
    await db()('bridge_credentials').whereIn('id', [rs.body.id, user.body.id]).update({ type_id: 'retired_oauth' });
  });
  after(async () => {
    await Promise.all(clients.map((cl) => cl.close()));
    await stack?.stop();
    upstream?.close();
  });

  it('lists every provider instance, those naming a retired provider or credential controller with a stand-in marked retired, retired functions left out with one warning', async () => {
    const r = await c.get(`${B}/provider`);
    assert.equal(r.status, 200, r.text);
    conforms(Paginated(ProviderInstanceDetail), r.body);
    const byId = Object.fromEntries(r.body.items.map((i: any) => [i.id, i]));
    assert.deepEqual(Object.keys(byId).sort(), [...ALL].sort());

    const legacy = byId.legacy;
    assert.equal(legacy.provider_controller_type_id, 'retired_provider');
    assert.equal(legacy.status, 'active');
    assert.deepEqual({ ...legacy.controller, documentation: undefined }, {
      type_id: 'retired_provider', name: 'retired_provider', documentation: undefined, retired: true, categories: [], credential_controllers: [], functions: [],
    });
    assert.match(legacy.controller.documentation, /Not in this release's catalog/);
    assert.equal(legacy.credential_controller.retired, true, 'its provider is gone, so is what it said of api_key');
    assert.deepEqual(legacy.functions, [], 'its function is left out');
    assert.equal(legacy.resource_server_credential.type_id, 'api_key', 'the row\'s own credential is shown');

    const oldCred = byId['stripe-old-cred'];
    assert.equal(oldCred.controller.type_id, 'stripe');
    assert.equal(oldCred.controller.retired, undefined, 'stripe is in the catalog');
    assert.deepEqual(oldCred.credential_controller, {
      type_id: 'retired_key', name: 'retired_key', documentation: oldCred.credential_controller.documentation, retired: true,
      requires_brokering: false, requires_resource_server_credential_refreshing: false, requires_user_credential_refreshing: false,
      configuration_schema: { resource_server: {}, user_credential: {} },
    });
    assert.deepEqual(oldCred.functions.map((f: any) => f.function_controller_type_id), ['stripe_process_refund'], 'a function the catalog has is shown');

    assert.deepEqual(byId['stripe-gone-fn'].functions.map((f: any) => f.function_controller_type_id), ['stripe_process_refund']);
    assert.equal(byId['stripe-ok'].credential_controller.retired, undefined);
    assert.equal(byId['stripe-ok'].controller.functions[0].type_id, 'stripe_process_refund');

    const warnings = await waitFor(async () => leftOutWarnings(r).length > 0 && leftOutWarnings(r), 'the warning');
    assert.equal(warnings.length, 1, 'one warning for the answer');
    assert.equal(warnings[0].level, 40);
    assert.equal(warnings[0].left_out, 2);
    assert.deepEqual(new Set(warnings[0].first.map((f: any) => f.function_controller_type_id)), new Set(['retired_function', 'retired_provider_sync']));
    assert.match(warnings[0].msg, /^provider instances list: 2 function instance\(s\) left out/);
  });

  it('pages through every provider instance one at a time, and filters by a retired provider', async () => {
    const { items, pages } = await allPages(`${B}/provider`, 1);
    assert.deepEqual(items.map((i) => i.id).sort(), [...ALL].sort());
    assert.equal(pages.length, ALL.length, 'one instance a page, none short');
    const retired = await c.get(`${B}/provider?provider_controller_type_id=retired_provider`);
    assert.equal(retired.status, 200, retired.text);
    assert.deepEqual(retired.body.items.map((i: any) => i.id), ['legacy']);
  });

  it('reads each instance by id, with its stand-ins', async () => {
    for (const id of ALL) {
      const r = await c.get(`${B}/provider/${id}`);
      assert.equal(r.status, 200, `${id}: ${r.text}`);
      conforms(ProviderInstanceDetail, r.body);
    }
    const legacy = await c.get(`${B}/provider/legacy`);
    assert.equal(legacy.body.controller.retired, true);
    // The API's log lines reach the test after its answer: waited for.
    assert.equal((await waitFor(async () => leftOutWarnings(legacy).length > 0 && leftOutWarnings(legacy), 'the warning')).length, 1);
    const mail = await c.get(`${B}/provider/mail-old`);
    assert.equal(mail.body.controller.type_id, 'google_mail');
    assert.equal(mail.body.credential_controller.retired, true);
  });

  it('lists function instances without the retired ones (one warning), and paging reaches every other through pages that hold only a retired one', async () => {
    const r = await c.get(`${B}/function-instances`);
    assert.equal(r.status, 200, r.text);
    conforms(Paginated(FunctionInstance), r.body);
    const listed = r.body.items.map((f: any) => `${f.provider_instance_id}/${f.function_controller_type_id}`).sort();
    const expected = ['stripe-gone-fn/stripe_process_refund', 'stripe-ok/stripe_process_refund', 'stripe-old-cred/stripe_process_refund'];
    assert.deepEqual(listed, expected);
    const warnings = await waitFor(async () => leftOutWarnings(r).length > 0 && leftOutWarnings(r), 'the warning');
    assert.equal(warnings.length, 1);
    assert.equal(warnings[0].left_out, 2);

    // One row a page: the pages of a retired one are empty, with a token on to the rest.
    const { items, pages } = await allPages(`${B}/function-instances`, 1);
    assert.deepEqual(items.map((f) => `${f.provider_instance_id}/${f.function_controller_type_id}`).sort(), expected);
    assert.equal(pages.length, 5, 'one page per stored row');
    assert.equal(pages.filter((p) => p.body.items.length === 0).length, 2);
    assert.ok(pages.slice(0, -1).every((p) => p.body.next_page_token), 'every page but the last leads on');

    const own = await c.get(`${B}/function-instances?provider_instance_id=legacy`);
    assert.equal(own.status, 200, own.text);
    assert.deepEqual(own.body.items, []);
  });

  it('lists the grouped-by-function view with every instance of the functions the catalog has', async () => {
    const r = await c.get(`${B}/provider/grouped-by-function`);
    assert.equal(r.status, 200, r.text);
    const refund = r.body.items.find((g: any) => g.function_controller.type_id === 'stripe_process_refund');
    assert.deepEqual(refund.provider_instances.map((p: any) => p.provider_instance.id).sort(), ['stripe-gone-fn', 'stripe-ok', 'stripe-old-cred']);
  });

  const connect = async () => {
    const client = new McpClient({ name: 'catalog-test', version: '1.0.0' });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${stack.api.url}${B}/mcp`), { requestInit: { headers: { authorization: `Bearer ${ADMIN_KEY}` } } }));
    clients.push(client);
    return client;
  };

  it('tools/list leaves out the retired functions and the instances whose credential controller is retired (a call of them cannot run), in full pages', async () => {
    const client = await connect();
    const { tools, nextCursor } = await client.listTools();
    assert.equal(nextCursor, undefined);
    assert.deepEqual(tools.map((t) => t.name).sort(), ['stripe__stripe_process_refund__stripe-gone-fn', 'stripe__stripe_process_refund__stripe-ok']);

    // A whole page of retired functions, newer than the others (newest come first): left out in the query, not from the page.
    await db().raw(`insert into function_instances (provider_instance_id, function_controller_type_id, provider_controller_type_id)
      select 'stripe-gone-fn', 'retired_function_' || g, 'stripe' from generate_series(1, ?) g`, [TOOLS_PAGE]);
    try {
      const first = await client.listTools();
      assert.equal(first.tools.length, 2);
      assert.equal(first.nextCursor, undefined);
    } finally {
      await db()('function_instances').where('function_controller_type_id', 'like', 'retired_function_%').delete();
    }
  });

  it('tools/call of a tool whose credential controller is retired (by a name kept from before) is a tool error naming it; a retired function (old dotted name) is an unknown tool', async () => {
    const client = await connect();
    const result = await client.callTool({ name: 'stripe__stripe_process_refund__stripe-old-cred', arguments: { payment_intent: 'pi_1' } });
    assert.equal(result.isError, true);
    assert.match((result.content as { text: string }[])[0].text, /credential controller 'retired_key' not found for provider 'stripe'/);
    for (const name of ['stripe.retired_function.stripe-gone-fn', 'retired_provider.retired_provider_sync.legacy']) {
      await assert.rejects(client.callTool({ name, arguments: {} }), (err: unknown) => err instanceof McpError && err.code === ErrorCode.InvalidParams && /Unknown tool/.test(err.message));
    }
  });

  it('answers actions on such an instance with a 404 naming what the release no longer has, never a 500', async () => {
    assertNotFound(await invoke('legacy', 'retired_provider_sync'), 'provider_controller', 'retired_provider');
    assertNotFound(await invoke('stripe-gone-fn', 'retired_function'), 'function_controller', 'retired_function');
    assertNotFound(await invoke('stripe-old-cred', 'stripe_process_refund'), 'credential_controller', 'retired_key');
    assertNotFound(await c.post(`${B}/provider/legacy/function/stripe_process_refund/enable`, {}), 'provider_controller', 'retired_provider');
    assertNotFound(await c.post(`${avail('retired_provider', 'api_key')}/credential/user-credential/broker`, { provider_instance_id: 'legacy' }), 'provider_controller', 'retired_provider');
    // The OAuth callback of a flow begun before the release.
    const state = randomBytes(32).toString('base64url');
    await db()('broker_states').insert({
      id: randomUUID(), state_hash: createHash('sha256').update(state).digest('hex'), provider_instance_id: 'mail-old',
      code_verifier: 'v'.repeat(43), metadata: {}, expires_at: new Date(Date.now() + 600_000),
    });
    assertNotFound(await c.get(`${B}/generic-oauth-callback?state=${state}&code=abc`), 'credential_controller', 'retired_oauth');
    // What needs no catalog still works: rename, disable, and back to active needs the controller.
    assert.equal((await c.patch(`${B}/provider/legacy`, { display_name: 'legacy CRM' })).status, 200);
    assert.equal((await c.patch(`${B}/provider/legacy`, { status: 'disabled' })).status, 200);
    assertNotFound(await c.patch(`${B}/provider/legacy`, { status: 'active' }), 'provider_controller', 'retired_provider');
    assert.equal((await c.post(`${B}/provider/stripe-gone-fn/function/retired_function/disable`, {})).status, 200);
    assert.equal((await c.post(`${B}/provider/stripe-gone-fn/function/retired_function/enable`, {})).status, 404, 'not enabled again');
  });

  it('a due refresh of a credential whose controller is retired gives up after its attempts: the instance is refresh_failed, the reason named, and it is not tried again', async () => {
    const credential = (await db()('provider_instances').where({ id: 'mail-old' }).first()).user_credential_id;
    await db()('bridge_credentials').where({ id: credential }).update({ next_rotation_time: new Date(Date.now() - 1000) });
    await waitFor(async () => (await db()('provider_instances').where({ id: 'mail-old' }).first()).status === 'refresh_failed', 'mail-old to be refresh_failed');
    const logs = () => stack.workers.flatMap((w) => w.logs).filter((l) => l.includes('credential refresh gave up'));
    const gaveUp = JSON.parse(await waitFor(async () => logs()[0], 'the worker to log giving up'));
    assert.equal(gaveUp.credential_id, credential);
    assert.match(gaveUp.reason, /credential controller 'retired_oauth' not found for provider 'google_mail'/);
    await new Promise((resolve) => setTimeout(resolve, 1000)); // five scans
    assert.equal(logs().length, 1, 'given up once');
    const others = await db()('provider_instances').whereNot({ id: 'mail-old' }).whereNot({ id: 'legacy' }).select('status');
    assert.ok(others.every((o) => o.status === 'active'));
  });

  it('an alias rotation moves every credential it can and records each whose controller is retired as its own error, then completes', async () => {
    const oldDek = (await db()('dek_aliases').where({ alias: 'default' }).first()).dek_id;
    const retired = await db()('bridge_credentials').where({ provider_controller_type_id: 'retired_provider' }).orWhereIn('type_id', ['retired_key', 'retired_oauth']).select('id');
    assert.equal(retired.length, 4, 'legacy\'s, stripe-old-cred\'s and mail-old\'s two');
    const started = await c.post(`${E}/dek/alias/default/rotate`);
    assert.equal(started.status, 202, started.text);
    const job = await waitFor(async () => {
      const j = (await c.get(`${E}/job/${started.body.id}`)).body;
      return ['completed', 'failed'].includes(j.status) && j;
    }, 'the rotation to end', 30000);
    assert.equal(job.status, 'completed', JSON.stringify(job));
    assert.equal(job.failed, retired.length);
    assert.deepEqual(job.errors.map((e: any) => e.id).sort(), retired.map((r) => r.id).sort());
    assert.ok(job.errors.every((e: any) => /is not in this release's catalog: left under DEK/.test(e.message)), JSON.stringify(job.errors));
    const rows = await db()('bridge_credentials').select('id', 'dek_id');
    const retiredIds = new Set(retired.map((r) => r.id));
    assert.ok(rows.every((r) => (retiredIds.has(r.id) ? r.dek_id === oldDek : r.dek_id !== oldDek)), 'the others moved to the new DEK');
    // The ones it moved still open: the healthy instance's key is sent as before.
    const refund = await invoke('stripe-ok', 'stripe_process_refund');
    assert.equal(refund.status, 200, refund.text);
    assert.equal(refund.body.type, 'success');
  });
});

import assert from 'node:assert/strict';
import { assertError, testDb, useStack, type Client } from './helpers/stack.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const STRIPES = 1000;
const GMAILS = 5;

// Provider lists show each instance's credentials, and one credential may be shared by any number of
// instances: the answer repeats it at each. Pages end at a weight that counts it at every appearance.
describe('provider lists of instances sharing a large credential', () => {
  const stack = useStack({ NODE_OPTIONS: '--max-old-space-size=256', RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
  let c: Client;
  const stripeIds: string[] = []; // newest first, the lists' order
  const gmailIds: string[] = [];

  // Instances are rows here (a thousand creations through the API would take most of the test's time);
  // their credentials come from the API, sealed as any.
  async function instances(prefix: string, provider: string, controller: string, fn: string, credentialId: string, n: number, status: (i: number) => string) {
    const db = testDb();
    const rows = Array.from({ length: n }, (_, i) => ({
      id: `${prefix}-${String(i).padStart(4, '0')}`, display_name: `${prefix} ${i}`, provider_controller_type_id: provider,
      credential_controller_type_id: controller, status: status(i), resource_server_credential_id: credentialId,
      created_at: new Date(Date.UTC(2026, 0, 1) + i * 1000),
    }));
    for (let i = 0; i < rows.length; i += 500) await db('provider_instances').insert(rows.slice(i, i + 500));
    const fns = rows.map((r) => ({ provider_instance_id: r.id, function_controller_type_id: fn, provider_controller_type_id: provider }));
    for (let i = 0; i < fns.length; i += 500) await db('function_instances').insert(fns.slice(i, i + 500));
    return rows.map((r) => r.id).reverse();
  }

  before(async () => {
    c = stack.client;
    // 400 kB of metadata: 4.8 MB counted at each instance, so a page holds two of them.
    const stripe = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: 'sk_test_shared' }, metadata: { note: 'm'.repeat(400_000) } });
    assert.equal(stripe.status, 201, stripe.text);
    stripeIds.push(...await instances('stripe', 'stripe', 'api_key', 'stripe_process_refund', stripe.body.id, STRIPES, (i) => (i % 200 === 0 ? 'disabled' : 'active')));
    const gmail = await c.post(`${avail('google_mail', 'oauth_auth_flow')}/credential/resource-server`, {
      value: { client_id: 'c', client_secret: 's', redirect_uri: 'https://app.example.com/cb', scopes: ['x'] }, metadata: { note: 'g'.repeat(400_000) },
    });
    assert.equal(gmail.status, 201, gmail.text);
    gmailIds.push(...await instances('gmail', 'google_mail', 'oauth_auth_flow', 'google_mail_send_email', gmail.body.id, GMAILS, () => 'brokering_initiated'));
  });

  it('GET /provider pages them two by two however large page_size is, each with its credential, and pages a filter through whole', async () => {
    const first = await c.get(`${B}/provider?page_size=1000&provider_controller_type_id=stripe`);
    assert.equal(first.status, 200, first.text.slice(0, 300));
    assert.deepEqual(first.body.items.map((i: any) => i.id), stripeIds.slice(0, 2));
    for (const item of first.body.items) assert.equal(item.resource_server_credential.metadata.note.length, 400_000);
    assert.ok(first.body.next_page_token);
    const second = await c.get(`${B}/provider?page_size=1000&provider_controller_type_id=stripe&next_page_token=${first.body.next_page_token}`);
    assert.equal(second.status, 200);
    assert.deepEqual(second.body.items.map((i: any) => i.id), stripeIds.slice(2, 4));

    // The disabled ones: five, every one once, in order.
    const disabled: string[] = [];
    let token: string | undefined;
    do {
      const page = await c.get(`${B}/provider?page_size=1000&status=disabled${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(page.status, 200, page.text.slice(0, 300));
      assert.ok(page.body.items.length <= 2);
      disabled.push(...page.body.items.map((i: any) => i.id));
      token = page.body.next_page_token;
    } while (token);
    assert.deepEqual(disabled, stripeIds.filter((id) => Number(id.slice(-4)) % 200 === 0));
  });

  it('GET /provider/grouped-by-function goes on with a function on the next page, and pages one through whole', async () => {
    const first = await c.get(`${B}/provider/grouped-by-function?page_size=50`);
    assert.equal(first.status, 200, first.text.slice(0, 300));
    const types = first.body.items.map((g: any) => g.function_controller.type_id);
    // The five gmail instances weigh 24 MB: the page ends within them, before the stripe function.
    assert.deepEqual(types, ['google_mail_send_email']);
    assert.deepEqual(first.body.items[0].provider_instances.map((p: any) => p.provider_instance.id), gmailIds.slice(0, 2));
    assert.equal(first.body.items[0].provider_instances[0].resource_server_credential.metadata.note.length, 400_000);
    assert.ok(first.body.next_page_token);
    const seen: string[] = [];
    let token: string | undefined;
    const pages: string[][] = [];
    do {
      const page = await c.get(`${B}/provider/grouped-by-function?page_size=50&function_category=email${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(page.status, 200, page.text.slice(0, 300));
      assert.deepEqual(page.body.items.map((g: any) => g.function_controller.type_id), ['google_mail_send_email']);
      pages.push(page.body.items[0].provider_instances.map((p: any) => p.provider_instance.id));
      seen.push(...pages[pages.length - 1]);
      token = page.body.next_page_token;
      // A token from within a function belongs to its list and filters.
      if (token) assertError(await c.get(`${B}/provider/grouped-by-function?page_size=50&next_page_token=${token}`), 400, 'invalid_request');
    } while (token);
    assert.deepEqual(pages.map((p) => p.length), [2, 2, 1]);
    assert.deepEqual(seen, gmailIds);

    // The stripe function's thousand instances, two a page, from a page that starts within it.
    const stripe = await c.get(`${B}/provider/grouped-by-function?page_size=50&provider_controller_type_id=stripe`);
    assert.deepEqual(stripe.body.items.map((g: any) => g.provider_instances.length), [2]);
    const next = await c.get(`${B}/provider/grouped-by-function?page_size=50&provider_controller_type_id=stripe&next_page_token=${stripe.body.next_page_token}`);
    assert.deepEqual(next.body.items[0].provider_instances.map((p: any) => p.provider_instance.id), stripeIds.slice(2, 4));
  });
});

import assert from 'node:assert/strict';
import { ADMIN_KEY, resetDb, startStack, type Stack } from './helpers/stack.ts';

const basic = (password: string) => `Basic ${Buffer.from(`ops:${password}`).toString('base64')}`;

describe('queue dashboard at /admin/queues', () => {
  let stack: Stack;
  before(async () => {
    await resetDb();
    stack = await startStack({}, { workers: 0 });
  });
  after(async () => stack?.stop());

  it('asks browsers for basic auth and refuses keys without scope admin', async () => {
    const anon = await fetch(`${stack.api.url}/admin/queues`);
    assert.equal(anon.status, 401);
    assert.match(anon.headers.get('www-authenticate') ?? '', /^Basic realm=/);
    assert.deepEqual(await anon.json(), { message: 'The queue dashboard needs an admin API key as the basic-auth password', data: { code: 'unauthenticated' } });
    const reader = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['internal'] });
    const denied = await fetch(`${stack.api.url}/admin/queues`, { headers: { authorization: basic(reader.body.key) } });
    assert.equal(denied.status, 403);
    const wrong = await fetch(`${stack.api.url}/admin/queues`, { headers: { authorization: basic('not-a-key') } });
    assert.equal(wrong.status, 401);
  });

  it('serves the dashboard and its queue API to an admin key', async () => {
    const page = await fetch(`${stack.api.url}/admin/queues`, { headers: { authorization: basic(ADMIN_KEY) } });
    assert.equal(page.status, 200);
    assert.match(await page.text(), /<html/i);
    const api = await fetch(`${stack.api.url}/admin/queues/api/queues`, { headers: { authorization: basic(ADMIN_KEY) } });
    assert.equal(api.status, 200);
    const body = await api.json() as { queues: { name: string }[] };
    assert.deepEqual(body.queues.map((q) => q.name).sort(), ['agent-tasks', 'credential-refresh', 'key-jobs', 'push-notifications']);
  });

  it('answers 400 to a dashboard request whose JSON does not parse', async () => {
    const r = await fetch(`${stack.api.url}/admin/queues/api/queues/agent-tasks/add`, { method: 'POST', headers: { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' }, body: '{' });
    assert.equal(r.status, 400, await r.clone().text());
    assert.equal(((await r.json()) as { data: { code: string } }).data.code, 'invalid_request');
  });
});

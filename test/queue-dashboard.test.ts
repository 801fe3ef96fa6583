import assert from 'node:assert/strict';
import { ADMIN_KEY, useStack, waitFor, withQueue } from './helpers/stack.ts';
import { behindServiceProxy } from './helpers/black-hole-proxy.ts';
import { assertPerSecondLimit } from './helpers/rate-limit.ts';

const PUBLIC_URL = 'https://taskbridge.example';
const basic = (password: string) => `Basic ${Buffer.from(`ops:${password}`).toString('base64')}`;

describe('queue dashboard at /admin/queues', () => {
  const stack = useStack({ PUBLIC_URL }, { workers: 0 });

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
    // Its routes are named in full where the API's are: /metrics labels and the request log.
    const metrics = await stack.client.get('/metrics');
    assert.match(metrics.text, /taskbridge_http_request_duration_seconds_count\{method="GET",route="\/admin\/queues\/api\/queues",status="200"\} 1/);
    assert.doesNotMatch(metrics.text, /route="\/api\/queues/);
  });

  it('refuses changes that another site could make a browser send (a form, a foreign origin), and takes them from its own pages', async () => {
    const add = `${stack.api.url}/admin/queues/api/queues/credential-refresh/add`;
    const waiting = async () => (await stack.client.get('/_internal/v1/queues')).body.queues['credential-refresh'].waiting as number;
    const before = await waiting();
    const auth = { authorization: basic(ADMIN_KEY) };
    const refused: [string, RequestInit][] = [
      ['a form post', { method: 'POST', headers: { ...auth, 'content-type': 'application/x-www-form-urlencoded' }, body: 'name=refresh&data[credential_id]=x' }],
      ['a text/plain post', { method: 'POST', headers: { ...auth, 'content-type': 'text/plain' }, body: '{"name":"refresh","data":{}}' }],
      ['JSON from another origin', { method: 'POST', headers: { ...auth, 'content-type': 'application/json', origin: 'https://evil.example' }, body: '{"name":"refresh","data":{}}' }],
      ['a cross-site fetch without a body', { method: 'PUT', headers: { ...auth, 'sec-fetch-site': 'cross-site' } }],
    ];
    for (const [what, init] of refused) {
      const url = init.method === 'PUT' ? `${stack.api.url}/admin/queues/api/queues/credential-refresh/pause` : add;
      const r = await fetch(url, init);
      assert.equal(r.status, 403, what);
      assert.match(((await r.json()) as { message: string }).message, /takes changes only from its own pages/, what);
    }
    assert.equal(await waiting(), before);
    const ok = await fetch(add, { method: 'POST', headers: { ...auth, 'content-type': 'application/json', origin: stack.api.url, 'sec-fetch-site': 'same-origin' }, body: '{"name":"refresh","data":{"credential_id":"00000000-0000-4000-8000-000000000000"}}' });
    assert.equal(ok.status, 200, await ok.clone().text());
    assert.equal(await waiting(), before + 1);
    // Behind a proxy that rewrites Host: the browser's Sec-Fetch-Site, or an Origin of PUBLIC_URL, says it is the dashboard's own page.
    const job = '{"name":"refresh","data":{"credential_id":"00000000-0000-4000-8000-000000000001"}}';
    const proxied = { ...auth, 'content-type': 'application/json', host: 'internal-name:3000' };
    assert.equal((await fetch(add, { method: 'POST', headers: { ...proxied, origin: 'https://queues.example', 'sec-fetch-site': 'same-origin' }, body: job })).status, 200);
    assert.equal((await fetch(add, { method: 'POST', headers: { ...proxied, origin: PUBLIC_URL }, body: job })).status, 200);
    assert.equal(await waiting(), before + 3);
  });

  it('answers 400 to a dashboard request whose JSON does not parse', async () => {
    const r = await fetch(`${stack.api.url}/admin/queues/api/queues/agent-tasks/add`, { method: 'POST', headers: { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' }, body: '{' });
    assert.equal(r.status, 400, await r.clone().text());
    assert.equal(((await r.json()) as { data: { code: string } }).data.code, 'invalid_request');
    // A value sent unquoted is not quoted back (V8's parse message holds some 20 characters around it).
    const quoted = await fetch(`${stack.api.url}/admin/queues/api/queues/agent-tasks/add`, { method: 'POST', headers: { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' }, body: '{"name":"x","data":{"api_key":sk-live-dashboard-9f2}}' });
    assert.equal(quoted.status, 400);
    const text = await quoted.text();
    assert.ok(!text.includes('sk-live') && !text.includes('dashboard-9f2'), text);
    assert.match(text, /Unexpected token/);
  });

  it('answers 400 naming the problem, not 500, to a job the API would refuse (nested too deep, a NUL) or BullMQ does (a float priority), adding nothing', async () => {
    const add = `${stack.api.url}/admin/queues/api/queues/credential-refresh/add`;
    const waiting = async () => (await stack.client.get('/_internal/v1/queues')).body.queues['credential-refresh'].waiting as number;
    const before = await waiting();
    const post = (body: string) => fetch(add, { method: 'POST', headers: { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' }, body });
    const cases: [string, string][] = [
      [`{"name":"refresh","data":${'['.repeat(5000)}${']'.repeat(5000)}}`, `Invalid body: body.data${'.0'.repeat(63)} nests deeper than 64 levels`],
      ['{"name":"refresh","data":{"credential_id":"a\\u0000b"}}', 'Invalid body: body.data.credential_id contains a NUL character or an unpaired surrogate'],
      ['{"name":"refresh","data":{"credential_id":"00000000-0000-4000-8000-000000000002"},"options":{"priority":1.5}}', 'Invalid body: body.options.priority must be integer'],
    ];
    for (const [body, message] of cases) {
      const r = await post(body);
      assert.equal(r.status, 400, await r.clone().text());
      const refusal = (await r.json()) as { message: string; data: { code: string } };
      assert.equal(refusal.message, message);
      assert.equal(refusal.data.code, 'invalid_request');
    }
    assert.equal(await waiting(), before);
    assert.ok(!stack.api.logs.some((l) => l.includes('"level":50')), 'nothing logged at error');
  });

  it('answers 400 to a job whose data is not what its queue\'s worker reads, or whose id BullMQ refuses (added or edited, however its path is spelled), queueing and changing nothing', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const waiting = async () => (await stack.client.get('/_internal/v1/queues')).body.queues['agent-tasks'].waiting as number;
    const before = await waiting();
    const cases: [string, string][] = [
      ['{"name":"run","data":null}', 'Invalid body: body.data must be object'],
      ['{"name":"run"}', 'Invalid body: body.data is required'],
      ['{"name":"run","data":{"task_id":"x","message_id":"00000000-0000-4000-8000-000000000000"}}', 'Invalid body: body.data.task_id must be a UUID'],
      ['{"name":"run","data":{"task_id":"00000000-0000-4000-8000-000000000000"}}', 'Invalid body: body.data.message_id is required'],
    ];
    const withJobId = (jobId: unknown) => JSON.stringify({ name: 'run', data: { task_id: '00000000-0000-4000-8000-000000000000', message_id: '00000000-0000-4000-8000-000000000001' }, options: { jobId } });
    cases.push(
      [withJobId(5), 'Invalid body: body.options.jobId must be string'],
      [withJobId('0'), "Invalid body: body.options.jobId must be a job id: not an integer or NaN, and without ':'"],
      [withJobId('0:x'), "Invalid body: body.options.jobId must be a job id: not an integer or NaN, and without ':'"],
      [withJobId('1:2'), "Invalid body: body.options.jobId must be a job id: not an integer or NaN, and without ':'"],
    );
    // Each as bull-board's router would take it too: the queue name encoded, the path in capitals, a trailing slash.
    for (const [body, message] of cases) for (const add of ['agent-tasks/add', 'agent%2Dtasks/add', 'agent-tasks/ADD', 'agent-tasks/add/']) {
      const r = await fetch(`${queues}/${add}`, { method: 'POST', headers, body });
      assert.equal(r.status, 400, await r.clone().text());
      assert.equal(((await r.json()) as { message: string }).message, message);
    }
    assert.equal(await waiting(), before);

    const data = { task_id: '00000000-0000-4000-8000-000000000000', message_id: '00000000-0000-4000-8000-000000000001' };
    const added = await fetch(`${queues}/agent-tasks/add`, { method: 'POST', headers, body: JSON.stringify({ name: 'run', data }) });
    assert.equal(added.status, 200, await added.clone().text());
    const { job } = (await added.json()) as { job: { id: string } };
    const edit = await fetch(`${queues}/agent-tasks/${job.id}/UPDATE-DATA`, { method: 'PATCH', headers, body: '{"jobData":{"task_id":7,"message_id":"00000000-0000-4000-8000-000000000001"}}' });
    assert.equal(edit.status, 400, await edit.clone().text());
    assert.match(((await edit.json()) as { message: string }).message, /^Invalid body: body\.jobData\.task_id must be string/);
    assert.deepEqual(await withQueue(stack.env, 'agent-tasks', async (q) => (await q.getJob(job.id))?.data), data, 'the job\'s data unchanged');
    // The dashboard's add form shows what a job of the queue holds.
    const schema = await fetch(`${queues}/agent-tasks/job-data-schema`, { headers: { authorization: basic(ADMIN_KEY) } });
    assert.deepEqual(((await schema.json()) as { required: string[] }).required, ['task_id', 'message_id']);
    await withQueue(stack.env, 'agent-tasks', (q) => q.remove(job.id));
  });

  it('answers 400 naming the option to job options an operator would not set by hand, or set out of bounds, queueing nothing; takes the add form\'s and its duplicate\'s', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const jobs = () => withQueue(stack.env, 'agent-tasks', async (q) => Object.values(await q.getJobCounts()).reduce((a, b) => a + b, 0));
    const before = await jobs();
    const data = { task_id: '00000000-0000-4000-8000-000000000000', message_id: '00000000-0000-4000-8000-000000000001' };
    const add = (options: unknown) => fetch(`${queues}/agent-tasks/add`, { method: 'POST', headers, body: JSON.stringify({ name: 'run', data, options }) });
    const jobId = "must be a job id: not an integer or NaN, and without ':'";
    const cases: [Record<string, unknown>, string][] = [
      [{ delay: 1e308 }, 'body.options.delay must be <= 31536000000'],
      [{ delay: -1 }, 'body.options.delay must be >= 0'],
      [{ priority: 1.5 }, 'body.options.priority must be integer'],
      [{ priority: 2097152 }, 'body.options.priority must be <= 2097151'],
      [{ attempts: 0 }, 'body.options.attempts must be >= 1'],
      [{ attempts: 1e9 }, 'body.options.attempts must be <= 100'],
      [{ lifo: 'yes' }, 'body.options.lifo must be boolean'],
      [{ backoff: { type: 'linear', delay: 1000 } }, 'body.options.backoff.type must be one of capped-exponential, exponential, fixed'],
      [{ backoff: { type: 'fixed', delay: 1e308 } }, 'body.options.backoff.delay must be <= 2147483647'],
      [{ backoff: { type: 'fixed', delay: 1000, jitter: 2 } }, 'body.options.backoff.jitter is not an allowed member'],
      [{ backoff: 1000 }, 'body.options.backoff must be object'],
      [{ removeOnComplete: { count: -1 } }, 'body.options.removeOnComplete.count must be >= 0'],
      [{ removeOnComplete: { age: 1e308 } }, 'body.options.removeOnComplete.age must be <= 31536000'],
      [{ removeOnFail: 'yes' }, 'body.options.removeOnFail must be boolean or object'],
      [{ removeOnFail: { limit: 5 } }, 'body.options.removeOnFail.limit is not an allowed member'],
      // BullMQ refuses an id that reads as an integer (or NaN) as it adds the job.
      [{ jobId: '12' }, `body.options.jobId ${jobId}`],
      [{ jobId: '-3' }, `body.options.jobId ${jobId}`],
      [{ jobId: 'NaN' }, `body.options.jobId ${jobId}`],
    ];
    const refused: Record<string, unknown> = {
      parent: { id: 'x', queue: 'bull:agent-tasks' }, repeat: { every: 1000 }, timestamp: 0, stackTraceLimit: 0, keepLogs: 1e308, sizeLimit: 1,
      deduplication: { id: 'x' }, prevMillis: 1, repeatJobKey: 'x', failParentOnFailure: true, removeDependencyOnFailure: true, debounce: { id: 'x' }, telemetry: { omitContext: true },
    };
    for (const [name, value] of Object.entries(refused)) cases.push([{ [name]: value }, `body.options.${name} is not an allowed member`]);
    for (const [options, message] of cases) {
      const r = await add(options);
      assert.equal(r.status, 400, `${JSON.stringify(options)}: ${await r.clone().text()}`);
      const refusal = (await r.json()) as { message: string; data: { code: string } };
      assert.equal(refusal.message, `Invalid body: ${message}`, JSON.stringify(options));
      assert.equal(refusal.data.code, 'invalid_request');
    }
    assert.equal(await jobs(), before, 'nothing queued');

    // The form's own bodies: its empty options field, and a duplicate of a job (its options as the
    // dashboard shows them: the queue's defaults), an operator's choices added.
    const plain = await add({});
    assert.equal(plain.status, 200, await plain.clone().text());
    const { job } = (await plain.json()) as { job: { id: string } };
    const shown = (await (await fetch(`${queues}/agent-tasks/${job.id}`, { headers })).json()) as { job: { opts: Record<string, unknown> } };
    assert.deepEqual(Object.keys(shown.job.opts).sort(), ['attempts', 'backoff', 'removeOnComplete', 'removeOnFail']);
    const duplicate = await add({ ...shown.job.opts, jobId: 'by-hand-1', delay: 31_536_000_000, priority: 2_097_151, lifo: true });
    assert.equal(duplicate.status, 200, await duplicate.clone().text());
    const taken = await add({ attempts: 100, backoff: { type: 'fixed', delay: 2_147_483_647 }, removeOnComplete: true, removeOnFail: { count: 0 }, jobId: '007x' });
    assert.equal(taken.status, 200, await taken.clone().text());
    assert.equal(await jobs(), before + 3);
    await withQueue(stack.env, 'agent-tasks', async (q) => { for (const id of [job.id, 'by-hand-1', '007x']) await q.remove(id); });
  });

  it('answers 400 to a global concurrency or rate limit that makes no sense (however its path is spelled), keeping the one Redis holds', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const held = () => withQueue(stack.env, 'key-jobs', async (q) => [await q.getGlobalConcurrency(), await q.getGlobalRateLimit()]);
    await withQueue(stack.env, 'key-jobs', async (q) => { await q.setGlobalConcurrency(7); await q.setGlobalRateLimit(5, 1000); });
    const cases: [string, string, string][] = [
      ['concurrency', '{"concurrency":1e308}', 'Invalid body: body.concurrency must be <= 100000'],
      ['concurrency', '{"concurrency":-1}', 'Invalid body: body.concurrency must be >= 0'],
      ['concurrency', '{"concurrency":2.5}', 'Invalid body: body.concurrency must be integer'],
      ['concurrency', '{"concurrency":"NaN"}', 'Invalid body: body.concurrency must be integer'],
      ['concurrency', '{}', 'Invalid body: body.concurrency is required'],
      ['rate-limit', '{"max":5,"duration":1e308}', 'Invalid body: body.duration must be <= 86400000'],
      ['rate-limit', '{"max":1e308,"duration":1000}', 'Invalid body: body.max must be <= 1000000 or null'],
      ['rate-limit', '{"max":0,"duration":1000}', 'Invalid body: body.max must be >= 1 or null'],
      ['rate-limit', '{"max":5,"duration":-1}', 'Invalid body: body.duration must be >= 1'],
      ['rate-limit', '{"max":5,"duration":0.5}', 'Invalid body: body.duration must be integer'],
      ['rate-limit', '{"max":"NaN","duration":1000}', 'Invalid body: body.max must be integer or null'],
      ['rate-limit', '{"max":5}', 'Invalid body: body.duration is required'],
      ['rate-limit', '{"duration":1000}', 'Invalid body: body must have property max when property duration is present'],
    ];
    for (const [setting, body, message] of cases) for (const path of [`key-jobs/${setting}`, `key%2Djobs/${setting}`, `key-jobs/${setting.toUpperCase()}/`]) {
      const r = await fetch(`${queues}/${path}`, { method: 'PUT', headers, body });
      assert.equal(r.status, 400, `${path} ${body}: ${await r.clone().text()}`);
      const refusal = (await r.json()) as { message: string; data: { code: string } };
      assert.equal(refusal.message, message, `${path} ${body}`);
      assert.equal(refusal.data.code, 'invalid_request');
    }
    assert.deepEqual(await held(), [7, { max: 5, duration: 1000 }], 'the settings Redis held before');
    // Sensible ones are taken; 0 (the form's empty field) removes the concurrency limit, {} the rate limit.
    const put = (setting: string, body: string) => fetch(`${queues}/key-jobs/${setting}`, { method: 'PUT', headers, body });
    assert.equal((await put('concurrency', '{"concurrency":100000}')).status, 200);
    assert.equal((await put('rate-limit', '{"max":1000000,"duration":86400000}')).status, 200);
    assert.deepEqual(await held(), [100000, { max: 1000000, duration: 86400000 }]);
    assert.equal((await put('concurrency', '{"concurrency":0}')).status, 200);
    assert.equal((await put('rate-limit', '{}')).status, 200);
    assert.deepEqual(await held(), [null, null]);
  });

  it('answers 400 to a delayed job\'s new run time that makes no sense (however its path is spelled), the job left as it was', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const job = await withQueue(stack.env, 'key-jobs', (q) => q.add('run', { job_id: '00000000-0000-4000-8000-000000000000' }, { delay: 60_000 }));
    const held = () => withQueue(stack.env, 'key-jobs', async (q) => { const j = await q.getJob(job.id!); return [await j?.getState(), j?.delay]; });
    const cases: [string, string][] = [
      ['{"runAt":1e308}', 'Invalid body: body.runAt must be <= 253402300799999'],
      ['{"runAt":-1}', 'Invalid body: body.runAt must be >= 0'],
      [`{"runAt":${Date.now() + 0.5}}`, 'Invalid body: body.runAt must be integer'],
      ['{"runAt":"NaN"}', 'Invalid body: body.runAt must be integer'],
      ['{}', 'Invalid body: body.runAt is required'],
    ];
    for (const [body, message] of cases) for (const path of [`key-jobs/${job.id}/delay`, `key%2Djobs/${job.id}/delay`, `key-jobs/${job.id}/DELAY/`]) {
      const r = await fetch(`${queues}/${path}`, { method: 'PATCH', headers, body });
      assert.equal(r.status, 400, `${path} ${body}: ${await r.clone().text()}`);
      const refusal = (await r.json()) as { message: string; data: { code: string } };
      assert.equal(refusal.message, message, `${path} ${body}`);
      assert.equal(refusal.data.code, 'invalid_request');
    }
    assert.deepEqual(await held(), ['delayed', 60_000], 'the job as it was');
    const later = await fetch(`${queues}/key-jobs/${job.id}/delay`, { method: 'PATCH', headers, body: JSON.stringify({ runAt: Date.now() + 3_600_000 }) });
    assert.equal(later.status, 200, await later.clone().text());
    const [state, delay] = await held();
    assert.equal(state, 'delayed');
    assert.ok((delay as number) > 3_500_000, String(delay));
    await withQueue(stack.env, 'key-jobs', (q) => q.remove(job.id!));
  });
  it('answers 400 to a job\'s new priority that makes no sense, the job left as it was', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const job = await withQueue(stack.env, 'key-jobs', (q) => q.add('run', { job_id: '00000000-0000-4000-8000-000000000001' }, { delay: 60_000, priority: 5 }));
    const priority = () => withQueue(stack.env, 'key-jobs', async (q) => (await q.getJob(job.id!))?.priority);
    // BullMQ took these as sent: 1e308 and 2.5 were stored as the job's priority.
    for (const [body, message] of [['{"priority":1e308}', 'Invalid body: body.priority must be <= 2097151'], ['{"priority":2.5}', 'Invalid body: body.priority must be integer'],
      ['{"priority":-1}', 'Invalid body: body.priority must be >= 0'], ['{}', 'Invalid body: body.priority is required']]) {
      const r = await fetch(`${queues}/key-jobs/${job.id}/priority`, { method: 'PATCH', headers, body });
      assert.equal(r.status, 400, `${body}: ${await r.clone().text()}`);
      assert.equal(((await r.json()) as { message: string }).message, message);
    }
    assert.equal(await priority(), 5, 'the job as it was');
    const changed = await fetch(`${queues}/key-jobs/${job.id}/priority`, { method: 'PATCH', headers, body: '{"priority":7}' });
    assert.equal(changed.status, 200, await changed.clone().text());
    assert.equal(await priority(), 7);
    await withQueue(stack.env, 'key-jobs', (q) => q.remove(job.id!));
  });

  it('leaves a job scheduler named delay or update-data to bull-board\'s scheduler edit, not held to the job edits\' bodies', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const template = { name: 'run', data: { job_id: '00000000-0000-4000-8000-000000000000' } };
    const every = (id: string) => withQueue(stack.env, 'key-jobs', async (q) => (await q.getJobScheduler(id))?.every);
    await withQueue(stack.env, 'key-jobs', async (q) => { for (const id of ['delay', 'update-data']) await q.upsertJobScheduler(id, { every: 3_600_000 }, template); });
    try {
      for (const [path, ms] of [['job-schedulers/delay', 7_200_000], ['JOB-SCHEDULERS/update-data', 10_800_000]] as const) {
        const r = await fetch(`${queues}/key-jobs/${path}`, { method: 'PATCH', headers, body: JSON.stringify({ every: ms }) });
        assert.equal(r.status, 204, `${path}: ${await r.clone().text()}`);
      }
      assert.deepEqual([await every('delay'), await every('update-data')], [7_200_000, 10_800_000]);
    } finally {
      await withQueue(stack.env, 'key-jobs', async (q) => { for (const id of ['delay', 'update-data']) await q.removeJobScheduler(id); });
    }
  });

  it('answers 400 to a job scheduler edit that makes no sense (however its path is spelled), the scheduler left as it was', async () => {
    const headers = { authorization: basic(ADMIN_KEY), 'content-type': 'application/json' };
    const queues = `${stack.api.url}/admin/queues/api/queues`;
    const template = { name: 'run', data: { job_id: '00000000-0000-4000-8000-000000000000' }, opts: { attempts: 3 } };
    const held = () => withQueue(stack.env, 'key-jobs', async (q) => {
      const s = await q.getJobScheduler('nightly');
      return s && { pattern: s.pattern, every: s.every, tz: s.tz, limit: s.limit, endDate: s.endDate, data: s.template?.data, attempts: s.template?.opts?.attempts };
    });
    await withQueue(stack.env, 'key-jobs', (q) => q.upsertJobScheduler('nightly', { pattern: '0 3 * * *', tz: 'Europe/Warsaw' }, template));
    const before = await held();
    try {
      // BullMQ stored the first of each as sent (an interval of 1e308 ms, a limit of 1e308, an end
      // date it reads as NaN, a time zone for an interval, a pattern of 10,000 characters).
      const cases: [string, string][] = [
        ['{"every":1e308}', 'Invalid body: body.every must be <= 31536000000'],
        ['{"every":999}', 'Invalid body: body.every must be >= 1000'],
        ['{"every":1500.5}', 'Invalid body: body.every must be integer'],
        ['{"every":"60000"}', 'Invalid body: body.every must be integer'],
        ['{"pattern":"0 3 * * *","limit":1e308}', 'Invalid body: body.limit must be <= 1000000000 or null'],
        ['{"pattern":"0 3 * * *","limit":0}', 'Invalid body: body.limit must be >= 1 or null'],
        ['{"pattern":"0 3 * * *","limit":2.5}', 'Invalid body: body.limit must be integer or null'],
        ['{"pattern":"0 3 * * *","endDate":1e308}', 'Invalid body: body.endDate must be <= 253402300799999 or null'],
        ['{"pattern":"0 3 * * *","endDate":"tomorrow"}', 'Invalid body: body.endDate must be integer or null'],
        [JSON.stringify({ pattern: `0 3 * * ${'1,'.repeat(5000)}2` }), 'Invalid body: body.pattern must NOT have more than 128 characters'],
        ['{"pattern":"DROP TABLE"}', 'Invalid body: body.pattern must be a cron pattern: 5 or 6 fields (digits, letters, * , - / ? # ) or an @ alias such as @daily'],
        ['{"pattern":"0 3 * * *","tz":"Not/AZone"}', 'Invalid body: body.tz must be a time zone name such as Europe/Warsaw or UTC'],
        [JSON.stringify({ pattern: '0 3 * * *', tz: 'Europe/'.repeat(20) }), 'Invalid body: body.tz must NOT have more than 64 characters'],
        ['{"every":60000,"tz":"UTC"}', 'Invalid body: body must have property pattern when property tz is present'],
        ['{}', 'Invalid body: body must have exactly one of pattern or every'],
        ['{"pattern":"0 3 * * *","every":60000}', 'Invalid body: body must have exactly one of pattern or every'],
        ['{"every":60000,"immediately":true}', 'Invalid body: body.immediately is not an allowed member'],
        ['{"every":60000,"template":{"data":{"job_id":"x"},"opts":{"delay":1e308}}}', 'Invalid body: body.template is not an allowed member'],
      ];
      for (const [body, message] of cases) for (const path of ['key-jobs/job-schedulers/nightly', 'key%2Djobs/job-schedulers/nightly', 'key-jobs/JOB-SCHEDULERS/nightly/']) {
        const r = await fetch(`${queues}/${path}`, { method: 'PATCH', headers, body });
        assert.equal(r.status, 400, `${path} ${body}: ${await r.clone().text()}`);
        const refusal = (await r.json()) as { message: string; data: { code: string } };
        assert.equal(refusal.message, message, `${path} ${body.slice(0, 80)}`);
        assert.equal(refusal.data.code, 'invalid_request');
      }
      assert.deepEqual(await held(), before, 'the scheduler as it was');
      // The form's bodies: a cron pattern with its time zone, limit and end date; an interval alone.
      const endDate = Date.now() + 30 * 86_400_000;
      const edit = (body: object) => fetch(`${queues}/key-jobs/job-schedulers/nightly`, { method: 'PATCH', headers, body: JSON.stringify(body) });
      const cron = await edit({ pattern: '30 4 * * 1-5', tz: 'America/New_York', limit: 1_000_000_000, endDate });
      assert.equal(cron.status, 204, await cron.clone().text());
      assert.deepEqual(await held(), { ...before, pattern: '30 4 * * 1-5', tz: 'America/New_York', limit: 1_000_000_000, endDate });
      const interval = await edit({ every: 31_536_000_000 });
      assert.equal(interval.status, 204, await interval.clone().text());
      assert.deepEqual(await held(), { ...before, pattern: undefined, tz: undefined, every: 31_536_000_000 });
    } finally {
      await withQueue(stack.env, 'key-jobs', (q) => q.removeJobScheduler('nightly'));
    }
  });
});

describe('queue dashboard and RATE_LIMIT_PER_SECOND', () => {
  const stack = useStack({ RATE_LIMIT_PER_SECOND: '3' }, { workers: 0 });

  it("counts the dashboard's requests against the key's limit: past it 429 rate_limited with Retry-After, as on the API", async () => {
    const burst = 20;
    const from = Date.now();
    const results = await Promise.all(Array.from({ length: burst }, () => fetch(`${stack.api.url}/admin/queues/api/queues`, { headers: { authorization: basic(ADMIN_KEY) } })));
    const limited = results.filter((r) => r.status === 429);
    const served = results.filter((r) => r.status === 200).length;
    assertPerSecondLimit(from, served, burst, 3);
    assert.equal(served + limited.length, burst, results.map((r) => r.status).join(','));
    for (const r of limited) {
      assert.match(r.headers.get('retry-after') ?? '', /^[1-9]\d*$/);
      const body = await r.json() as { message: string; data: { code: string } };
      assert.equal(body.data.code, 'rate_limited');
      assert.match(body.message, /^Too many requests for this API key; retry in \d+ s$/);
    }
  });
});

describe('queue dashboard while Redis is out of reach', () => {
  const own = behindServiceProxy('REDIS_URL', { DB_QUERY_TIMEOUT_MS: '2000' });

  it('answers 503 unavailable with Retry-After, logged at warn, as the API does (silent past DB_QUERY_TIMEOUT_MS, or resetting connections)', async () => {
    const queues = () => fetch(`${own.stack.api.url}/admin/queues/api/queues`, { headers: { authorization: basic(ADMIN_KEY) } });
    assert.equal((await queues()).status, 200);
    const ids: string[] = [];
    try {
      for (const cut of [() => own.proxy.swallow(), () => own.proxy.reset()]) {
        cut();
        const r = await queues();
        assert.equal(r.status, 503, await r.clone().text());
        assert.equal(r.headers.get('retry-after'), '5');
        assert.equal(((await r.json()) as { data: { code: string } }).data.code, 'unavailable');
        ids.push(r.headers.get('x-request-id')!);
        own.proxy.forward();
      }
      for (const id of ids) await waitFor(async () => own.stack.api.logs.some((l) => l.includes(`"req_id":"${id}"`) && l.includes('"level":40') && l.includes('request failed: unavailable')), `the warn line of ${id}`);
      // The silent Redis's line names it ("Command timed out" is ioredis's words).
      assert.ok(own.stack.api.logs.some((l) => l.includes(`"req_id":"${ids[0]}"`) && l.includes('"service":"redis"')), own.stack.api.logs.filter((l) => l.includes(ids[0])).join('\n'));
    } finally {
      own.proxy.forward();
    }
  });
});

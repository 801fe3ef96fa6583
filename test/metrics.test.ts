import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import path from 'node:path';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { registerWorkerMetrics, WorkerMetrics } from '../queues/worker-metrics.ts';
import { freePort, startRedis, type LocalService } from '../scripts/local-services.ts';
import { startOwnPostgres, type OwnPostgres } from './helpers/own-postgres.ts';
import { ADMIN_KEY, requestLogsThrough, requireEnv, startStack, startWorker, textMessage, useStack, waitFor, withQueue, type Stack } from './helpers/stack.ts';

const LOADED_AT = Date.now();

// The value of one sample (labels written as in the exposition), or undefined when it is absent.
const sample = (text: string, name: string, labels = '') => {
  const m = new RegExp(`^${name}${labels ? `\\{${labels}\\}` : ''} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
};

describe('GET /metrics', () => {
  const stack = useStack({}, { workers: 0 });

  it('needs a key with scope internal', async () => {
    assert.equal((await stack.client.as(undefined).get('/metrics')).status, 401);
    const key = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read'] });
    assert.equal((await stack.client.as(key.body.key).get('/metrics')).status, 403);
  });

  it('reports request latency by route pattern and status, queue depths and the outbox backlog', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('count me') });
    assert.equal(created.status, 201);
    assert.equal((await stack.client.get('/api/task/v1/00000000-0000-4000-8000-000000000000')).status, 404);
    const res = await stack.client.get('/metrics');
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain/);
    assert.match(res.text, /taskbridge_http_request_duration_seconds_count\{method="POST",route="\/api\/task\/v1",status="201"\} 1/);
    assert.match(res.text, /taskbridge_http_request_duration_seconds_count\{method="GET",route="\/api\/task\/v1\/:task_id",status="404"\} 1/);
    // No worker runs here, so the created task's job waits in the queue.
    assert.match(res.text, /taskbridge_queue_jobs\{queue="agent-tasks",state="waiting"\} 1/);
    assert.match(res.text, /taskbridge_outbox_pending 0/);
    assert.match(res.text, /^taskbridge_outbox_oldest_seconds 0$/m);
  });

  it('reports which queues are paused', async () => {
    const paused = (text: string, queue: string) => new RegExp(`^taskbridge_queue_paused\\{queue="${queue}"\\} (\\d)$`, 'm').exec(text)?.[1];
    await withQueue(stack.env, 'credential-refresh', async (queue) => {
      await queue.pause();
      try {
        const res = await stack.client.get('/metrics');
        assert.equal(paused(res.text, 'credential-refresh'), '1', res.text);
        assert.equal(paused(res.text, 'agent-tasks'), '0');
      } finally {
        await queue.resume();
      }
    });
    assert.equal(paused((await stack.client.get('/metrics')).text, 'credential-refresh'), '0');
  });

  it('counts a job given a priority from the queue dashboard as waiting, in the depths and the backlog age', async () => {
    await withQueue(stack.env, 'push-notifications', async (queue) => {
      const job = await queue.add('deliver', { task_id: randomUUID(), config_id: randomUUID(), timeline_seq: 1 });
      try {
        // BullMQ moves a job with a priority from its wait list to a set of its own (prioritized).
        const bumped = await fetch(`${stack.api.url}/admin/queues/api/queues/push-notifications/${job.id}/priority`, {
          method: 'PATCH', headers: { authorization: `Basic ${Buffer.from(`ops:${ADMIN_KEY}`).toString('base64')}`, 'content-type': 'application/json' }, body: '{"priority":1}',
        });
        assert.equal(bumped.status, 200, await bumped.text());
        assert.equal(await job.getState(), 'prioritized');
        await new Promise((resolve) => setTimeout(resolve, 50));
        const text = (await stack.client.get('/metrics')).text;
        assert.equal(sample(text, 'taskbridge_queue_jobs', 'queue="push-notifications",state="waiting"'), 1, text);
        assert.ok(sample(text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="push-notifications"')! > 0, text);
        const stats = (await stack.client.get('/_internal/v1/queues')).body.queues['push-notifications'];
        assert.equal(stats.waiting, 1);
        assert.ok(stats.oldest_waiting_age_ms > 0, JSON.stringify(stats));
      } finally {
        await job.remove();
      }
    });
  });

  it('counts a delayed job from the end of its delay in the backlog age, while no worker takes it', async () => {
    // BullMQ leaves a delayed job in its delayed set past its time until a worker comes for jobs.
    await withQueue(stack.env, 'credential-refresh', async (queue) => {
      const job = await queue.add('refresh', { credential_id: randomUUID() }, { delay: 200 });
      try {
        await new Promise((resolve) => setTimeout(resolve, 1500));
        assert.equal(await job.getState(), 'delayed');
        const from = Date.now();
        const age = sample((await stack.client.get('/metrics')).text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="credential-refresh"')!;
        const stats = (await stack.client.get('/_internal/v1/queues')).body.queues['credential-refresh'];
        const due = (job.timestamp + 200) / 1000;
        for (const seconds of [age, stats.oldest_waiting_age_ms / 1000]) {
          assert.ok(seconds >= from / 1000 - due - 0.05 && seconds <= Date.now() / 1000 - due + 0.05, `${seconds} s; due ${from / 1000 - due} s ago`);
        }
      } finally {
        await job.remove();
      }
    });
  });

  it('counts a delayed job whose time has come as waiting, not delayed, while no worker promotes it', async () => {
    await withQueue(stack.env, 'credential-refresh', async (queue) => {
      // Added a minute ago with a second's delay: due at once, yet left in BullMQ's delayed set (no worker).
      const due = await queue.add('refresh', { credential_id: randomUUID() }, { delay: 1000, timestamp: Date.now() - 60_000 });
      const later = await queue.add('refresh', { credential_id: randomUUID() }, { delay: 3_600_000 });
      try {
        assert.equal(await due.getState(), 'delayed');
        const text = (await stack.client.get('/metrics')).text;
        const stats = (await stack.client.get('/_internal/v1/queues')).body.queues['credential-refresh'];
        assert.deepEqual(
          [sample(text, 'taskbridge_queue_jobs', 'queue="credential-refresh",state="waiting"'), sample(text, 'taskbridge_queue_jobs', 'queue="credential-refresh",state="delayed"')],
          [1, 1], text);
        assert.deepEqual([stats.waiting, stats.delayed], [1, 1], JSON.stringify(stats));
      } finally {
        await due.remove();
        await later.remove();
      }
    });
  });

  it('reports the age of the oldest waiting job, not of a newer one added lifo from the queue dashboard ahead of it', async () => {
    await withQueue(stack.env, 'credential-refresh', async (queue) => {
      const old = await queue.add('refresh', { credential_id: randomUUID() }, { timestamp: Date.now() - 60_000 });
      try {
        // lifo puts the new job at the front of the wait list, ahead of the older one.
        const added = await fetch(`${stack.api.url}/admin/queues/api/queues/credential-refresh/add`, {
          method: 'POST', headers: { authorization: `Basic ${Buffer.from(`ops:${ADMIN_KEY}`).toString('base64')}`, 'content-type': 'application/json' },
          body: JSON.stringify({ name: 'refresh', data: { credential_id: randomUUID() }, options: { jobId: 'lifo-by-hand', lifo: true } }),
        });
        assert.equal(added.status, 200, await added.text());
        assert.deepEqual((await queue.getWaiting(0, 1)).map((j) => j.id).sort(), [old.id, 'lifo-by-hand'].sort());
        const text = (await stack.client.get('/metrics')).text;
        const stats = (await stack.client.get('/_internal/v1/queues')).body.queues['credential-refresh'];
        assert.equal(stats.waiting, 2, JSON.stringify(stats));
        assert.ok(sample(text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="credential-refresh"')! >= 60, text);
        assert.ok(stats.oldest_waiting_age_ms >= 60_000, JSON.stringify(stats));
      } finally {
        await old.remove();
        await queue.remove('lifo-by-hand');
      }
    });
  });

  it('reports backlog age and workers per queue, the Postgres pool and open A2A streams', async () => {
    assert.equal((await stack.client.post('/api/task/v1', { message: textMessage('waits') })).status, 201);
    // A stream on a task no worker runs stays open until the client leaves.
    const ac = new AbortController();
    const streamed = await fetch(`${stack.api.url}/api/a2a/v1`, {
      method: 'POST', signal: ac.signal,
      headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'message/stream', params: { message: { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text: 'streamed' }] } } }),
    });
    const reader = streamed.body!.getReader();
    await reader.read();
    const text = (await stack.client.get('/metrics')).text;
    ac.abort();
    // No worker runs here: the queues have none, and the tasks' jobs wait.
    assert.equal(sample(text, 'taskbridge_queue_workers', 'queue="agent-tasks"'), 0, text);
    // The tasks' jobs wait from the time they were made (this file's first ones), in seconds: never 0.
    const age = await waitFor(async () => sample((await stack.client.get('/metrics')).text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="agent-tasks"'), 'a backlog age');
    assert.ok(age > 0 && age < (Date.now() - LOADED_AT) / 1000, `oldest waiting ${age} s, ${(Date.now() - LOADED_AT) / 1000} s since this file was loaded`);
    assert.equal(sample(text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="key-jobs"'), 0, 'none waits');
    assert.equal(sample(text, 'taskbridge_db_pool_connections', 'state="max"'), 20);
    assert.ok(sample(text, 'taskbridge_db_pool_connections', 'state="used"')! + sample(text, 'taskbridge_db_pool_connections', 'state="free"')! <= 20);
    assert.equal(sample(text, 'taskbridge_db_pool_waiting'), 0);
    assert.equal(sample(text, 'taskbridge_a2a_streams_open'), 1);
    assert.equal(sample(text, 'taskbridge_a2a_streams_per_key_max'), 1);
    await waitFor(async () => sample((await stack.client.get('/metrics')).text, 'taskbridge_a2a_streams_open') === 0, 'the stream released');
  });

  it('reports the progress of key jobs under way', async () => {
    const target = await stack.client.post('/api/encryption/v1/envelope', { type: 'local', file_name: 'metrics-target.key' });
    assert.equal(target.status, 201);
    const job = await stack.client.post('/api/encryption/v1/envelope/default-envelope.key/migrate', { to_envelope_encryption_key_id: 'metrics-target.key' });
    assert.equal(job.status, 202);
    const res = await stack.client.get('/metrics');
    assert.match(res.text, new RegExp(`taskbridge_key_job_items\\{job_id="${job.body.id}",kind="migrate-deks",count="done"\\} 0`));
  });
});

// Answers written on the socket outside Koa (api/client-errors.ts): what Node's parser refuses, a request
// not arrived within API_REQUEST_TIMEOUT_MS, CONNECT, an unknown Expect. Each counts once in the HTTP
// latencies, labelled with nothing the client chose.
describe('GET /metrics: answers given before a request reaches Koa', function () {
  this.timeout(30_000);
  const stack = useStack({ API_REQUEST_TIMEOUT_MS: '1000' }, { workers: 0 });
  const MARK = 'kept-out-of-labels-and-logs';
  // The answer to bytes written on a raw socket (nothing more once they are sent), read until the server closes it.
  const exchange = (text: string): Promise<string> => new Promise((resolve, reject) => {
    const socket = net.connect(Number(new URL(stack.api.url).port), '127.0.0.1', () => socket.write(text));
    const chunks: Buffer[] = [];
    socket.on('data', (b: Buffer) => chunks.push(b));
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
    socket.on('error', reject);
  });
  // The HTTP request counts, by labels, of one scrape.
  const counts = async () => {
    const text = (await stack.client.get('/metrics')).text;
    return new Map([...text.matchAll(/^taskbridge_http_request_duration_seconds_count\{(.*)\} (\S+)$/gm)].map((m) => [m[1], Number(m[2])]));
  };
  // What `send` added to the counts: one series up by exactly one, and no other (the scrapes' own aside).
  const counted = async (send: () => Promise<unknown>, labels: string) => {
    const before = await counts();
    await send();
    const after = await waitFor(async () => { const c = await counts(); return (c.get(labels) ?? 0) > (before.get(labels) ?? 0) && c; }, `a count of ${labels}`);
    const changed = [...after].filter(([l, n]) => n !== (before.get(l) ?? 0) && !l.includes('route="/metrics"'));
    assert.deepEqual(changed, [[labels, (before.get(labels) ?? 0) + 1]]);
  };
  const unparsed = (status: number) => `method="unparsed",route="unparsed",status="${status}"`;

  it('counts a malformed request line as a 400 of route unparsed', async () => {
    await counted(async () => assert.match(await exchange(`NOT HTTP ${MARK}\r\n\r\n`), /^HTTP\/1\.1 400 /), unparsed(400));
  });

  it('counts headers over the limit as a 431 of route unparsed', async () => {
    await counted(async () => assert.match(await exchange(`GET /${MARK} HTTP/1.1\r\nHost: x\r\nX-Pad: ${'a'.repeat(20_000)}\r\n\r\n`), /^HTTP\/1\.1 431 /), unparsed(431));
  });

  it('counts headers not arrived within API_REQUEST_TIMEOUT_MS as a 408 of route unparsed, taking that long', async () => {
    const sum = async () => sample((await stack.client.get('/metrics')).text, 'taskbridge_http_request_duration_seconds_sum', unparsed(408)) ?? 0;
    const before = await sum();
    const started = Date.now();
    await counted(async () => assert.match(await exchange(`GET /${MARK} HTTP/1.1\r\nHost: x\r\nX-Mark: ${MARK}\r\n`), /^HTTP\/1\.1 408 /), unparsed(408));
    assert.ok(Date.now() - started >= 1000, `answered after ${Date.now() - started} ms`);
    // Its latency is the headers' timeout (the least of API_REQUEST_TIMEOUT_MS and 60 s), which ran out.
    assert.equal(await sum() - before, 1);
  });

  it('counts a body not arrived within API_REQUEST_TIMEOUT_MS once, as a 408 of its route, and logs it so', async () => {
    const requestId = `slow-body-${randomUUID()}`;
    let answer = '';
    await counted(async () => {
      answer = await exchange(`POST /api/task/v1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\nX-Request-Id: ${requestId}\r\n\r\n{"message":`);
    }, 'method="POST",route="/api/task/v1",status="408"');
    assert.match(answer, /^HTTP\/1\.1 408 /);
    assert.match(answer, new RegExp(`\r\nX-Request-Id: ${requestId}\r\n`));
    const lines = stack.api.logs.filter((l) => l.includes(requestId));
    assert.equal(lines.length, 1, lines.join('\n'));
    assert.deepEqual((({ msg, status, route }) => ({ msg, status, route }))(JSON.parse(lines[0])), { msg: 'request', status: 408, route: '/api/task/v1' });
  });

  it('counts a request answered without its body once, however long the body then takes, and answers it once', async () => {
    // Koa answers 401 before reading the body; Node keeps the connection to read the rest, which never
    // comes. That timeout is no answer of its own: the connection closes with nothing more said.
    let answer = '';
    await counted(async () => {
      answer = await exchange(`POST /api/task/v1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"message":`);
    }, 'method="POST",route="/api/task/v1",status="401"');
    assert.deepEqual(answer.match(/^HTTP\/1\.1 \d+/gm), ['HTTP/1.1 401']);
  });

  it('counts CONNECT (405) and an Expect other than 100-continue (417) with their method and route unmatched', async () => {
    await counted(async () => assert.match(await exchange(`CONNECT ${MARK}.example:443 HTTP/1.1\r\nHost: ${MARK}.example:443\r\n\r\n`), /^HTTP\/1\.1 405 /),
      'method="CONNECT",route="unmatched",status="405"');
    await counted(async () => assert.match(await exchange(`POST /api/task/v1/${MARK} HTTP/1.1\r\nHost: x\r\nExpect: ${MARK}\r\nContent-Length: 2\r\n\r\n`), /^HTTP\/1\.1 417 /),
      'method="POST",route="unmatched",status="417"');
  });

  it('puts nothing of those requests in the labels, and logs none of the ones Node could not read', async () => {
    assert.ok(!(await stack.client.get('/metrics')).text.includes(MARK));
    // Only the Expect's line names its path, as it always did; CONNECT's names no target.
    const logged = stack.api.logs.filter((l) => l.includes(MARK));
    assert.equal(logged.length, 1, logged.join('\n'));
    assert.match(logged[0], /"status":417/);
  });
});

// A strict reading of the Prometheus text format (0.0.4): every sample belongs to a family declared
// by # HELP and # TYPE before it, names and labels are well formed, no series repeats, counters end
// in _total, and each histogram's buckets are cumulative up to +Inf, which equals its _count.
function checkExposition(text: string): void {
  const types = new Map<string, string>();
  const seen = new Set<string>();
  const buckets = new Map<string, { le: number; n: number }[]>();
  const counts = new Map<string, number>();
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"/y;
  assert.ok(text.endsWith('\n'), 'ends with a newline');
  for (const line of text.slice(0, -1).split('\n')) {
    if (!line) continue; // empty lines are allowed, and ignored
    const meta = /^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$/.exec(line);
    if (meta) {
      if (meta[1] === 'TYPE') {
        assert.ok(['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(meta[3]), line);
        assert.ok(!types.has(meta[2]), `${meta[2]} declared twice`);
        if (meta[3] === 'counter') assert.match(meta[2], /_total$/, `counter ${meta[2]}`);
        types.set(meta[2], meta[3]);
      }
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `malformed line: ${line}`);
    const [, name, rawLabels = '', value] = m;
    // Prometheus reads NaN and Inf in any case (Go's ParseFloat); prom-client writes NaN as 'Nan'
    // (the event loop's lag before its first sample).
    assert.ok(!Number.isNaN(Number(value)) || /^[+-]?Inf$|^NaN$/i.test(value), line);
    const labels: Record<string, string> = {};
    label.lastIndex = 0;
    while (label.lastIndex < rawLabels.length) {
      const l = label.exec(rawLabels);
      assert.ok(l, `malformed labels: ${line}`);
      labels[l[1]] = l[2];
      if (label.lastIndex < rawLabels.length) assert.equal(rawLabels[label.lastIndex++], ',', line);
    }
    const family = types.has(name) ? name : name.replace(/_(bucket|sum|count)$/, '');
    assert.ok(types.has(family), `no # TYPE before ${line}`);
    assert.ok(!seen.has(`${name}{${rawLabels}}`), `repeated: ${line}`);
    seen.add(`${name}{${rawLabels}}`);
    if (types.get(family) !== 'histogram') continue;
    const { le, ...rest } = labels;
    const id = `${family}${JSON.stringify(rest)}`;
    if (name.endsWith('_bucket')) buckets.set(id, [...(buckets.get(id) ?? []), { le: le === '+Inf' ? Infinity : Number(le), n: Number(value) }]);
    if (name.endsWith('_count')) counts.set(id, Number(value));
  }
  for (const [id, bs] of buckets) {
    assert.deepEqual(bs.map((b) => b.le), [...bs.map((b) => b.le)].sort((a, b) => a - b), `${id}: buckets in order`);
    assert.deepEqual(bs.map((b) => b.n), [...bs.map((b) => b.n)].sort((a, b) => a - b), `${id}: cumulative`);
    assert.equal(bs.at(-1)!.le, Infinity, `${id}: ends at +Inf`);
    assert.equal(bs.at(-1)!.n, counts.get(id), `${id}: +Inf equals _count`);
  }
}

describe('GET /metrics: what the workers record', () => {
  const stack = useStack({ AGENT_ATTEMPTS: '2', AGENT_BACKOFF_MS: '0' });


  it('reports the workers taking jobs from each queue', async () => {
    const text = (await stack.client.get('/metrics')).text;
    for (const queue of ['agent-tasks', 'key-jobs', 'credential-refresh', 'push-notifications']) {
      assert.equal(sample(text, 'taskbridge_queue_workers', `queue="${queue}"`), stack.workers.length, `${queue}: ${text}`);
    }
  });

  it('shows every series the workers report at 0 before their first job, so that rates and alerts on them work from the start', async () => {
    const text = (await stack.client.get('/metrics')).text;
    const zero = (metric: string, labels: string) => assert.equal(sample(text, metric, labels), 0, `${metric}{${labels}}: ${text}`);
    for (const queue of ['agent-tasks', 'key-jobs', 'credential-refresh', 'push-notifications']) {
      for (const outcome of ['completed', 'failed', 'retrying']) {
        zero('taskbridge_job_duration_seconds_count', `queue="${queue}",outcome="${outcome}"`);
        zero('taskbridge_job_duration_seconds_bucket', `queue="${queue}",outcome="${outcome}",le="\\+Inf"`); // sample() reads labels as a regular expression
      }
      zero('taskbridge_job_enqueue_lag_seconds_count', `queue="${queue}"`);
      zero('taskbridge_jobs_stalled_total', `queue="${queue}"`);
    }
    for (const outcome of ['completed', 'input-required', 'auth-required', 'failed', 'rejected', 'canceled']) zero('taskbridge_agent_runs_total', `outcome="${outcome}"`);
    for (const outcome of ['refreshed', 'not_due', 'gone', 'refresh_failed', 'retrying', 'error']) zero('taskbridge_credential_refreshes_total', `outcome="${outcome}"`);
    checkExposition(text);
  });

  it('reports job durations by queue and outcome, with retried attempts, the enqueue lag of first attempts, and agent runs by how they ended their task', async () => {
    const ok = await stack.client.post('/api/task/v1', { message: textMessage('measured') });
    const failing = await stack.client.post('/api/task/v1', { message: textMessage('[fail] measured') });
    for (const r of [ok, failing]) assert.equal(r.status, 201);
    for (const [r, status] of [[ok, 'completed'], [failing, 'failed']] as const) {
      await waitFor(async () => (await stack.client.get(`/api/task/v1/${r.body.task.id}`)).body.task.status === status, `task ${status}`);
    }
    // Workers flush what they recorded once a second.
    const text = await waitFor(async () => {
      const t = (await stack.client.get('/metrics')).text;
      return sample(t, 'taskbridge_job_duration_seconds_count', 'queue="agent-tasks",outcome="completed"') === 2 && t;
    }, 'the agent jobs in /metrics');
    // The failing task's first attempt failed and was retried; its last attempt ended the task as failed.
    assert.equal(sample(text, 'taskbridge_job_duration_seconds_count', 'queue="agent-tasks",outcome="retrying"'), 1);
    assert.equal(sample(text, 'taskbridge_job_enqueue_lag_seconds_count', 'queue="agent-tasks"'), 2, 'first attempts only');
    // Both jobs completed, but one task failed: the agent runs tell them apart.
    assert.equal(sample(text, 'taskbridge_agent_runs_total', 'outcome="completed"'), 1, text);
    assert.equal(sample(text, 'taskbridge_agent_runs_total', 'outcome="failed"'), 1, text);
    assert.match(text, /# TYPE taskbridge_job_duration_seconds histogram/);
    assert.match(text, /# TYPE taskbridge_job_enqueue_lag_seconds histogram/);
    // Cumulative buckets: never decreasing, the last one (+Inf) equal to the count.
    const buckets = [...text.matchAll(/^taskbridge_job_duration_seconds_bucket\{queue="agent-tasks",outcome="completed",le="([^"]+)"\} (\d+)$/gm)].map((m) => Number(m[2]));
    assert.ok(buckets.length > 5);
    assert.deepEqual(buckets, [...buckets].sort((a, b) => a - b));
    assert.equal(buckets.at(-1), 2);
    const sum = sample(text, 'taskbridge_job_enqueue_lag_seconds_sum', 'queue="agent-tasks"')!;
    assert.ok(sum >= 0 && sum < 60, `lag sum ${sum}`);
    checkExposition(text);
  });

  it('dates no job retried after it failed from its first add, in the backlog age or the enqueue lag', async () => {
    await withQueue(stack.env, 'credential-refresh', async (queue) => {
      // Data not of the queue's payload: the worker fails each on its only attempt.
      const [byDashboard, byRetry] = await Promise.all([queue.add('refresh', {}), queue.add('refresh', {})]);
      try {
        await waitFor(async () => (await byDashboard.isFailed()) && (await byRetry.isFailed()), 'both jobs failed');
        await queue.pause();
        // Added three hours ago, as far as BullMQ knows (a fixture: waiting that long is not a test).
        const redis = await queue.getBackend().client;
        for (const job of [byDashboard, byRetry]) await redis.hset(queue.toKey(job.id!), { timestamp: Date.now() - 3 * 3600_000 });
        const retried = await fetch(`${stack.api.url}/admin/queues/api/queues/credential-refresh/${byDashboard.id}/retry`, {
          method: 'PUT', headers: { authorization: `Basic ${Buffer.from(`ops:${ADMIN_KEY}`).toString('base64')}` },
        });
        assert.equal(retried.status, 204, await retried.text());
        // As a retry with its attempts counted afresh (BullMQ's resets) leaves it: only its stack trace tells.
        await (await queue.getJob(byRetry.id!))!.retry('failed', { resetAttemptsMade: true, resetAttemptsStarted: true });
        const text = (await stack.client.get('/metrics')).text;
        const stats = (await stack.client.get('/_internal/v1/queues')).body.queues['credential-refresh'];
        assert.equal(sample(text, 'taskbridge_queue_jobs', 'queue="credential-refresh",state="waiting"'), 2, text);
        assert.equal(sample(text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="credential-refresh"'), 0, text);
        assert.equal(stats.oldest_waiting_age_ms, null, JSON.stringify(stats));
        // Run again, each fails again: neither run's wait is counted from three hours ago.
        await queue.resume();
        await waitFor(async () => (await byDashboard.isFailed()) && (await byRetry.isFailed()), 'both jobs failed again');
        const after = await waitFor(async () => {
          const t = (await stack.client.get('/metrics')).text;
          return sample(t, 'taskbridge_job_duration_seconds_count', 'queue="credential-refresh",outcome="failed"') === 4 && t;
        }, 'the four attempts in /metrics');
        assert.equal(sample(after, 'taskbridge_job_enqueue_lag_seconds_count', 'queue="credential-refresh"'), 2, 'the first attempts only');
        assert.equal(sample(after, 'taskbridge_job_enqueue_lag_seconds_bucket', 'queue="credential-refresh",le="600"'), 2, after);
      } finally {
        await Promise.all([byDashboard.remove(), byRetry.remove()]);
        await queue.resume();
      }
    });
  });
});

describe('GET /metrics: workers of another installation on the same Redis server', () => {
  const stack = useStack({}, { workers: 0 });

  it('counts only the workers on its own Redis database, not those of another database with the same QUEUE_PREFIX', async () => {
    const url = new URL(stack.env.REDIS_URL);
    url.pathname = `/${Number(url.pathname.slice(1) || 0) === 7 ? 8 : 7}`;
    stack.workers.push(await startWorker({ ...stack.env, REDIS_URL: url.toString() }));
    const counts = async () => {
      const text = (await stack.client.get('/metrics')).text;
      return ['agent-tasks', 'key-jobs', 'credential-refresh', 'push-notifications'].map((queue) => sample(text, 'taskbridge_queue_workers', `queue="${queue}"`));
    };
    assert.deepEqual(await counts(), [0, 0, 0, 0], 'a worker of another database runs none of these queues');
    stack.workers.push(await startWorker(stack.env));
    // Each of its BullMQ workers names its connection as it connects, which may follow the start line.
    await waitFor(async () => (await counts()).every((n) => n === 1), 'the worker counted on each queue');
    assert.deepEqual(await counts(), [1, 1, 1, 1]);
  });
});

describe('GET /metrics: stalled jobs', () => {
  const stack = useStack({}, { workers: 0 });

  it('counts a job whose worker died during it, and the worker that finds it logs it', async () => {
    const first = await startWorker(stack.env);
    stack.workers.push(first);
    const created = await stack.client.post('/api/task/v1', { message: textMessage('[sleep 3000] its worker dies') });
    const taskId = created.body.task.id;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${taskId}`)).body.task.status === 'working', 'the run to start');
    await first.kill('SIGKILL');
    const second = await startWorker(stack.env);
    stack.workers.push(second);
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${taskId}`)).body.task.status === 'completed', 'the run taken over');
    await waitFor(async () => sample((await stack.client.get('/metrics')).text, 'taskbridge_jobs_stalled_total', 'queue="agent-tasks"') === 1, 'the stalled job in /metrics');
    const lines = second.logs.filter((l) => l.includes('job stalled'));
    assert.equal(lines.length, 1, lines.join('\n'));
    const line = JSON.parse(lines[0]);
    assert.deepEqual([line.level, line.queue, typeof line.job_id], [40, 'agent-tasks', 'string'], lines[0]);
  });
});

describe('GET /metrics and /_internal/v1/queues: the wait of a job that came back to the queue', () => {
  // One run at a time, handed back soon after SIGTERM.
  const stack = useStack({ AGENT_CONCURRENCY: '1', AGENT_ATTEMPTS: '1', WORKER_SHUTDOWN_GRACE_MS: '1000' }, { workers: 0 });
  const sleeper = { id: '', created: 0 };

  const ages = async () => {
    const from = Date.now();
    const gauge = sample((await stack.client.get('/metrics')).text, 'taskbridge_queue_oldest_waiting_seconds', 'queue="agent-tasks"')!;
    const queues = (await stack.client.get('/_internal/v1/queues')).body.queues['agent-tasks'];
    return { from, to: Date.now(), gauge, internal: queues.oldest_waiting_age_ms / 1000, waiting: queues.waiting, active: queues.active };
  };
  // Stops a worker with SIGTERM: past the grace period it hands its run back to the queue.
  const handBack = async (worker: Awaited<ReturnType<typeof startWorker>>) => {
    await worker.kill('SIGTERM');
    stack.workers = stack.workers.filter((w) => w !== worker);
    assert.ok(worker.logs.some((l) => l.includes('agent runs handed back to the queue')), worker.logs.slice(-10).join('\n'));
  };

  it('counts a run handed back from when that run started, not from when its task was made', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('[sleep 20000] handed back') });
    Object.assign(sleeper, { id: created.body.task.id, created: Date.parse(created.body.task.created_at) });
    // It waits a while first: no worker runs.
    await waitFor(async () => (await ages()).waiting === 1, 'the job in the queue');
    await new Promise((r) => setTimeout(r, 3000));
    const worker = await startWorker(stack.env);
    stack.workers.push(worker);
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${sleeper.id}`)).body.status_message?.parts[0].text === 'Working for 20000 ms', 'the run to start');
    await handBack(worker);
    const tl = await stack.client.get(`/api/task/v1/${sleeper.id}/timeline?order=asc`);
    const started = Date.parse(tl.body.items.find((i: any) => i.event_payload.status === 'working').created_at);
    const a = await ages();
    assert.equal(a.waiting, 1);
    for (const age of [a.gauge, a.internal]) {
      // BullMQ notes when the run was taken (a moment before it wrote working), not when it came back.
      assert.ok(age >= (a.from - started) / 1000 - 1 && age <= (a.to - started) / 1000 + 1, `${age} s; run started ${(a.to - started) / 1000} s ago`);
      assert.ok(age < (a.from - sleeper.created) / 1000 - 2, `${age} s; task made ${(a.from - sleeper.created) / 1000} s ago`);
    }
  });

  it('still counts a job that has waited behind it since before that run started', async () => {
    // The run handed back waits at the front of the line; this task waits behind it, and keeps waiting
    // while the run is taken and handed back again.
    const behind = await stack.client.post('/api/task/v1', { message: textMessage('waits behind') });
    const behindCreated = Date.parse(behind.body.task.created_at);
    await waitFor(async () => (await ages()).waiting === 2, 'both jobs in the queue');
    await new Promise((r) => setTimeout(r, 3000));
    const worker = await startWorker(stack.env);
    stack.workers.push(worker);
    await waitFor(async () => { const a = await ages(); return a.active === 1 && a.waiting === 1; }, 'the handed-back run taken again');
    const taken = Date.now();
    await handBack(worker);
    const a = await ages();
    assert.equal(a.waiting, 2);
    assert.equal((await stack.client.get(`/api/task/v1/${behind.body.task.id}`)).body.task.status, 'submitted');
    for (const age of [a.gauge, a.internal]) {
      // Since the job behind was added (a moment after its task was made), not since the run at the front was taken.
      assert.ok(age <= (a.to - behindCreated) / 1000 && age >= (a.from - behindCreated) / 1000 - 1.5, `${age} s; task behind made ${(a.to - behindCreated) / 1000} s ago`);
      assert.ok(age > (a.to - taken) / 1000 + 1.5, `${age} s; run at the front taken ${(a.to - taken) / 1000} s ago`);
    }
  });
});

describe('GET /metrics while Postgres or Redis is down', function () {
  this.timeout(60_000);
  const leftOutWarnings = (lines: string[]) => lines.map((l) => JSON.parse(l)).filter((l) => l.level === 40 && l.msg === 'metric left out of the scrape: its source did not answer');
  // An API (ADMIN_API_KEY needs no key lookup) on a Postgres and a Redis of its own, which the tests stop.
  const dataDir = () => path.join(requireEnv('TEST_DATA_DIR'), 'metrics-outage');
  let pg: OwnPostgres | undefined;
  let redis: LocalService | undefined;
  let stack: Stack | undefined;
  before(async () => {
    pg = await startOwnPostgres('metrics-outage');
    redis = await startRedis({ dataDir: dataDir(), ephemeral: true, port: await freePort() });
    stack = await startStack({ DATABASE_URL: pg.url, REDIS_URL: redis.url }, { workers: 0 });
  });
  after(async () => {
    await stack?.stop();
    await redis?.stop();
    await pg?.stop();
  });

  it('still answers with what it can read (HTTP latency, process metrics, the outbox backlog while Redis is down), leaving out what it cannot', async () => {
    const s = stack!;
    // Prometheus scrapes with a key of scope internal, looked up in Postgres (ADMIN_API_KEY is not).
    const scraper = s.client.as((await s.client.post('/api/auth/v1/api-key', { name: 'prometheus', scopes: ['internal'] })).body.key);
    const up = await scraper.get('/metrics');
    const lookedUp = Date.now();
    assert.equal(up.status, 200);
    // Revoked after the scraper's lookup: a revocation notice arriving during a lookup keeps its answer out of the cache.
    const revoked = await s.client.post('/api/auth/v1/api-key', { name: 'revoked', scopes: ['internal'] });
    assert.equal((await s.client.as(revoked.body.key).get('/metrics')).status, 200);
    assert.equal((await s.client.delete(`/api/auth/v1/api-key/${revoked.body.id}`)).status, 200);
    assert.match(up.text, /^taskbridge_queue_jobs\{queue="agent-tasks",state="waiting"\} 0$/m);

    await redis!.stop();
    redis = undefined;
    // The outbox is where jobs wait during a Redis outage: its backlog is what to watch.
    const posted = Date.now();
    assert.equal((await s.client.post('/api/task/v1', { message: textMessage('during the outage') })).status, 201);
    const noRedis = await s.client.get('/metrics');
    const since = (Date.now() - posted) / 1000;
    assert.equal(noRedis.status, 200, noRedis.text);
    assert.match(noRedis.text, /^taskbridge_outbox_pending 1$/m);
    // The job has waited since the task was made (Postgres's clock is this machine's): above 0, at
    // most the time since it was posted.
    const age = sample(noRedis.text, 'taskbridge_outbox_oldest_seconds')!;
    assert.ok(age > 0 && age <= since + 0.01, `the age of the job waiting in the outbox: ${age} s, posted ${since} s ago`);
    assert.match(noRedis.text, /^taskbridge_http_request_duration_seconds_count\{method="POST",route="\/api\/task\/v1",status="201"\} 1$/m);
    assert.match(noRedis.text, /^process_cpu_user_seconds_total /m);
    assert.doesNotMatch(noRedis.text, /^taskbridge_queue_jobs\{/m, 'no queue depths it could not read');
    assert.doesNotMatch(noRedis.text, /^taskbridge_queue_paused\{/m, 'no paused flags it could not read');
    assert.doesNotMatch(noRedis.text, /^taskbridge_queue_workers\{/m, 'no worker counts it could not read (not 0)');
    assert.doesNotMatch(noRedis.text, /^taskbridge_queue_oldest_waiting_seconds\{/m, 'no backlog ages it could not read');
    for (const metric of ['taskbridge_jobs_stalled_total', 'taskbridge_agent_runs_total', 'taskbridge_job_duration_seconds_count']) {
      assert.doesNotMatch(noRedis.text, new RegExp(`^${metric}\\{`, 'm'), `no ${metric} it could not read (not 0)`);
    }
    // The outage is logged at warn once, not once per metric left out at every scrape.
    assert.equal((await s.client.get('/metrics')).status, 200);
    const redisDown = leftOutWarnings(await requestLogsThrough(s, await s.client.get(`/api/task/v1/${randomUUID()}`), { all: true }));
    assert.deepEqual(redisDown.map((l) => l.service), ['redis'], JSON.stringify(redisDown));

    await pg!.stop();
    pg = undefined;
    const neither = await s.client.get('/metrics');
    assert.equal(neither.status, 200, neither.text);
    assert.doesNotMatch(neither.text, /^taskbridge_outbox_pending /m, 'no backlog it could not read (not 0)');
    assert.doesNotMatch(neither.text, /^taskbridge_outbox_oldest_seconds /m, 'no backlog age it could not read (not 0)');
    assert.match(neither.text, /^taskbridge_http_request_duration_seconds_count\{method="GET",route="\/metrics",status="200"\} 4$/m);
    // The scraper's key is still taken once its cache entry has expired: Postgres cannot be asked, and
    // a revocation (a write to Postgres) cannot have happened meanwhile without its notice reaching us.
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, lookedUp + 10_500 - Date.now())));
    const scraped = await scraper.get('/metrics');
    assert.equal(scraped.status, 200, scraped.text);
    assert.match(scraped.text, /^taskbridge_http_request_duration_seconds_count\{method="GET",route="\/metrics",status="200"\} 5$/m);
    // A key revoked before the outage is not: its notice removed it.
    const refused = await s.client.as(revoked.body.key).get('/metrics');
    assert.equal(refused.status, 503);
    // Postgres's outage too is logged once, for all of its metrics and scrapes.
    const bothDown = leftOutWarnings(await requestLogsThrough(s, refused, { all: true }));
    assert.deepEqual(bothDown.map((l) => l.service), ['redis', 'postgres'], JSON.stringify(bothDown));
    assert.match(bothDown[1].metric, /^taskbridge_(outbox|key_job|provider)/);
  });
});

describe('worker metrics in Redis', () => {
  const prefix = `wm-${randomUUID()}`;
  let redis: Redis;
  before(() => { redis = new Redis(process.env.REDIS_URL!, { maxRetriesPerRequest: 1 }); });
  after(() => redis.disconnect());

  const scrape = async () => {
    const registry = new Registry();
    registerWorkerMetrics(registry, redis, prefix);
    return registry.metrics();
  };

  it('adds up sums across flushes whatever the values, and keeps a batch Redis did not take for the next flush', async () => {
    const metrics = new WorkerMetrics(redis, prefix);
    metrics.observe('taskbridge_job_enqueue_lag_seconds', { queue: 'q' }, 0.25);
    await metrics.flush();
    metrics.observe('taskbridge_job_enqueue_lag_seconds', { queue: 'q' }, 1);
    metrics.count('taskbridge_credential_refreshes_total', { outcome: 'refreshed' });
    await metrics.flush();
    let text = await scrape();
    assert.match(text, /^taskbridge_job_enqueue_lag_seconds_sum\{queue="q"\} 1\.25$/m);
    assert.match(text, /^taskbridge_job_enqueue_lag_seconds_count\{queue="q"\} 2$/m);
    assert.match(text, /^taskbridge_job_enqueue_lag_seconds_bucket\{queue="q",le="0\.5"\} 1$/m);
    assert.match(text, /^taskbridge_credential_refreshes_total\{outcome="refreshed"\} 1$/m);

    // A connection not yet up refuses commands (no offline queue), like one that just dropped.
    const offline = new Redis(process.env.REDIS_URL!, { maxRetriesPerRequest: 0, enableOfflineQueue: false });
    const blip = new WorkerMetrics(offline, prefix);
    blip.observe('taskbridge_job_enqueue_lag_seconds', { queue: 'q' }, 0.5);
    await assert.rejects(blip.flush());
    if (offline.status !== 'ready') await new Promise((resolve) => offline.once('ready', resolve));
    try {
      await blip.flush();
    } finally {
      offline.disconnect();
    }
    text = await scrape();
    assert.match(text, /^taskbridge_job_enqueue_lag_seconds_sum\{queue="q"\} 1\.75$/m);
    assert.match(text, /^taskbridge_job_enqueue_lag_seconds_count\{queue="q"\} 3$/m);
  });
});

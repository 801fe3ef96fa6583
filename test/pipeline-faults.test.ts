// The job pipeline under faults: Redis away while tasks are created, a worker killed mid-run.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pgClient from 'pg';
import { Queue } from 'bullmq';
import { freePort, startRedis, type LocalService } from '../scripts/local-services.ts';
import { behindProxy, behindServiceProxy } from './helpers/black-hole-proxy.ts';
import { startOwnPostgres, type OwnPostgres } from './helpers/own-postgres.ts';
import { lockWaits, openQueue, requestLogsThrough, requireEnv, ROOT, resetDb, startStack, startWorker, statusesOf, testDb, textMessage, waitFor, type Proc, type Response, type Stack } from './helpers/stack.ts';

async function waitForStatus(stack: Stack, id: string, status: string, timeoutMs = 60000) {
  return waitFor(async () => {
    const r = await stack.client.get(`/api/task/v1/${id}`);
    return r.body.task?.status === status && r.body;
  }, `task ${id} to be ${status}`, timeoutMs, 200);
}

// A stack (API and one worker) on a Postgres of its own, which a test may stop and start again.
function onOwnPostgres(name: string, env: Record<string, string> = {}) {
  const own = { pg: undefined as unknown as OwnPostgres, stack: undefined as unknown as Stack };
  before(async () => {
    own.pg = await startOwnPostgres(name);
    own.stack = await startStack({ DATABASE_URL: own.pg.url, ...env }, { workers: 1 });
  });
  after(async () => {
    await own.stack?.stop();
    await own.pg?.stop();
  });
  return own;
}

// A stack (API and one worker) on a Redis of its own, which a test may stop and start again on its
// port. `kept`: Redis keeps its data (append-only file) across that restart.
function onOwnRedis(name: string, opts: { kept?: boolean; env?: Record<string, string> } = {}) {
  const dataDir = path.join(requireEnv('TEST_DATA_DIR'), name);
  const own = {
    redis: undefined as LocalService | undefined, stack: undefined as unknown as Stack, port: 0,
    async stop() {
      await own.redis?.stop();
      own.redis = undefined;
    },
    async start() {
      own.redis = await startRedis({ dataDir, ephemeral: !opts.kept, port: own.port });
    },
  };
  before(async () => {
    own.port = await freePort();
    await own.start();
    own.stack = await startStack({ REDIS_URL: own.redis!.url, ...opts.env }, { workers: 1 });
  });
  after(async () => {
    await own.stack?.stop();
    await own.stop();
  });
  return own;
}

describe('job pipeline under faults', function () {
  this.timeout(180000);
  before(resetDb);

  describe('Redis stopped while tasks are created', () => {
    const own = onOwnRedis('faults-redis');

    it('accepts tasks (201) while Redis is down, and completes all of them once it is back', async () => {
      const s = own.stack;
      const warm = await s.client.post('/api/task/v1', { message: textMessage('before the outage') });
      await waitForStatus(s, warm.body.task.id, 'completed');
      // A run that ends during the outage (its task is in Postgres) leaves metrics to flush: the
      // warm task's may have been flushed before Redis stopped, and a flush of nothing never fails.
      const acrossOutage = await s.client.post('/api/task/v1', { message: textMessage('[sleep 1500] across the outage') });
      await waitForStatus(s, acrossOutage.body.task.id, 'working');

      await own.stop();
      const ready = await waitFor(async () => {
        const r = await s.client.get('/_internal/v1/ready');
        return r.status === 503 && r;
      }, 'ready to report Redis down');
      assert.equal(ready.body.data.code, 'unavailable');
      assert.deepEqual(ready.body.data.failed, ['redis']);
      const queues = await s.client.get('/_internal/v1/queues');
      assert.equal(queues.status, 503, queues.text);
      assert.equal(queues.body.data.code, 'unavailable');
      assert.equal(queues.headers.get('retry-after'), '5');

      const ids: string[] = [];
      for (let i = 0; i < 5; i++) {
        const r = await s.client.post('/api/task/v1', { message: textMessage(`during the outage ${i}`) });
        assert.equal(r.status, 201, r.text);
        ids.push(r.body.task.id);
      }
      // The jobs wait in the outbox, written when adding them to Redis failed.
      await waitFor(async () => Number((await testDb()('outbox').whereRaw(`payload->>'task_id' = any(?)`, [ids]).count({ n: '*' }))[0].n) === 5, 'the jobs in the outbox');
      for (const id of ids) assert.equal((await s.client.get(`/api/task/v1/${id}`)).body.task.status, 'submitted');
      // Meanwhile the worker's queues fail several Redis commands a second: a warn line a queue, not one each.
      const errorLines = () => s.workers[0].logs.filter((l) => l.includes('"msg":"worker error"'));
      const before = errorLines().length;
      await sleep(3000);
      const during = errorLines().slice(before).map((l) => JSON.parse(l));
      assert.ok(during.length <= 4 && during.every((l) => l.level === 40), `warn lines of worker errors in 3 s of outage: ${during.length}`);
      // Likewise the outbox: each send deferred to the sweeper, and each sweep (every OUTBOX_SWEEP_MS)
      // failing while the jobs wait, is one warn line a minute at most, not one a request or a tick.
      const warnLines = (p: Proc, msg: string) => p.logs.filter((l) => l.includes(`"msg":"${msg}"`) && JSON.parse(l).level === 40).length;
      assert.equal(warnLines(s.api, 'outbox relay deferred to sweeper'), 1);
      const sweeps = [s.api, s.workers[0]].map((p) => warnLines(p, 'outbox sweep failed; will retry'));
      assert.ok(sweeps.every((n) => n <= 1) && sweeps.some((n) => n === 1), `warn lines of failed sweeps (API, worker): ${sweeps}`);
      // And the worker's metrics, flushed to Redis every second: one warn line, not one a second.
      await waitForStatus(s, acrossOutage.body.task.id, 'completed');
      await waitFor(async () => warnLines(s.workers[0], 'worker metrics not flushed; will retry') > 0, 'a failed metrics flush');
      await sleep(2000);
      const flushes = warnLines(s.workers[0], 'worker metrics not flushed; will retry');
      assert.equal(flushes, 1, `warn lines of failed metric flushes: ${flushes}`);

      await own.start();
      for (const [i, id] of ids.entries()) {
        const done = await waitForStatus(s, id, 'completed');
        assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `Echo: during the outage ${i}` }]);
      }
      assert.equal((await s.client.get('/_internal/v1/ready')).status, 200);
      const left = await testDb()('outbox').whereRaw(`payload->>'task_id' = any(?)`, [ids]).count({ n: '*' });
      assert.equal(left[0].n, 0);
    });

    // The delete commits in Postgres; only the note telling other processes to drop their cached
    // DEKs cannot go out. The client is told what happened (200), not an error for a change made.
    it('deletes an unused envelope key while Redis is down: 200, gone, and a warn line about the other caches', async () => {
      const s = own.stack;
      const E = '/api/encryption/v1';
      assert.equal((await s.client.post(`${E}/envelope`, { type: 'local', file_name: 'outage.key' })).status, 201);
      await own.stop();
      try {
        const deleted = await s.client.delete(`${E}/envelope/outage.key`);
        assert.equal(deleted.status, 200, deleted.text);
        assert.equal((await s.client.get(`${E}/envelope/outage.key`)).status, 404);
        const warned = await waitFor(async () => s.api.logs.find((l) => l.includes('could not be told to drop their cached DEKs')), 'the warn line');
        assert.equal(JSON.parse(warned).level, 40, warned);
        assert.equal((await s.client.delete(`${E}/envelope/outage.key`)).status, 404);
      } finally {
        await own.start();
      }
    });
  });

  describe('Redis restarted with its data (append-only file) during an agent run longer than WORKER_LOCK_MS', () => {
    const own = onOwnRedis('faults-redis-kept', { kept: true });

    // The run's lock expired while Redis was away: its job is found stalled and taken again by the
    // worker still running it. That copy's lock must be renewed, or it stalls again every
    // WORKER_LOCK_MS until the task fails ("its worker stopped during it too often").
    it('completes the task once: the job taken again by the same worker keeps its lock', async () => {
      const s = own.stack;
      const id = (await s.client.post('/api/task/v1', { message: textMessage('[sleep 8000] through a restart') })).body.task.id;
      await waitFor(async () => (await s.client.get(`/api/task/v1/${id}`)).body.task.status === 'working', 'the agent to be running');
      await own.stop();
      await sleep(4000);
      await own.start();

      const done = await waitFor(async () => {
        const t = (await s.client.get(`/api/task/v1/${id}`)).body;
        return ['completed', 'failed'].includes(t.task.status) && t;
      }, 'the task to end', 60000, 200);
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: [sleep 8000] through a restart' }]);
      const statuses = await statusesOf(s.client, id);
      assert.deepEqual([statuses[0], statuses.at(-1)], ['submitted', 'completed']);
      assert.ok(statuses.slice(1, -1).every((st: string) => st === 'working'), statuses.join(','));
      const agentReplies = done.messages.filter((m: any) => m.role === 'agent' && m.parts[0].text.startsWith('Echo'));
      assert.equal(agentReplies.length, 1);
      // Taken again once, after the restart, not once per WORKER_LOCK_MS.
      const stalls = s.workers[0].logs.filter((l) => l.includes('"msg":"job stalled'));
      assert.equal(stalls.length, 1, stalls.join('\n'));
    });
  });

  describe('an outbox backlog left by a Redis outage', () => {
    // A long sweep period: each process sweeps once in the test, so what is sent was sent by those sweeps.
    const SWEEP_MS = 30_000;
    const ROWS = 6000;
    let stack: Stack | undefined;
    let push: ReturnType<typeof openQueue> | undefined;
    before(async () => {
      await resetDb();
      stack = await startStack({ OUTBOX_SWEEP_MS: String(SWEEP_MS) }, { workers: 1 });
      // Paused, so the jobs stay in BullMQ to be counted instead of being run by the worker.
      push = openQueue(stack.env, 'push-notifications');
      await push.queue.pause();
    });
    after(async () => {
      await push?.close();
      await stack?.stop();
    });

    it('is sent in full by the first sweep (API and worker sweeping at once, each row once), not 1,000 rows per period', async () => {
      const s = stack!;
      const db = testDb();
      await db.raw(`insert into outbox (id, queue, name, payload, created_at)
        select gen_random_uuid(), 'push-notifications', 'deliver', jsonb_build_object('task_id', gen_random_uuid(), 'config_id', gen_random_uuid(), 'timeline_seq', g), now() - interval '10 minutes'
          from generate_series(1, ?) g`, [ROWS]);
      const sentBy = (p: Proc) => p.logs.filter((l) => l.includes('"msg":"outbox sweeper sent leftover jobs"')).reduce((n, l) => n + JSON.parse(l).count, 0);
      const sent = () => [s.api, ...s.workers].reduce((n, p) => n + sentBy(p), 0);
      await waitFor(async () => sent() > 0, 'the first sweep', 2 * SWEEP_MS, 200);
      // Half a period after the first sweep began, before either process sweeps again.
      await waitFor(async () => Number((await db('outbox').count({ n: '*' }))[0].n) === 0, 'the first sweeps to empty the outbox', SWEEP_MS / 2, 200);
      const counts = await push!.queue.getJobCounts();
      assert.equal(Object.values(counts).reduce((a, b) => a + b, 0), ROWS, JSON.stringify(counts));
      // Log lines are written buffered: wait for them all, then check no row was sent by both processes.
      await waitFor(async () => sent() >= ROWS, 'the log lines of every batch', 10_000);
      assert.equal(sent(), ROWS);
    });
  });

  describe('a task canceled while Redis is down (its cancel note lost)', () => {
    const marker = path.join(requireEnv('TEST_DATA_DIR'), `cancel-marker-${Date.now()}`);
    const own = onOwnRedis('faults-redis-cancel', {
      env: { AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/signal-agent.ts'), SIGNAL_AGENT_MARKER: marker },
    });

    it("still aborts the running agent's signal within about a second: the worker finds the task ended in Postgres", async () => {
      const s = own.stack;
      const rpc = (method: string, params: unknown) => s.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method, params });
      const message = { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text: 'wait' }] };
      const task = (await rpc('message/send', { message, configuration: { blocking: false } })).body.result;
      await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'waiting to be canceled', 'the agent to start waiting');

      await own.stop();
      const canceled = await rpc('tasks/cancel', { id: task.id });
      assert.equal(canceled.body.result?.status.state, 'canceled', canceled.text);
      const at = Date.now();
      const text = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to observe its abort signal', 10_000, 50);
      assert.match(text, new RegExp(`aborted task ${task.id}: task canceled`));
      assert.ok(Date.now() - at < 3000, `aborted ${Date.now() - at} ms after the cancel`);
      // The worker's log is written buffered: its line may come a moment after the agent's marker.
      await waitFor(async () => s.workers[0].logs.some((l) => l.includes('agent run aborted: task canceled') && l.includes(task.id)), "the worker's log line of the abort", 5000);

      await own.start();
      assert.equal((await rpc('tasks/get', { id: task.id })).body.result.status.state, 'canceled');
    });
  });

  describe('a worker stopped (SIGTERM) while Redis is down', () => {
    const own = onOwnRedis('faults-redis-sigterm', { env: { WORKER_SHUTDOWN_GRACE_MS: '1000' } });

    it('exits (code 1, saying why) once the grace period and 10 s more are over, instead of waiting for Redis for ever', async () => {
      const s = own.stack;
      await own.stop();
      const worker = s.workers.shift()!;
      const at = Date.now();
      await worker.kill('SIGTERM');
      const took = Date.now() - at;
      assert.equal(worker.child.exitCode, 1, worker.logs.slice(-5).join('\n'));
      assert.ok(took >= 10_000 && took < 20_000, `exited ${took} ms after SIGTERM`);
      assert.ok(worker.logs.some((l) => l.includes('worker could not close its queues in time') && l.includes('"level":50')), worker.logs.slice(-5).join('\n'));
    });
  });

  describe('Postgres restarted', () => {
    const own = onOwnPostgres('faults-postgres');

    it('answers 503 (never 500) while Postgres is down, then recovers without a restart of API or worker', async () => {
      const s = own.stack;
      const first = await s.client.post('/api/task/v1', { message: textMessage('before') });
      await waitForStatus(s, first.body.task.id, 'completed');

      await own.pg.stop();
      const ready = await s.client.get('/_internal/v1/ready');
      assert.equal(ready.status, 503);
      assert.deepEqual(ready.body.data.failed, ['postgres']);
      for (const r of [await s.client.get(`/api/task/v1/${first.body.task.id}`), await s.client.post('/api/task/v1', { message: textMessage('during') })]) {
        assert.equal(r.status, 503, r.text);
        assert.equal(r.body.data.code, 'unavailable');
        assert.equal(r.headers.get('retry-after'), '5');
      }
      // A2A answers in JSON-RPC, saying why.
      const rpc = await s.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 'down', method: 'tasks/get', params: { id: first.body.task.id } });
      assert.equal(rpc.status, 200, rpc.text);
      assert.deepEqual(rpc.body, { jsonrpc: '2.0', id: 'down', error: { code: -32603, message: 'A backing service is unavailable; retry shortly', data: { code: 'unavailable' } } });
      // An outage is logged at warn with its reason, not as a fault (error, with a stack).
      const outageLogs = (await requestLogsThrough(s, rpc, { all: true })).filter((l) => l.includes('failed'));
      assert.ok(outageLogs.some((l) => l.includes('request failed: unavailable') && l.includes('"level":40')), outageLogs.join('\n'));
      assert.ok(outageLogs.some((l) => l.includes('a2a method failed: unavailable') && l.includes('"level":40')), outageLogs.join('\n'));
      assert.ok(!outageLogs.some((l) => l.includes('"level":50')), outageLogs.join('\n'));

      // Long enough for the Postgres listeners (API: key revocations, worker: push deliveries) to
      // fail several reconnects: each failed attempt used to schedule two, 2^n connections in all.
      await sleep(4000);
      await own.pg.start();
      await waitFor(async () => (await s.client.get('/_internal/v1/ready')).status === 200, 'ready again');
      await sleep(2500);
      const probe = new pgClient.Client(own.pg.url);
      await probe.connect();
      try {
        const { rows } = await probe.query(`select count(*)::int as n from pg_stat_activity where query ilike 'listen %'`);
        assert.ok(rows[0].n <= 3, `${rows[0].n} LISTEN connections after the outage`);
      } finally {
        await probe.end();
      }
      const got = await waitFor(async () => {
        const r = await s.client.get(`/api/task/v1/${first.body.task.id}`);
        return r.status === 200 && r;
      }, 'reads to work again');
      assert.equal(got.body.task.status, 'completed');
      const after = await s.client.post('/api/task/v1', { message: textMessage('after the restart') });
      assert.equal(after.status, 201, after.text);
      const done = await waitForStatus(s, after.body.task.id, 'completed');
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: after the restart' }]);
      const logged = await requestLogsThrough(s, after);
      assert.ok(logged.some((l) => l.includes('"status":503')), 'the outage\'s 503s are logged');
      assert.ok(!logged.some((l) => l.includes('"status":500')), 'no 500');
    });
  });

  describe('Postgres stopped while agent runs are queued and running', () => {
    const own = onOwnPostgres('faults-postgres-runs', { AGENT_ATTEMPTS: '2' });
    let handle: ReturnType<typeof openQueue> | undefined;
    let queue: Queue | undefined;
    before(() => {
      handle = openQueue(own.stack.env, 'agent-tasks');
      queue = handle.queue;
    });
    after(async () => {
      await handle?.close();
    });

    it('uses up no attempt: runs that meet the outage wait for Postgres, then every task completes once', async () => {
      const s = own.stack;
      const long = (await s.client.post('/api/task/v1', { message: textMessage('[sleep 3000] long') })).body.task.id;
      await waitFor(async () => (await s.client.get(`/api/task/v1/${long}`)).body.task.status === 'working', 'the long run to start');
      // Jobs wait in the paused queue while Postgres goes, then meet the outage at their start; the
      // long run meets it when it writes its end, 3 s after its start: Postgres stops within a second
      // of that and comes back 4 s after. Two attempts at 100 ms apart used to fail them all.
      await queue!.pause();
      const queued: string[] = [];
      for (const text of ['one', 'two', 'three']) queued.push((await s.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id);
      await own.pg.stop();
      await queue!.resume();
      await sleep(4000);
      await own.pg.start();

      for (const [i, id] of queued.entries()) {
        const done = await waitForStatus(s, id, 'completed');
        assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `Echo: ${['one', 'two', 'three'][i]}` }]);
        assert.deepEqual(await statusesOf(s.client, id), ['submitted', 'working', 'completed']);
      }
      const done = await waitForStatus(s, long, 'completed');
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: [sleep 3000] long' }]);
      const statuses = await statusesOf(s.client, long);
      assert.deepEqual([statuses[0], statuses.at(-1), statuses.filter((st: string) => st === 'completed').length], ['submitted', 'completed', 1], statuses.join(','));
      const paused = s.workers[0].logs.filter((l) => l.includes('the run goes back to the queue'));
      assert.ok(paused.some((l) => l.includes(long)), `the long run met the outage at its end: ${paused.join('\n')}`);
      assert.ok(queued.some((id) => paused.some((l) => l.includes(id))), `a queued run met the outage at its start: ${paused.join('\n')}`);
      assert.ok(!s.workers[0].logs.some((l) => l.includes('agent run failed')), 'no attempt failed');
    });
  });

  describe('Postgres gone silent (a partition: no answers, nothing closed)', () => {
    const own = behindServiceProxy('DATABASE_URL', { DB_QUERY_TIMEOUT_MS: '1000' });

    it('answers 503 once the client gives up on the silent connection, and drops it: every request after the partition heals is served', async () => {
      const s = own.stack;
      const created = await s.client.post('/api/task/v1', { message: textMessage('before the partition', 'agent') });
      assert.equal(created.status, 201, created.text);

      own.proxy.swallow();
      const started = Date.now();
      const during = await Promise.all([1, 2, 3].map(() => s.client.get(`/api/task/v1/${created.body.task.id}`)));
      for (const r of during) {
        assert.equal(r.status, 503, r.text);
        assert.equal(r.body.data.code, 'unavailable');
        assert.equal(r.headers.get('retry-after'), '5');
      }
      assert.ok(Date.now() - started < 15_000, `answered after ${Date.now() - started} ms`);

      // The statements sent into the hole never get an answer: connections that carry one must not serve again.
      own.proxy.forward();
      // A connection the pool began to open during the partition lost its startup to the hole (a real
      // partition would have left it unconnected) and fails at its connect timeout: a request waiting on
      // it may still get a 503. Once one is served, every one is.
      await waitFor(async () => (await s.client.get(`/api/task/v1/${created.body.task.id}`)).status === 200, 'a request to be served again', 20_000, 100);
      for (let i = 0; i < 10; i++) {
        const r = await s.client.get(`/api/task/v1/${created.body.task.id}`);
        assert.equal(r.status, 200, `request ${i + 1} after the partition: ${r.text}`);
      }
      const logged = await requestLogsThrough(s, await s.client.get(`/api/task/v1/${created.body.task.id}`), { all: true });
      assert.ok(!logged.some((l) => l.includes('"status":500')), 'no 500');
      // The outage's warn lines name Postgres (the reason is the driver's "Query read timeout").
      const outage = logged.filter((l) => l.includes('request failed: unavailable'));
      assert.ok(outage.some((l) => l.includes('"service":"postgres"')), outage.join('\n'));
    });
  });

  describe('Postgres gone silent while agent runs are in flight', () => {
    let stack: Stack | undefined;
    let proxy: Awaited<ReturnType<typeof behindProxy>>['proxy'] | undefined;
    // One attempt only: a run that meets the silence must go back to the queue, never fail its task.
    before(async () => {
      const via = await behindProxy(requireEnv('DATABASE_URL'));
      proxy = via.proxy;
      stack = await startStack({ DATABASE_URL: via.url, DB_QUERY_TIMEOUT_MS: '12000', AGENT_ATTEMPTS: '1' }, { workers: 1 });
    });
    after(async () => {
      await stack?.stop();
      await proxy?.close();
    });

    it('uses up no attempt: runs whose writes time out, wait for a connection or are refused as too busy all complete once it answers', async () => {
      const s = stack!;
      const texts = Array.from({ length: 10 }, (_, i) => `[sleep 5000] run ${i}`);
      const ids: string[] = [];
      for (const text of texts) ids.push((await s.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id);
      await waitFor(async () => {
        for (const id of ids) if ((await s.client.get(`/api/task/v1/${id}`)).body.status_message?.parts[0].text !== 'Working for 5000 ms') return false;
        return true;
      }, 'every run to be working');
      // Silent past the write batcher's wait (10 s) and the client's read timeout (14 s): the runs'
      // ends that reach an open connection go unanswered, and those queued behind them are refused.
      proxy!.swallow();
      try {
        for (const reason of ['The database is too busy to take this write', 'Query read timeout']) {
          await waitFor(async () => s.workers[0].logs.some((l) => l.includes(reason) && l.includes('task_id')), `a run to meet "${reason}"`, 40_000, 200);
        }
      } finally {
        proxy!.forward();
      }
      for (const [i, id] of ids.entries()) {
        const done = await waitForStatus(s, id, 'completed');
        assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `Echo: ${texts[i]}` }]);
      }
      const logs = s.workers[0].logs;
      assert.ok(!logs.some((l) => l.includes('agent run failed')), logs.filter((l) => l.includes('agent run failed')).join('\n'));
      const back = logs.filter((l) => l.includes('the run goes back to the queue'));
      for (const reason of ['Query read timeout', 'The database is too busy to take this write']) {
        assert.ok(back.some((l) => l.includes(reason)), `a run went back to the queue on "${reason}": ${back.join('\n')}`);
      }
    });
  });

  describe('Postgres answering while a run\'s statement times out in the client (its worker\'s event loop blocked)', () => {
    const marker = path.join(requireEnv('TEST_DATA_DIR'), `blocked-${randomUUID()}`);
    let stack: Stack | undefined;
    before(async () => {
      stack = await startStack({
        AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/signal-agent.ts'), SIGNAL_AGENT_MARKER: marker,
        DB_QUERY_TIMEOUT_MS: '2000', AGENT_ATTEMPTS: '1',
      }, { workers: 1 });
    });
    after(async () => {
      await stack?.stop();
    });

    it('fails the run as an attempt: the "Query read timeout" is no outage, as Postgres answers a probe', async () => {
      const s = stack!;
      const id = (await s.client.post('/api/task/v1', { message: textMessage('block while replying') })).body.task.id;
      await waitFor(async () => (await s.client.get(`/api/task/v1/${id}`)).body.status_message?.parts[0].text === 'waiting to reply', 'the run to wait');
      // The task's row held: the reply's statement waits in Postgres, so it is in flight when the agent blocks.
      const holder = await testDb().transaction();
      try {
        await holder('tasks').where({ id }).forUpdate().first();
        const waiting = () => lockWaits('select * from "tasks" where "id" = %for update');
        fs.writeFileSync(`${marker}.reply`, '');
        await waitFor(async () => (await waiting()) > 0, 'the reply to wait for the row', 20_000, 20);
        fs.writeFileSync(`${marker}.block`, '');
        // Postgres answers it (57014 at DB_QUERY_TIMEOUT_MS); the worker reads that only after its read timeout.
        await waitFor(async () => (await waiting()) === 0, 'Postgres to cancel the reply\'s statement', 20_000, 50);
      } finally {
        await holder.rollback();
      }
      const backToQueue = () => s.workers[0].logs.filter((l) => l.includes('the run goes back to the queue'));
      const task = await waitFor(async () => {
        const t = (await s.client.get(`/api/task/v1/${id}`)).body;
        return (t.task.status === 'failed' || backToQueue().length > 0) && t;
      }, 'the run to fail or go back to the queue', 60_000, 200);
      assert.deepEqual(backToQueue(), []);
      assert.equal(task.task.status, 'failed');
      assert.match(task.status_message.parts[0].text, /^The agent failed after 1 attempt\(s\): .*Query read timeout$/);
    });
  });

  describe('Redis gone silent (a partition: no answers, nothing closed)', () => {
    const own = behindServiceProxy('REDIS_URL', { DB_QUERY_TIMEOUT_MS: '1000' });

    it('answers 503 to what needs Redis once DB_QUERY_TIMEOUT_MS has passed, instead of hanging, and serves again once it answers', async () => {
      const s = own.stack;
      assert.equal((await s.client.get('/_internal/v1/queues')).status, 200);
      own.proxy.swallow();
      const started = Date.now();
      const queues = await s.client.get('/_internal/v1/queues');
      assert.equal(queues.status, 503, queues.text);
      assert.equal(queues.body.data.code, 'unavailable');
      assert.equal(queues.headers.get('retry-after'), '5');
      assert.ok(Date.now() - started < 10_000, `answered after ${Date.now() - started} ms`);
      own.proxy.forward();
      await waitFor(async () => (await s.client.get('/_internal/v1/queues')).status === 200, 'the queues again');
    });

    it('under many commands at once, makes its connection again once, not once per command that timed out: no MaxListenersExceededWarning on stderr', async () => {
      const s = own.stack;
      assert.equal((await s.client.get('/_internal/v1/queues')).status, 200);
      own.proxy.swallow();
      let during: Response[];
      try {
        // Each asks Redis for every queue's counts: some hundred commands go unanswered together.
        during = await Promise.all(Array.from({ length: 30 }, () => s.client.get('/_internal/v1/queues')));
      } finally {
        own.proxy.forward();
      }
      for (const r of during) assert.equal(r.status, 503, r.text);
      await waitFor(async () => (await s.client.get('/_internal/v1/queues')).status === 200, 'the queues again');
      const warnings = s.api.logs.filter((l) => l.includes('MaxListenersExceededWarning'));
      assert.deepEqual(warnings, []);
    });
  });

  describe('Redis gone silent, with a long DB_QUERY_TIMEOUT_MS', () => {
    const own = behindServiceProxy('REDIS_URL', { DB_QUERY_TIMEOUT_MS: '30000' });

    // Only the note to other processes' DEK caches needs Redis, and it is not worth a request's
    // DB_QUERY_TIMEOUT_MS: it is given 2 s, then logged as not sent.
    it('deletes an unused envelope key (200) without waiting DB_QUERY_TIMEOUT_MS for the cache note', async () => {
      const s = own.stack;
      const E = '/api/encryption/v1';
      assert.equal((await s.client.post(`${E}/envelope`, { type: 'local', file_name: 'silent.key' })).status, 201);
      own.proxy.swallow();
      try {
        const started = Date.now();
        const deleted = await s.client.delete(`${E}/envelope/silent.key`);
        assert.equal(deleted.status, 200, deleted.text);
        assert.ok(Date.now() - started < 6000, `answered after ${Date.now() - started} ms`);
        await waitFor(async () => s.api.logs.some((l) => l.includes('could not be told to drop their cached DEKs') && l.includes('no answer in 2000 ms')), 'the warn line');
        assert.equal((await s.client.get(`${E}/envelope/silent.key`)).status, 404);
      } finally {
        own.proxy.forward();
      }
    });
  });

  describe('Postgres connections reset under statements (a server killed, a proxy dropping them)', () => {
    const own = behindServiceProxy('DATABASE_URL');

    it('answers 503 and JSON-RPC unavailable (logged at warn, not as a fault), then serves again', async () => {
      const s = own.stack;
      const created = await s.client.post('/api/task/v1', { message: textMessage('before the reset', 'agent') });
      assert.equal(created.status, 201, created.text);
      const id = created.body.task.id;
      const locker = await testDb().transaction();
      let rest: Response;
      let rpc: Response;
      try {
        await locker.raw('lock table tasks in access exclusive mode');
        const answers = Promise.all([
          s.client.get(`/api/task/v1/${id}`),
          s.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 'reset', method: 'tasks/get', params: { id } }),
        ]);
        // Both statements are in Postgres, waiting for the lock, when their connections are cut.
        await waitFor(async () => {
          const { rows } = await testDb().raw(`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and pid <> pg_backend_pid()`);
          return rows[0].n >= 2;
        }, 'both statements to wait for the lock');
        own.proxy.reset();
        [rest, rpc] = await answers;
      } finally {
        await locker.rollback();
      }
      assert.equal(rest.status, 503, rest.text);
      assert.equal(rest.body.data.code, 'unavailable');
      assert.equal(rest.headers.get('retry-after'), '5');
      assert.equal(rpc.status, 200, rpc.text);
      assert.deepEqual(rpc.body, { jsonrpc: '2.0', id: 'reset', error: { code: -32603, message: 'A backing service is unavailable; retry shortly', data: { code: 'unavailable' } } });

      const again = await s.client.get(`/api/task/v1/${id}`);
      assert.equal(again.status, 200, again.text);
      const logs = (await requestLogsThrough(s, again, { all: true })).filter((l) => l.includes('failed'));
      assert.ok(logs.some((l) => l.includes('request failed: unavailable') && l.includes('"level":40')), logs.join('\n'));
      assert.ok(logs.some((l) => l.includes('a2a method failed: unavailable') && l.includes('"level":40')), logs.join('\n'));
      assert.ok(!logs.some((l) => l.includes('"level":50')), logs.join('\n'));
    });
  });

  describe('a statement that does not end (a lock held elsewhere)', () => {
    let stack: Stack | undefined;
    before(async () => {
      stack = await startStack({ DB_QUERY_TIMEOUT_MS: '1000' }, { workers: 0 });
    });
    after(async () => stack?.stop());

    it('answers 503 with Retry-After once DB_QUERY_TIMEOUT_MS has passed instead of hanging, and serves again once the lock goes', async () => {
      const s = stack!;
      const created = await s.client.post('/api/task/v1', { message: textMessage('locked out', 'agent') });
      assert.equal(created.status, 201);
      const locker = await testDb().transaction();
      try {
        await locker.raw('lock table tasks in access exclusive mode');
        const started = Date.now();
        const r = await s.client.get(`/api/task/v1/${created.body.task.id}`);
        assert.equal(r.status, 503, r.text);
        assert.equal(r.body.data.code, 'unavailable');
        assert.equal(r.headers.get('retry-after'), '5');
        assert.ok(Date.now() - started < 10_000, `answered after ${Date.now() - started} ms`);
      } finally {
        await locker.rollback();
      }
      const again = await s.client.get(`/api/task/v1/${created.body.task.id}`);
      assert.equal(again.status, 200, again.text);
      const logged = await requestLogsThrough(s, again);
      assert.ok(logged.some((l) => l.includes('"status":503')), 'the 503 is logged');
      assert.ok(!logged.some((l) => l.includes('"status":500')), 'no 500');
    });
  });

  describe('a worker stopped with SIGTERM during an agent run', () => {
    let stack: Stack | undefined;
    // One attempt only: handing a run back at shutdown must not use one up.
    before(async () => {
      stack = await startStack({ AGENT_ATTEMPTS: '1', WORKER_SHUTDOWN_GRACE_MS: '3000' }, { workers: 1 });
    });
    after(async () => stack?.stop());

    const running = (s: Stack, id: string, ms: number) => waitFor(async () => {
      const t = (await s.client.get(`/api/task/v1/${id}`)).body;
      return t.task.status === 'working' && t.status_message?.parts[0].text === `Working for ${ms} ms`;
    }, 'the agent to be running');

    it('finishes a short run before it exits (exit code 0)', async () => {
      const s = stack!;
      const id = (await s.client.post('/api/task/v1', { message: textMessage('[sleep 1500] short') })).body.task.id;
      await running(s, id, 1500);
      const worker = s.workers.shift()!;
      await worker.kill('SIGTERM');
      assert.equal(worker.child.exitCode, 0);
      assert.ok(worker.logs.some((l) => l.includes('worker shutting down')));
      assert.ok(worker.logs.some((l) => l.includes('"msg":"worker stopped"')));
      assert.ok(!worker.logs.some((l) => l.includes('handed back')), 'a run that ends within the grace period is not handed back');
      // No other worker exists: the stopping worker completed the run itself.
      const t = (await s.client.get(`/api/task/v1/${id}`)).body;
      assert.equal(t.task.status, 'completed');
      assert.deepEqual(t.status_message.parts, [{ type: 'text-part', text: 'Echo: [sleep 1500] short' }]);
    });

    it('hands a long run back after WORKER_SHUTDOWN_GRACE_MS, saying so; another worker completes it', async () => {
      const s = stack!;
      s.workers.push(await startWorker(s.env));
      const id = (await s.client.post('/api/task/v1', { message: textMessage('[sleep 7000] long') })).body.task.id;
      await running(s, id, 7000);
      const worker = s.workers.shift()!;
      const exited = worker.kill('SIGTERM');
      s.workers.push(await startWorker(s.env));
      await exited;
      assert.equal(worker.child.exitCode, 0);
      const handedBack = worker.logs.find((l) => l.includes('grace period over: agent runs handed back to the queue'));
      assert.ok(handedBack, worker.logs.slice(-10).join('\n'));
      assert.deepEqual([JSON.parse(handedBack).runs, JSON.parse(handedBack).grace_ms], [1, 3000]);
      assert.ok(worker.logs.some((l) => l.includes('"msg":"worker stopped"')));
      const done = await waitForStatus(s, id, 'completed', 90000);
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: [sleep 7000] long' }]);
    });
  });

  describe('a worker killed with SIGKILL during an agent run', () => {
    let stack: Stack | undefined;
    before(async () => {
      stack = await startStack({}, { workers: 1 });
    });
    after(async () => stack?.stop());

    it('loses no task: another worker takes the job over and completes it once', async () => {
      const s = stack!;
      const r = await s.client.post('/api/task/v1', { message: textMessage('[sleep 3000] hi') });
      assert.equal(r.status, 201);
      const id = r.body.task.id;
      // The agent is running once it has reported its progress message.
      await waitFor(async () => {
        const t = (await s.client.get(`/api/task/v1/${id}`)).body;
        return t.task.status === 'working' && t.status_message?.parts[0].text === 'Working for 3000 ms';
      }, 'the agent to be running');
      await s.workers[0].kill('SIGKILL');
      assert.equal(s.workers[0].child.signalCode, 'SIGKILL');
      s.workers.push(await startWorker(s.env));

      const done = await waitForStatus(s, id, 'completed');
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: [sleep 3000] hi' }]);
      const statuses = await statusesOf(s.client, id);
      assert.equal(statuses.filter((st: string) => st === 'completed').length, 1);
      assert.equal(statuses[0], 'submitted');
      assert.equal(statuses.at(-1), 'completed');
      assert.ok(statuses.slice(1, -1).every((st: string) => st === 'working'), statuses.join(','));
      const agentReplies = done.messages.filter((m: any) => m.role === 'agent' && m.parts[0].text.startsWith('Echo'));
      assert.equal(agentReplies.length, 1);
    });
  });

  describe('a fault of ours when a run starts', () => {
    let stack: Stack | undefined;
    before(async () => {
      // Postgres refuses to start the run of a task so marked: the statement fails as a bug in it would.
      await testDb().raw(`create or replace function tb_test_refuse_start() returns trigger language plpgsql as $$
        begin if new.status = 'working' and new.metadata->>'refuse_start' = 'yes' then raise exception 'refused by a test trigger'; end if; return new; end $$`);
      await testDb().raw('create trigger tb_test_refuse_start before update on tasks for each row execute function tb_test_refuse_start()');
      stack = await startStack({ AGENT_ATTEMPTS: '2', JOB_RECOVERY_MS: '1000' }, { workers: 1 });
    });
    after(async () => {
      await stack?.stop();
      await testDb().raw('drop trigger if exists tb_test_refuse_start on tasks');
      await testDb().raw('drop function if exists tb_test_refuse_start()');
    });

    it('is logged at error with the task id on every attempt, and the task fails once the job has failed for good', async () => {
      const s = stack!;
      const id = (await s.client.post('/api/task/v1', { message: textMessage('never starts'), metadata: { refuse_start: 'yes' } })).body.task.id;
      const failed = await waitForStatus(s, id, 'failed', 30000);
      assert.match(failed.status_message.parts[0].text, /^The agent run was lost: /);
      // The worker's log is buffered: its lines may come after the task's failure.
      const lines = await waitFor(async () => {
        const found = s.workers[0].logs.filter((l) => l.includes('agent run failed in the runtime'));
        return found.length >= 2 && found;
      }, 'a line for each attempt', 5000);
      assert.equal(lines.length, 2);
      for (const l of lines) {
        const entry = JSON.parse(l);
        assert.equal(entry.level, 50);
        assert.equal(entry.task_id, id);
        assert.equal(entry.attempts, 2);
        assert.match(entry.err.message, /refused by a test trigger/);
      }
      // A task without the mark runs as ever.
      const ok = (await s.client.post('/api/task/v1', { message: textMessage('starts') })).body.task.id;
      await waitForStatus(s, ok, 'completed');
    });
  });
});

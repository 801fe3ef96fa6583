// Work whose queue job Redis lost (here: the stack's queue keys deleted) is found by a worker's
// recovery pass, enqueued again and finished: key jobs, and agent runs of submitted tasks.
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import { Queue, UnrecoverableError, Worker } from 'bullmq';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { applyStatusChanges } from '../db/tasks.ts';
import { openQueue, ROOT, startWorker, statusesOf, testDb, textMessage, useStack, waitFor, withQueue, type Proc, type Stack } from './helpers/stack.ts';

const E = '/api/encryption/v1';

// A stack without workers (each test starts its own, with recovery passes every 300 ms), and a way
// to make Redis lose a queue's jobs once the outbox relay has handed them over.
function recoveryStack(env: Record<string, string> = {}) {
  const stack = useStack({ JOB_RECOVERY_MS: '300', ...env }, { workers: 0 });
  let redis: Redis;
  before(() => { redis = new Redis(process.env.REDIS_URL!); });
  after(() => redis?.disconnect());
  return {
    stack,
    async loseJobs(queue: string) {
      await waitFor(async () => Number((await testDb()('outbox').where({ queue }).count({ n: '*' }))[0].n) === 0, 'outbox relayed');
      const keys = await redis.keys(`${stack.env.QUEUE_PREFIX}:${queue}:*`);
      assert.ok(keys.length > 0, 'the queue jobs exist before the loss');
      await redis.del(...keys);
    },
  };
}

describe('key job recovery', () => {
  const ctx = recoveryStack();
  let worker: Proc;
  const recoveryLogs = () => worker.logs.filter((l) => l.includes('key job had no queue job'));
  // A worker started now (with `env` over the stack's) finds the lost job and runs it to its end.
  const recoverWith = async (jobId: string, what: string, env: Record<string, string> = {}) => {
    worker = await startWorker({ ...ctx.stack.env, ...env });
    ctx.stack.workers.push(worker);
    return waitFor(async () => {
      const r = await ctx.stack.client.get(`${E}/job/${jobId}`);
      return r.body.status === 'completed' && r.body;
    }, what, 20000, 100);
  };

  it('re-enqueues a migration whose queue job was lost, once, and it completes', async () => {
    const c = ctx.stack.client;
    for (const f of ['src.key', 'dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const deks: string[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await c.post(`${E}/envelope/src.key/dek`, {});
      assert.equal(r.status, 201, r.text);
      deks.push(r.body.id);
    }
    const started = await c.post(`${E}/envelope/src.key/migrate`, { to_envelope_encryption_key_id: 'dst.key' });
    assert.equal(started.status, 202);
    const jobId = started.body.id;

    // The relay has handed the job to BullMQ; then Redis loses it.
    await ctx.loseJobs('key-jobs');

    // A worker started now finds it lost and runs it (slowly: small batches with pauses, so that
    // recovery passes run while the job does).
    const done = await recoverWith(jobId, 'the recovered job to complete', { DEK_MIGRATION_BATCH: '2', DEK_MIGRATION_PAUSE_MS: '100' });
    assert.equal(done.done, 20);
    assert.equal(done.failed, 0);
    for (const id of deks) assert.equal((await testDb()('deks').where({ id }).first()).envelope_key_id, 'dst.key');
    const recoveries = recoveryLogs();
    assert.equal(recoveries.length, 1, recoveries.join('\n'));
    assert.ok(recoveries[0].includes(jobId));

    // Finished jobs are left alone by later passes.
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(recoveryLogs().length, 1);
  });

  it('leaves alone a job that a queue job carries, through several recovery passes', async () => {
    const c = ctx.stack.client;
    const started = await c.post(`${E}/envelope/dst.key/migrate`, { to_envelope_encryption_key_id: 'src.key' });
    assert.equal(started.status, 202);
    const t0 = Date.now();
    await waitFor(async () => (await c.get(`${E}/job/${started.body.id}`)).body.status === 'completed', 'the migration back', 20000, 100);
    assert.ok(Date.now() - t0 > 900, 'the job ran across several recovery passes');
    assert.equal(recoveryLogs().length, 1);
  });

  it('re-enqueues a lost job again when its earlier recovered queue job failed without finishing it', async () => {
    const c = ctx.stack.client;
    await worker.stop();
    ctx.stack.workers = ctx.stack.workers.filter((w) => w !== worker);
    const started = await c.post(`${E}/envelope/src.key/migrate`, { to_envelope_encryption_key_id: 'dst.key' });
    assert.equal(started.status, 202);
    const jobId = started.body.id;
    await ctx.loseJobs('key-jobs');
    // An earlier recovery's queue job, failed while the row stayed unfinished (its failure could not
    // be recorded: Postgres was away), as BullMQ keeps failed jobs for a while.
    await withQueue(ctx.stack.env, 'key-jobs', async (queue) => {
      await queue.add('migrate-deks', { job_id: jobId }, { jobId: `recovered-${jobId}` });
      const refusing = new Worker('key-jobs', async () => { throw new UnrecoverableError('no database'); }, queue.opts);
      await waitFor(async () => (await queue.getJobState(`recovered-${jobId}`)) === 'failed', 'the earlier recovered job to fail');
      await refusing.close();
    });
    assert.equal((await c.get(`${E}/job/${jobId}`)).body.status, 'queued');

    const done = await recoverWith(jobId, 'the job recovered again to complete');
    assert.equal(done.done, 20);
    assert.equal(recoveryLogs().length, 1);
  });
});

describe('agent run recovery', () => {
  const ctx = recoveryStack();

  it('runs submitted tasks whose run job was lost, each once; a task opened by an agent message stays as it is', async () => {
    const c = ctx.stack.client;
    const ids: string[] = [];
    for (const text of ['one', 'two', 'three']) {
      const r = await c.post('/api/task/v1', { message: { role: 'user', parts: [{ type: 'text-part', text }] } });
      assert.equal(r.status, 201);
      ids.push(r.body.task.id);
    }
    const agentOnly = await c.post('/api/task/v1', { message: { role: 'agent', parts: [{ type: 'text-part', text: 'a note' }] } });
    // A user message to a task opened by an agent message does not start a run, then or on recovery.
    const agentFirst = await c.post('/api/task/v1', { message: { role: 'agent', parts: [{ type: 'text-part', text: 'opened by an agent' }] } });
    assert.equal((await c.post(`/api/task/v1/${agentFirst.body.task.id}/message`, textMessage('and then a user'))).status, 201);
    await ctx.loseJobs('agent-tasks');

    const worker = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(worker);
    for (const id of ids) {
      await waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.task.status === 'completed', `task ${id} to complete`, 20000, 100);
      assert.deepEqual(await statusesOf(c, id), ['submitted', 'working', 'completed']);
    }
    // A task created now runs from its own job; later passes add nothing.
    const fresh = await c.post('/api/task/v1', { message: { role: 'user', parts: [{ type: 'text-part', text: 'fresh' }] } });
    await waitFor(async () => (await c.get(`/api/task/v1/${fresh.body.task.id}`)).body.task.status === 'completed', 'the fresh task');
    await new Promise((r) => setTimeout(r, 1000));
    const recovered = worker.logs.filter((l) => l.includes('agent run had no queue job'));
    assert.equal(recovered.length, 3, recovered.join('\n'));
    for (const id of ids) assert.ok(recovered.some((l) => l.includes(id)));
    for (const t of [agentOnly, agentFirst]) assert.equal((await c.get(`/api/task/v1/${t.body.task.id}`)).body.task.status, 'submitted');
  });
});

describe('a working task whose run job was lost', () => {
  // BullMQ's own stalled-job check would otherwise move the dead worker's job back in about a second,
  // racing the loss this test makes: here only recovery may bring that run back.
  const ctx = recoveryStack({ WORKER_LOCK_MS: '60000', WORKER_STALLED_CHECK_MS: '60000' });

  it('runs again a run whose worker died with its job, carries on a run still going without a second copy, and leaves a task a client set working alone', async () => {
    const c = ctx.stack.client;
    const started = (id: string) => waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.status_message?.parts[0].text?.startsWith('Working for'), `the run of ${id} to start`);
    const first = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(first);
    // Long enough to be still running when the kill comes on a loaded machine; its run again sleeps as long.
    const died = (await c.post('/api/task/v1', { message: textMessage('[sleep 10000] its worker dies') })).body.task.id;
    await started(died);
    await first.kill('SIGKILL');
    // A task whose run asked for input, then set working by a client: it drives the task, not a run.
    const asked = (await c.post('/api/task/v1', { message: textMessage('[input] a question') })).body.task.id;

    const worker = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(worker);
    await waitFor(async () => (await c.get(`/api/task/v1/${asked}`)).body.task.status === 'input-required', 'the question');
    assert.equal((await c.put(`/api/task/v1/${asked}`, { status: 'working' })).status, 200);
    const going = (await c.post('/api/task/v1', { message: textMessage('[sleep 3000] still going') })).body.task.id;
    await started(going);
    await ctx.loseJobs('agent-tasks');

    for (const id of [died, going]) {
      await waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.task.status === 'completed', `task ${id} to complete`, 30000, 100);
      assert.deepEqual(await statusesOf(c, id), ['submitted', 'working', 'working', 'completed'], 'one run, its progress once');
    }
    // Passes every 300 ms over 1.5 s more: the client's working task keeps its state and gets no run.
    await new Promise((r) => setTimeout(r, 1500));
    assert.deepEqual(await statusesOf(c, asked), ['submitted', 'working', 'input-required', 'working']);
    const recovered = worker.logs.filter((l) => l.includes('agent run had no queue job'));
    assert.equal(recovered.length, 1, recovered.join('\n'));
    assert.ok(recovered[0].includes(died), 'the run whose worker died is the one enqueued again');
    assert.ok(!worker.logs.some((l) => l.includes('its job started again')), 'the run going on was not started a second time');
  });
});

describe("a lost run's failure", () => {
  const ctx = recoveryStack();

  it('fails the task the run had or was owed, not one a client set waiting and answered since', async () => {
    const c = ctx.stack.client;
    const fail = (taskId: string, lostRun: string) => applyStatusChanges(testDb(), [{
      taskId, to: 'failed', from: ['submitted', 'working', 'input-required', 'auth-required'], at: new Date(), lostRun,
      timeline: [{ id: randomUUID(), task_id: taskId, created_at: new Date().toISOString(), event_payload: { type: 'task-status-update', status: 'failed' } }],
    }]);
    // Owed a run for its opening message (no worker runs here).
    const owed = (await c.post('/api/task/v1', { message: textMessage('never ran') })).body;
    assert.equal((await fail(owed.task.id, owed.message.id))[0].task?.status, 'failed');
    // Working under its run (as a worker leaves it), then set waiting by a client, who answered.
    const taken = (await c.post('/api/task/v1', { message: textMessage('ran once') })).body;
    await testDb()('tasks').where({ id: taken.task.id }).update({ status: 'working', run_message_id: taken.message.id, run_due_message_id: null });
    assert.equal((await c.put(`/api/task/v1/${taken.task.id}`, { status: 'input-required' })).status, 200);
    const answer = (await c.post(`/api/task/v1/${taken.task.id}/message`, textMessage('the answer'))).body.message;
    assert.equal((await fail(taken.task.id, taken.message.id))[0].task, undefined, 'the first run no longer has the task');
    assert.equal((await c.get(`/api/task/v1/${taken.task.id}`)).body.task.status, 'input-required');
    // The answer's run, lost, fails it.
    assert.equal((await fail(taken.task.id, answer.id))[0].task?.status, 'failed');
  });
});

describe('run marks left by processes of a release before migration 0013', () => {
  const ctx = recoveryStack();

  it('clears marks of tasks no longer owed a run, never runs a mark older than the last status change, and an answer replaces one', async () => {
    const c = ctx.stack.client;
    const due = async (id: string) => (await testDb()('tasks').where({ id }).first()).run_due_message_id;
    // Run and completed by an old worker, which left the mark of its opening message.
    const ran = (await c.post('/api/task/v1', { message: textMessage('old run') })).body;
    await testDb()('tasks').where({ id: ran.task.id }).update({ status: 'completed', status_timestamp: new Date() });
    assert.equal(await due(ran.task.id), ran.message.id);
    // Waiting for input since an old worker's change, its mark from before that change.
    const waiting = (await c.post('/api/task/v1', { message: textMessage('opened by an agent', 'agent') })).body;
    const id = waiting.task.id;
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'working' })).status, 200);
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'input-required', message: textMessage('what next?', 'agent') })).status, 200);
    await testDb()('tasks').where({ id }).update({ run_due_message_id: waiting.message.id });
    // The same, answered before any worker of this release saw it: the answer replaces the stale mark.
    const replaced = (await c.post('/api/task/v1', { message: textMessage('opened by an agent too', 'agent') })).body;
    assert.equal((await c.put(`/api/task/v1/${replaced.task.id}`, { status: 'working' })).status, 200);
    assert.equal((await c.put(`/api/task/v1/${replaced.task.id}`, { status: 'input-required', message: textMessage('and now?', 'agent') })).status, 200);
    await testDb()('tasks').where({ id: replaced.task.id }).update({ run_due_message_id: replaced.message.id });
    const replacing = (await c.post(`/api/task/v1/${replaced.task.id}/message`, textMessage('an early answer'))).body.message;
    assert.equal(await due(replaced.task.id), replacing.id);
    await ctx.loseJobs('agent-tasks');

    const worker = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(worker);
    await waitFor(async () => (await due(ran.task.id)) === null, 'the mark of the completed task to be cleared');
    await waitFor(async () => (await due(id)) === null, 'the mark from before the last status change to be cleared');
    await waitFor(async () => (await c.get(`/api/task/v1/${replaced.task.id}`)).body.task.status === 'completed', 'the early answer to be run by recovery');
    assert.ok(!worker.logs.some((l) => l.includes('agent run had no queue job') && l.includes(id)), 'the stale mark was not run');
    assert.equal((await c.get(`/api/task/v1/${id}`)).body.task.status, 'input-required');

    // With no worker running, an answer marks the task again (it would replace a stale mark too); its job lost too, recovery runs it.
    await worker.stop();
    ctx.stack.workers.splice(ctx.stack.workers.indexOf(worker), 1);
    const answer = await c.post(`/api/task/v1/${id}/message`, textMessage('the answer'));
    assert.equal(answer.status, 201);
    assert.equal(await due(id), answer.body.message.id);
    await ctx.loseJobs('agent-tasks');
    const next = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(next);
    await waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.task.status === 'completed', 'the answer to be run');
    assert.match((await c.get(`/api/task/v1/${id}`)).body.status_message.parts[0].text, /: the answer$/);
    assert.ok(next.logs.some((l) => l.includes('agent run had no queue job') && l.includes(id)));
    assert.equal(await due(id), null);
  });
});

describe('a lost continuation', () => {
  const ctx = recoveryStack();

  // A task opened by an agent message, moved to input-required, then answered by the user: the
  // answer's run job is what Redis loses.
  async function answeredTask(c: Stack['client']) {
    const id = (await c.post('/api/task/v1', { message: textMessage('opened by an agent', 'agent') })).body.task.id;
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'working' })).status, 200);
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'input-required', message: textMessage('what next?', 'agent') })).status, 200);
    assert.equal((await c.post(`/api/task/v1/${id}/message`, textMessage('first answer'))).status, 201);
    return id;
  }

  it('is run again by recovery: the answer that waited completes the task, once; the next message continues a task whose run was lost too', async () => {
    const c = ctx.stack.client;
    const alone = await answeredTask(c);
    const followed = await answeredTask(c);
    await ctx.loseJobs('agent-tasks');
    assert.equal((await c.post(`/api/task/v1/${followed}/message`, textMessage('second answer'))).status, 201);

    const worker = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(worker);
    for (const id of [alone, followed]) {
      await waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.task.status === 'completed', `task ${id} to complete`, 20000, 100);
      assert.deepEqual(await statusesOf(c, id), ['submitted', 'working', 'input-required', 'working', 'completed'], 'one run');
    }
    assert.match((await c.get(`/api/task/v1/${alone}`)).body.status_message.parts[0].text, /: first answer$/);
    assert.match((await c.get(`/api/task/v1/${followed}`)).body.status_message.parts[0].text, /: (first|second) answer$/);
    const recovered = worker.logs.filter((l) => l.includes('agent run had no queue job'));
    assert.ok(recovered.some((l) => l.includes(alone)), recovered.join('\n'));
    // Later passes leave the finished tasks alone.
    await new Promise((r) => setTimeout(r, 1000));
    assert.deepEqual(worker.logs.filter((l) => l.includes('agent run had no queue job')), recovered);
  });
});

describe('a run whose job failed without ending its task', () => {
  const ctx = recoveryStack();
  let handle: ReturnType<typeof openQueue>;
  let queue: Queue;
  before(() => {
    handle = openQueue(ctx.stack.env, 'agent-tasks');
    queue = handle.queue;
  });
  after(async () => {
    await handle.close();
  });
  const stateOf = async (taskId: string) => {
    const jobs = await queue.getJobs(['failed', 'active', 'wait', 'delayed', 'completed']);
    const job = jobs.find((j) => j?.data.task_id === taskId);
    return job ? queue.getJobState(job.id!) : 'missing';
  };
  const failedWith = async (c: Stack['client'], id: string) => {
    await waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.task.status === 'failed', `task ${id} to fail`, 20000, 100);
    return (await c.get(`/api/task/v1/${id}`)).body;
  };

  it('fails the task, saying so: a submitted task whose job failed before its start, and a working one whose worker died too often; a run going on is left alone', async () => {
    const c = ctx.stack.client;
    // A worker of another deployment that cannot write tasks: it fails every job it takes, and
    // fails a stalled job at once (maxStalledCount 0), as happens to a job whose workers die too often.
    const refusing = () => new Worker('agent-tasks', async () => { throw new UnrecoverableError('no database'); },
      { ...queue.opts, stalledInterval: 300, maxStalledCount: 0 });
    let other = refusing();
    const submitted = (await c.post('/api/task/v1', { message: textMessage('never started') })).body.task.id;
    await waitFor(async () => (await stateOf(submitted)) === 'failed', 'the job to fail');
    await other.close();

    const first = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(first);
    const working = (await c.post('/api/task/v1', { message: textMessage('[sleep 60000] long') })).body.task.id;
    await waitFor(async () => (await c.get(`/api/task/v1/${working}`)).body.status_message?.parts[0].text === 'Working for 60000 ms', 'the long run to start');
    await first.kill('SIGKILL');
    other = refusing();
    await waitFor(async () => (await stateOf(working)) === 'failed', 'the stalled job to fail', 20000);
    await other.close();

    const worker = await startWorker(ctx.stack.env);
    ctx.stack.workers.push(worker);
    const running = (await c.post('/api/task/v1', { message: textMessage('[sleep 2500] meanwhile') })).body.task.id;
    const never = await failedWith(c, submitted);
    assert.deepEqual(never.status_message.parts, [{ type: 'text-part', text: 'The agent run was lost: its queue job failed without ending the task' }]);
    assert.deepEqual(await statusesOf(c, submitted), ['submitted', 'failed']);
    const died = await failedWith(c, working);
    assert.match(died.status_message.parts[0].text, /^The agent run was lost: /);
    assert.deepEqual(await statusesOf(c, working), ['submitted', 'working', 'working', 'failed']);
    // Recovery passes every 300 ms saw the 2.5 s run working: its job is active, not failed.
    await waitFor(async () => (await c.get(`/api/task/v1/${running}`)).body.task.status === 'completed', 'the run going on to complete', 20000, 100);
    const logged = worker.logs.filter((l) => l.includes('agent run job had failed'));
    assert.equal(logged.length, 2, logged.join('\n'));
    assert.ok(logged.some((l) => l.includes(submitted) && l.includes('no database')), 'the job\'s reason is logged');
    assert.ok(logged.some((l) => l.includes(working) && l.includes('stalled more than allowable limit')), 'the job\'s reason is logged');
  });
});

// A key job started (`start` answers its id) with one worker, which is frozen past its lock once a
// batch is done while a second worker takes the job over and ends it, then woken: each must log the
// job's end once, the second as `<what> finished`, the first as `<what> ended by another worker`.
async function stalledTakeover(stack: ReturnType<typeof useStack>, start: () => Promise<string>, what: string): Promise<void> {
  const c = stack.client;
  const first = await startWorker(stack.env);
  stack.workers.push(first);
  const jobId = await start();
  await waitFor(async () => (await c.get(`${E}/job/${jobId}`)).body.done >= 2, 'first batch committed', 20000, 20);
  first.child.kill('SIGSTOP');
  const second = await startWorker(stack.env);
  stack.workers.push(second);
  await waitFor(async () => (await c.get(`${E}/job/${jobId}`)).body.status === 'completed', 'completed by the second worker', 30000, 100);
  first.child.kill('SIGCONT');
  const about = (p: Proc) => p.logs.filter((l) => l.includes(jobId) && new RegExp(`${what} (finished|ended by another worker)`).test(l));
  await waitFor(async () => about(first).length > 0, 'the first worker meets the ended job', 20000, 50);
  assert.deepEqual(about(second).map((l) => JSON.parse(l).msg), [`${what} finished`]);
  assert.deepEqual(about(first).map((l) => JSON.parse(l).msg), [`${what} ended by another worker`], about(first).join('\n'));
  assert.equal(JSON.parse(about(first)[0]).status, 'completed');
}

describe('a migration taken over from a worker that stalled', () => {
  // A 2 s pause between batches: the first worker is frozen in it, past its lock, while the second
  // takes the job over and ends it.
  const stack = useStack({ WORKER_LOCK_MS: '1000', WORKER_STALLED_CHECK_MS: '500', DEK_MIGRATION_BATCH: '2', DEK_MIGRATION_PAUSE_MS: '2000' }, { workers: 0 });

  it('is logged finished once, by the worker that finished it; the stalled one says another ended it', async () => {
    const c = stack.client;
    for (const f of ['stall-src.key', 'stall-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    for (let i = 0; i < 6; i++) assert.equal((await c.post(`${E}/envelope/stall-src.key/dek`, {})).status, 201);
    await stalledTakeover(stack, async () => {
      const started = await c.post(`${E}/envelope/stall-src.key/migrate`, { to_envelope_encryption_key_id: 'stall-dst.key' });
      assert.equal(started.status, 202, started.text);
      return started.body.id;
    }, 'DEK migration');
  });
});

describe('an alias rotation taken over from a worker that stalled', () => {
  const stack = useStack({ WORKER_LOCK_MS: '1000', WORKER_STALLED_CHECK_MS: '500', ALIAS_ROTATION_BATCH: '2', ALIAS_ROTATION_PAUSE_MS: '2000' }, { workers: 0 });

  it('is logged finished once, by the worker that finished it; the stalled one says another ended it', async () => {
    const c = stack.client;
    for (let i = 0; i < 6; i++) assert.equal((await c.post('/api/secret/v1', { key: `stall/s${i}`, raw_value: `v${i}` })).status, 201);
    await stalledTakeover(stack, async () => {
      const started = await c.post(`${E}/dek/alias/default/rotate`, {});
      assert.equal(started.status, 202, started.text);
      return started.body.id;
    }, 'alias rotation');
    const read = await c.get('/api/secret/v1/list-decrypted?page_size=100');
    assert.deepEqual(read.body.secrets.map((s: any) => s.decrypted_value).sort(), ['v0', 'v1', 'v2', 'v3', 'v4', 'v5']);
  });
});

describe('an agent run taken over from a worker that stalled', () => {
  const marker = path.join(process.env.TEST_DATA_DIR!, `takeover-${randomUUID()}.marker`);
  const stack = useStack({
    AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/signal-agent.ts'), SIGNAL_AGENT_MARKER: marker,
    WORKER_LOCK_MS: '1000', WORKER_STALLED_CHECK_MS: '500',
  }, { workers: 0 });
  after(() => fs.rmSync(`${marker}.reply`, { force: true }));

  it('is aborted once it wakes, and only the copy that took the task over replies: one reply, not two', async () => {
    const c = stack.client;
    const first = await startWorker(stack.env);
    stack.workers.push(first);
    const id = (await c.post('/api/task/v1', { message: textMessage('reply when told') })).body.task.id;
    const progress = async () => (await c.get(`/api/task/v1/${id}/timeline?page_size=100`)).body.items
      .filter((i: any) => i.event_payload.type === 'task-status-update' && i.event_payload.status === 'working').length;
    await waitFor(async () => (await progress()) >= 2, 'the first worker\'s run waiting to reply', 20000, 50);
    // Frozen past its lock: the second worker takes the job again and its run waits to reply too.
    first.child.kill('SIGSTOP');
    const second = await startWorker(stack.env);
    stack.workers.push(second);
    await waitFor(async () => (await progress()) >= 3, 'the second worker\'s run waiting to reply', 20000, 50);
    first.child.kill('SIGCONT');
    // Both were working under the same message: the first, woken, went on to reply as well.
    await waitFor(async () => first.logs.some((l) => l.includes(id) && l.includes('agent run aborted: its job taken again elsewhere')), 'the first copy aborted', 10000, 50);
    fs.writeFileSync(`${marker}.reply`, '');
    await waitFor(async () => (await c.get(`/api/task/v1/${id}`)).body.task.status === 'completed', 'the task completed', 20000, 50);
    const history = (await c.get(`/api/task/v1/${id}`)).body.messages;
    const replies = history.filter((m: any) => m.role === 'agent' && m.parts.some((p: any) => p.text === 'after the wait'));
    assert.equal(replies.length, 1, JSON.stringify(history));
    assert.equal(fs.readFileSync(marker, 'utf8'), 'reply done');
  });
});

// Task execution through the whole pipeline: API -> outbox -> BullMQ -> a real worker process.
import assert from 'node:assert/strict';
import { getTask } from '../db/tasks.ts';
import { appendMessage } from '../domain/tasks.ts';
import type { UnitOfWork } from '../domain/unit-of-work.ts';
import { lockWaits, startStack, startWorker, statusesOf, testDb, textMessage, useStack, waitFor, withQueue, type Proc, type Stack } from './helpers/stack.ts';

const ATTEMPTS = 3;

describe('job pipeline: task execution through a real worker', function () {
  this.timeout(120000);
  const stack = useStack({ AGENT_ATTEMPTS: String(ATTEMPTS), WORKER_SHUTDOWN_GRACE_MS: '1000' });
  type Client = Stack['client'];
  const get = async (id: string, client: Client = stack.client) => (await client.get(`/api/task/v1/${id}`)).body;
  const waitForStatus = (id: string, status: string, client: Client = stack.client) =>
    waitFor(async () => { const t = await get(id, client); return t.task.status === status && t; }, `task ${id} to be ${status}`, 60000, 100);
  // Four turns the demo agent answers with input-required (turn(1) opens the task), then 'the last':
  // the completed task, whose final echo counts the user turns its run was handed.
  const converse = async (client: Client, turn: (n: number) => Record<string, unknown>) => {
    const id = (await client.post('/api/task/v1', { message: turn(1) })).body.task.id;
    const answered = (n: number) => waitFor(async () => {
      const t = await get(id, client);
      return t.task.status === 'input-required' && t.messages.length === 2 * n;
    }, `turn ${n} answered`, 30000, 50);
    for (let n = 2; n <= 4; n++) {
      await answered(n - 1);
      assert.equal((await client.post(`/api/task/v1/${id}/message`, turn(n))).status, 201);
    }
    await answered(4);
    assert.equal((await client.post(`/api/task/v1/${id}/message`, textMessage('the last'))).status, 201);
    return waitForStatus(id, 'completed', client);
  };

  it('runs a created task to completed with the agent reply in the timeline', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('hello pipeline') });
    assert.equal(created.status, 201);
    const id = created.body.task.id;
    const done = await waitForStatus(id, 'completed');
    assert.equal(done.status_message.role, 'agent');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: hello pipeline' }]);
    assert.deepEqual(await statusesOf(stack.client, id), ['submitted', 'working', 'completed']);
  });

  it('retries a failing agent AGENT_ATTEMPTS times, then fails the task with a message saying why', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('[fail] please') });
    const id = created.body.task.id;
    const failed = await waitForStatus(id, 'failed');
    assert.equal(failed.status_message.role, 'agent');
    const why = failed.status_message.parts[0].text;
    assert.match(why, new RegExp(`failed after ${ATTEMPTS} attempt\\(s\\)`));
    assert.match(why, /asked to fail/);
    assert.deepEqual(await statusesOf(stack.client, id), ['submitted', 'working', 'failed']);

    // The queue ran the job ATTEMPTS times.
    const jobs = await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['completed', 'failed']));
    const job = jobs.find((j) => j?.data.task_id === id);
    assert.ok(job, 'the job of the task');
    assert.equal(job.attemptsStarted, ATTEMPTS);
  });

  it('multi-turn through REST: [input] -> input-required, a user message continues it to completed', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('[input] start') });
    const id = created.body.task.id;
    const asked = await waitForStatus(id, 'input-required');
    assert.deepEqual(asked.status_message.parts, [{ type: 'text-part', text: 'I need more input: what should I echo next?' }]);

    const sent = await stack.client.post(`/api/task/v1/${id}/message`, textMessage('the answer'));
    assert.equal(sent.status, 201);
    const done = await waitForStatus(id, 'completed');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo (turn 2): the answer' }]);
    assert.deepEqual(await statusesOf(stack.client, id), ['submitted', 'working', 'input-required', 'working', 'completed']);
    assert.deepEqual(done.messages.map((m: any) => m.role), ['user', 'agent', 'user', 'agent']);
  });

  it('hands a run the newest messages within AGENT_HISTORY_MAX_BYTES, its own message always', async () => {
    const small = await startStack({ AGENT_HISTORY_MAX_BYTES: '4096' }, { workers: 1 });
    try {
      const done = await converse(small.client, (n) => textMessage(`[input] turn ${n} ${'x'.repeat(1500)}`));
      // Five user messages, about 1.5 kB each but the last: the newest three, with the agent's
      // answers between them, fit in 4,096 bytes; the one before would not.
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo (turn 3): the last' }]);
      assert.equal(done.messages.length, 10);
    } finally {
      await small.stop();
    }
  });

  it('weighs each JSON value of a message in AGENT_HISTORY_MAX_BYTES (33 bytes), not its text alone', async () => {
    const small = await startStack({ AGENT_HISTORY_MAX_BYTES: '40000' }, { workers: 1 });
    try {
      // About 3 kB of text each, but 1,000 values more: some 35 kB once weighed.
      const done = await converse(small.client, (n) => ({ role: 'user', parts: [{ type: 'text-part', text: `[input] turn ${n}` }, { type: 'data-part', data: { zeros: new Array(1000).fill(0) } }] }));
      // 12 kB of text would all fit; weighed, the newest dense message alone does.
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo (turn 2): the last' }]);
    } finally {
      await small.stop();
    }
  });

  it('hands a run its own message even when that alone is over AGENT_HISTORY_MAX_BYTES', async () => {
    const small = await startStack({ AGENT_HISTORY_MAX_BYTES: '1024', AGENT_KIND: 'module', AGENT_MODULE: './test/fixtures/history-agent.mjs' }, { workers: 1 });
    try {
      const ask = async (text: string) => {
        const id = (await small.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id;
        return (await waitForStatus(id, 'completed', small.client)).status_message.parts[0].text;
      };
      assert.equal(await ask(`big ${'y'.repeat(3000)}`), 'history: 1; own message in it: true; newest: true');
      assert.equal(await ask('small'), 'history: 1; own message in it: true; newest: true');
    } finally {
      await small.stop();
    }
  });

  it('hands a run its own message when more messages than its history holds (200) came after it while it waited', async () => {
    const quiet = await startStack({ AGENT_KIND: 'module', AGENT_MODULE: './test/fixtures/history-agent.mjs', RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
    let worker: Proc | undefined;
    try {
      const id = (await quiet.client.post('/api/task/v1', { message: textMessage('the first') })).body.task.id;
      for (let i = 0; i < 201; i += 20) {
        const sent = await Promise.all(Array.from({ length: Math.min(20, 201 - i) }, (_, j) => quiet.client.post(`/api/task/v1/${id}/message`, textMessage(`later ${i + j}`))));
        for (const r of sent) assert.equal(r.status, 201, r.text);
      }
      worker = await startWorker(quiet.env);
      const done = await waitForStatus(id, 'completed', quiet.client);
      // The newest 200 and its own, the first.
      assert.equal(done.status_message.parts[0].text, 'history: 201; own message in it: true; newest: false');
    } finally {
      await worker?.stop();
      await quiet.stop();
    }
  });

  it("a run taken again sees the reply its previous take wrote while the new take's claim waited for the task", async () => {
    const quiet = await startStack({ AGENT_KIND: 'module', AGENT_MODULE: './test/fixtures/history-agent.mjs' }, { workers: 0 });
    let worker: Proc | undefined;
    const trx = await testDb().transaction();
    try {
      const id = (await quiet.client.post('/api/task/v1', { message: textMessage('taken twice') })).body.task.id;
      const messageId = (await get(id, quiet.client)).messages[0].id;
      // A take of the run's job that stalled: the task working under its message, the job back in the queue.
      await testDb()('tasks').where({ id }).update({ status: 'working', run_message_id: messageId, run_due_message_id: null });
      // That take's ctx.reply holds the task's row as it writes (whileActive): the new take reads the
      // task and its history, then its claim waits for the row.
      const locked = (await getTask(trx, id, true))!;
      worker = await startWorker(quiet.env);
      await waitFor(async () => (await lockWaits('update "tasks" set "run_attempt"%')) === 1, 'the new take\'s claim to wait for the row', 30000, 50);
      const uow = { trx, publish: () => undefined } as unknown as UnitOfWork;
      const { message: reply } = await appendMessage(uow, locked, { role: 'agent', parts: [{ type: 'text-part', text: 'said by the take before' }] }, 1024 * 1024);
      await trx.commit();
      const done = await waitForStatus(id, 'completed', quiet.client);
      // Before, the new take's history was the one read before its claim: its own message alone.
      assert.equal(done.status_message.parts[0].text, 'history: 2; own message in it: true; newest: false');
      assert.deepEqual(done.status_message.parts[1].data, { history: [messageId, reply.id] });
    } finally {
      if (!trx.isCompleted()) await trx.rollback();
      await worker?.stop();
      await quiet.stop();
    }
  });

  it('two user messages to an interrupted task at once start one run; the other run ends without running', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('[input] twice') })).body.task.id;
    await waitForStatus(id, 'input-required');
    const sent = await Promise.all(['[sleep 300] one', '[sleep 300] two'].map((t) => stack.client.post(`/api/task/v1/${id}/message`, textMessage(t))));
    for (const r of sent) assert.equal(r.status, 201, r.text);
    const done = await waitForStatus(id, 'completed');
    assert.deepEqual(await statusesOf(stack.client, id), ['submitted', 'working', 'input-required', 'working', 'working', 'completed'], 'one run: its progress status, then completed');
    const runs = done.messages.filter((m: any) => m.role === 'agent' && /^Working for/.test(m.parts[0].text));
    assert.equal(runs.length, 1);
    // The run answers the message whose run started first.
    assert.match(done.status_message.parts[0].text, /: \[sleep 300\] (one|two)$/);
  });

  // Two workers: the second run may start on the other one. Concurrency 1: the answer's run cannot
  // start before the first run has stopped, so the first finds the task set waiting, not taken.
  for (const { workers, concurrency } of [{ workers: 1, concurrency: 0 }, { workers: 2, concurrency: 0 }, { workers: 1, concurrency: 1 }]) {
    it(`a run whose task a client interrupted and answered meanwhile is aborted and cannot end it (${workers} worker${workers > 1 ? 's' : ''}${concurrency ? `, concurrency ${concurrency}` : ''})`, async () => {
      const other = workers === 1 && !concurrency ? stack : await startStack({ AGENT_ATTEMPTS: String(ATTEMPTS), ...(concurrency ? { AGENT_CONCURRENCY: String(concurrency) } : {}) }, { workers });
      try {
        // Long enough to be still sleeping when the client acts, however loaded the machine: the abort ends it.
        const id = (await other.client.post('/api/task/v1', { message: textMessage('[sleep 30000] first') })).body.task.id;
        await waitFor(async () => (await other.client.get(`/api/task/v1/${id}`)).body.status_message?.parts[0].text === 'Working for 30000 ms', 'the first run to work');
        // The client takes the task from its run (a transition the API allows) and answers it.
        assert.equal((await other.client.put(`/api/task/v1/${id}`, { status: 'input-required' })).status, 200);
        assert.equal((await other.client.post(`/api/task/v1/${id}/message`, textMessage('[sleep 2500] second'))).status, 201);
        const done = await waitFor(async () => {
          const r = (await other.client.get(`/api/task/v1/${id}`)).body;
          return ['completed', 'failed'].includes(r.task.status) && r;
        }, 'the task to end', 30000);
        // The second run ends the task; the first, still sleeping when the second began, wrote nothing more.
        assert.equal(done.task.status, 'completed');
        assert.equal(done.status_message.parts[0].text, 'Echo (turn 2): [sleep 2500] second');
        assert.ok(!done.messages.some((m: any) => m.parts[0].text === 'Echo: [sleep 30000] first'), done.messages.map((m: any) => m.parts[0].text).join(' | '));
        assert.deepEqual(await statusesOf(other.client, id), ['submitted', 'working', 'working', 'input-required', 'working', 'working', 'completed']);
        await waitFor(async () => other.workers.some((w) => w.logs.some((l) => /agent run aborted: task (taken by another run|set input-required)/.test(l) && l.includes(id))), 'the first run to be aborted');
      } finally {
        if (other !== stack) await other.stop();
      }
    });
  }

  it('a run whose task a client sets waiting for input, then working again without answering, is aborted and cannot end it: the client drives it', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('[sleep 2000] mine') })).body.task.id;
    await waitFor(async () => (await get(id)).status_message?.parts[0].text === 'Working for 2000 ms', 'the run to work');
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'input-required' })).status, 200);
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'working', message: textMessage('the client works on it', 'agent') })).status, 200);
    // The worker's check (every 0.5 s) may fall between the two PUTs: it then finds the task waiting for input.
    await waitFor(async () => stack.workers[0].logs.some((l) => /agent run aborted: task (taken by a client|set input-required)/.test(l) && l.includes(id)), 'the run to be aborted');
    // The run's job is over, having written nothing: the task stays as the client set it.
    const job = await waitFor(() => withQueue(stack.env, 'agent-tasks', async (queue) => (await queue.getJobs(['completed'])).find((j) => j?.data.task_id === id)), 'the run to end');
    assert.equal(job.returnvalue, 'aborted: task ended');
    const t = await get(id);
    assert.equal(t.task.status, 'working');
    assert.equal(t.status_message.parts[0].text, 'the client works on it');
    assert.ok(!t.messages.some((m: any) => m.parts[0].text === 'Echo: [sleep 2000] mine'), t.messages.map((m: any) => m.parts[0].text).join(' | '));
    assert.deepEqual(await statusesOf(stack.client, id), ['submitted', 'working', 'working', 'input-required', 'working']);
  });

  it('doubles the wait before each retry up to RETRY_BACKOFF_MAX_MS, then waits that long', async () => {
    const other = await startStack({ AGENT_ATTEMPTS: '4', AGENT_BACKOFF_MS: '60000', RETRY_BACKOFF_MAX_MS: '90000' });
    try {
      const id = (await other.client.post('/api/task/v1', { message: textMessage('[fail] capped') })).body.task.id;
      const waits: number[] = [];
      for (let failed = 1; failed < 4; failed++) {
        // The job waits in the delayed set for its retry; promoted, it is retried at once.
        const wait = await waitFor(() => withQueue(other.env, 'agent-tasks', async (queue) => {
          const job = (await queue.getJobs(['delayed'])).find((j) => j?.data.task_id === id && j.attemptsMade === failed);
          const wait = job?.delay;
          await job?.promote();
          return wait;
        }), `attempt ${failed} to fail`);
        waits.push(wait);
      }
      // Uncapped: 60, 120 and 240 s.
      assert.deepEqual(waits, [60000, 90000, 90000]);
      const t = await waitFor(async () => { const r = (await other.client.get(`/api/task/v1/${id}`)).body; return r.task.status === 'failed' && r; }, 'the last attempt to fail the task');
      assert.match(t.status_message.parts[0].text, /failed after 4 attempt\(s\)/);
    } finally {
      await other.stop();
    }
  });

  it('a retry of a failed attempt does not take back a task a client took meanwhile (set waiting, then working): no attempt fails it', async () => {
    const other = await startStack({ AGENT_ATTEMPTS: '2', AGENT_BACKOFF_MS: '5000' });
    try {
      const id = (await other.client.post('/api/task/v1', { message: textMessage('[fail] then retry') })).body.task.id;
      await waitFor(async () => other.workers[0].logs.some((l) => l.includes('it will be retried') && l.includes(id)), 'the first attempt to fail');
      assert.equal((await other.client.put(`/api/task/v1/${id}`, { status: 'input-required' })).status, 200);
      assert.equal((await other.client.put(`/api/task/v1/${id}`, { status: 'working', message: textMessage('the client works on it', 'agent') })).status, 200);
      const job = await waitFor(() => withQueue(other.env, 'agent-tasks', async (queue) => (await queue.getJobs(['completed', 'failed'])).find((j) => j?.data.task_id === id)), 'the retry to end', 30000);
      assert.equal(job.attemptsStarted, 2);
      const t = (await other.client.get(`/api/task/v1/${id}`)).body;
      assert.deepEqual([t.task.status, t.status_message.parts[0].text], ['working', 'the client works on it']);
      assert.deepEqual(await statusesOf(other.client, id), ['submitted', 'working', 'input-required', 'working']);
    } finally {
      await other.stop();
    }
  });

  it('an agent message to an interrupted task is recorded only: no continuation is enqueued', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('[input] wait') })).body.task.id;
    await waitForStatus(id, 'input-required');
    const sent = await stack.client.post(`/api/task/v1/${id}/message`, textMessage('a note from another agent', 'agent'));
    assert.equal(sent.status, 201);
    const messageId = sent.body.message.id;
    // The relay adds the job before deleting its outbox row, so a job for this message would be
    // in the outbox now or in the queue right after.
    const inOutbox = await testDb()('outbox').whereRaw(`payload->>'message_id' = ?`, [messageId]).count({ n: '*' });
    const jobs = await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized']));
    assert.ok(jobs.some((j) => j?.data.task_id === id), 'the first run of the task is in the queue');
    assert.equal(Number(inOutbox[0].n), 0);
    assert.ok(!jobs.some((j) => j?.data.message_id === messageId), 'no job for the agent message');
    assert.equal((await get(id)).task.status, 'input-required');
  });

  it('stores an artifact the agent emits as an artifact-update timeline item', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('[artifact] keep this') })).body.task.id;
    await waitForStatus(id, 'completed');
    const tl = await stack.client.get(`/api/task/v1/${id}/timeline?order=asc`);
    const artifacts = tl.body.items.filter((i: any) => i.event_payload.type === 'artifact-update');
    assert.equal(artifacts.length, 1);
    assert.equal(artifacts[0].event_payload.artifact.name, 'echo');
    assert.deepEqual(artifacts[0].event_payload.artifact.parts, [{ kind: 'text', text: '[artifact] keep this' }]);
  });

  it('a run handed back at shutdown and run again by another worker writes its progress message and artifact once', async () => {
    // Long enough that the run is certainly going when the grace period ends (the demo emits its
    // artifact after the sleep, so only the progress message is written by both tries).
    const created = await stack.client.post('/api/task/v1', { message: textMessage('[sleep 8000] [artifact] twice?') });
    const id = created.body.task.id;
    await waitFor(async () => (await get(id)).messages.some((m: any) => m.role === 'agent'), 'the progress message', 30000, 50);
    // The worker leaves mid-run: its grace period (1 s here) ends before the agent does.
    const leaving = stack.workers.shift()!;
    await leaving.kill('SIGTERM');
    await waitFor(async () => leaving.logs.some((l) => l.includes('grace period over: agent runs handed back to the queue')), 'the run to be handed back', 5000);
    stack.workers.push(await startWorker(stack.env));
    const done = await waitForStatus(id, 'completed');
    assert.deepEqual(done.messages.map((m: any) => [m.role, m.parts[0].text]), [
      ['user', '[sleep 8000] [artifact] twice?'], ['agent', 'Working for 8000 ms'], ['agent', 'Echo: [sleep 8000] [artifact] twice?'],
    ]);
    const a2a = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id } });
    assert.equal(a2a.body.result.artifacts.length, 1);
  });

  it('cancel during a run aborts the agent and the task stays canceled', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('[sleep 60000] long') })).body.task.id;
    await waitFor(async () => (await get(id)).status_message?.parts[0].text === 'Working for 60000 ms', 'the agent to be running');
    const r = await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' });
    assert.equal(r.status, 200);
    await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('agent run aborted: task canceled') && l.includes(id)), 'the worker to abort the run');
    // The aborted run wrote nothing after the cancel.
    const after = await get(id);
    assert.equal(after.task.status, 'canceled');
    assert.deepEqual((await statusesOf(stack.client, id)).slice(-1), ['canceled']);
    assert.ok(!after.messages.some((m: any) => m.parts[0].text?.startsWith('Echo')));
  });
});

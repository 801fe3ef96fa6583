// Tasks full of dense messages (the most JSON values a message may hold, which parse into ten times
// their text): reads answer them in parts weighed as parsed, within the API's heap, and a run of such
// a task starts at once with a history within AGENT_HISTORY_MAX_BYTES.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { denseMessage, startWorker, textMessage, useStack, waitFor, type Proc } from './helpers/stack.ts';

const A2A = '/api/a2a/v1';
const nOf = (parts: any[]) => parts.find((p) => p.type === 'data-part' || p.kind === 'data')?.data.n;
// What a page holds at most past its first item (db/pagination.ts PAGE_MAX_BYTES), and so the most
// dense messages: the fourth would start past it.
const PER_PAGE = 3;

describe('tasks full of dense messages', function () {
  this.timeout(180_000);
  // Ten reads at once of such a task, whole, ran an API with this heap out of memory.
  const stack = useStack({ NODE_OPTIONS: '--max-old-space-size=256', RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });
  let id: string;
  let count = 0;

  before(async () => {
    // No worker yet: the task stays submitted, and takes messages until it holds TASK_MESSAGES_MAX_BYTES.
    id = (await stack.client.post('/api/task/v1', { message: textMessage('open') })).body.task.id;
    for (;;) {
      const r = await stack.client.post(`/api/task/v1/${id}/message`, denseMessage(count + 1));
      if (r.status === 413) break;
      assert.equal(r.status, 201, r.text);
      count++;
    }
    assert.ok(count > 50, `the task took ${count} dense messages`);
  });

  it('answers ten tasks/get at once, each with the newest messages that fit in 8 MiB as parsed', async () => {
    const answers = await Promise.all(Array.from({ length: 10 }, () =>
      stack.client.post(A2A, { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id, historyLength: 1000 } })));
    for (const a of answers) {
      assert.equal(a.status, 200, a.text.slice(0, 300));
      assert.deepEqual(a.body.result.history.map((m: any) => nOf(m.parts)), [count - 2, count - 1, count]);
    }
    assert.equal(stack.api.child.exitCode, null, 'the API is still running');
  });

  it('pages the messages and the timeline by weight: every page within 8 MiB as parsed, all of them in order across pages', async () => {
    const task = await stack.client.get(`/api/task/v1/${id}`);
    assert.equal(task.status, 200);
    assert.deepEqual(task.body.messages.map((m: any) => nOf(m.parts) ?? m.parts[0].text), ['open', ...Array.from({ length: PER_PAGE }, (_, i) => i + 1)]);
    const walk = async (path: string, token?: string): Promise<any[][]> => {
      const page = await stack.client.get(`${path}${token ? `&next_page_token=${token}` : ''}`);
      assert.equal(page.status, 200, page.text.slice(0, 300));
      return [page.body.items, ...(page.body.next_page_token ? await walk(path, page.body.next_page_token) : [])];
    };
    // The task's first page of messages ends where the list's first page does, and its token goes on from there.
    const pages = await walk(`/api/task/v1/${id}/message?page_size=1000`);
    assert.deepEqual(pages[0].map((m) => m.id), task.body.messages.map((m: any) => m.id));
    assert.ok(task.body.messages_next_page_token, 'the task shows a token to its further messages');
    assert.ok(pages.every((p) => p.filter((m) => nOf(m.parts) !== undefined).length <= PER_PAGE));
    assert.deepEqual(pages.flat().map((m) => nOf(m.parts) ?? 'open'), ['open', ...Array.from({ length: count }, (_, i) => i + 1)]);

    const timeline = await walk(`/api/task/v1/${id}/timeline?page_size=1000&order=asc`);
    assert.ok(timeline.length > count / PER_PAGE, `${timeline.length} timeline pages`);
    const items = timeline.flat();
    assert.deepEqual(items.map((i) => i.event_payload.type), ['message', 'task-status-update', ...Array(count).fill('message')]);
    assert.deepEqual(items.slice(2).map((i) => nOf(i.event_payload.message.parts)), Array.from({ length: count }, (_, i) => i + 1));
  });

  it('pages tasks whose metadata is dense at 8 MiB counted as parsed (its weight stored at intake), not as text', async () => {
    const contextId = randomUUID();
    const ids: string[] = [];
    for (let n = 1; n <= 4; n++) {
      const r = await stack.client.post('/api/task/v1', { context_id: contextId, metadata: { n, a: new Array(99_980).fill({}) }, message: { role: 'agent', parts: [{ type: 'text-part', text: `dense ${n}` }] } });
      assert.equal(r.status, 201, r.text.slice(0, 300));
      ids.push(r.body.task.id);
    }
    // 400 kB of text each as Postgres writes it ('{}, '), over 2 MB each as parsed (the weight stored at
    // intake, migration 0042): three fit in a page; as text, all four did.
    const first = await stack.client.get(`/api/task/v1/context/${contextId}/task?page_size=1000`);
    assert.equal(first.status, 200);
    assert.deepEqual(first.body.items.map((t: any) => t.id), [ids[3], ids[2], ids[1]]);
    const rest = await stack.client.get(`/api/task/v1/context/${contextId}/task?page_size=1000&next_page_token=${first.body.next_page_token}`);
    assert.deepEqual(rest.body.items.map((t: any) => t.id), [ids[0]]);
    assert.equal(rest.body.next_page_token, undefined);
  });

  it('runs the task with its own message and no dense one in its history (over AGENT_HISTORY_MAX_BYTES), without waiting on Postgres', async () => {
    // The run weighs the task's newest 200 messages: walking each one's values in Postgres took about
    // a second a message, past this statement timeout.
    let worker: Proc | undefined;
    try {
      worker = await startWorker({ ...stack.env, DB_QUERY_TIMEOUT_MS: '5000', AGENT_KIND: 'module', AGENT_MODULE: './test/fixtures/history-agent.mjs' });
      const done = await waitFor(async () => {
        const t = (await stack.client.get(`/api/task/v1/${id}`)).body;
        return t.task.status === 'completed' && t;
      }, 'the task to complete', 60_000, 100);
      assert.equal(done.status_message.parts[0].text, 'history: 1; own message in it: true; newest: true');
      assert.ok(!worker.logs.some((l) => /"level":(50|60)/.test(l)), worker.logs.filter((l) => /"level":(50|60)/.test(l)).join('\n'));
    } finally {
      await worker?.stop();
    }
  });

  it('a run tried again after a dense user message (over AGENT_HISTORY_MAX_BYTES) still sees what it said: its progress is not said twice', async () => {
    const c = stack.client;
    const first = await startWorker(stack.env);
    let second: Proc | undefined;
    try {
      const task = (await c.post('/api/task/v1', { message: textMessage('[sleep 2000] dies once') })).body.task.id;
      await waitFor(async () => (await c.get(`/api/task/v1/${task}`)).body.status_message?.parts[0].text === 'Working for 2000 ms', 'the run to say its progress');
      // Recorded only (the task is working): the newest message, alone over the run's history budget.
      assert.equal((await c.post(`/api/task/v1/${task}/message`, denseMessage(0))).status, 201);
      await first.kill('SIGKILL');
      second = await startWorker(stack.env);
      const done = await waitFor(async () => {
        const t = (await c.get(`/api/task/v1/${task}`)).body;
        return t.task.status === 'completed' && t;
      }, 'the run tried again to complete', 60_000, 100);
      assert.deepEqual(done.messages.map((m: any) => m.role === 'agent' ? m.parts[0].text : nOf(m.parts) ?? m.parts[0].text),
        ['[sleep 2000] dies once', 'Working for 2000 ms', 0, 'Echo: [sleep 2000] dies once']);
    } finally {
      await second?.stop();
    }
  });
});

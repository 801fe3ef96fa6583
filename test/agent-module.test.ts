// Agent modules (AGENT_KIND=module): a module's replies, artifacts and final message reach the
// task; canceling a long-running module agent fires its abort signal on the worker.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT, resetDb, startStack, startWorker, testEnv, waitFor, type Stack } from './helpers/stack.ts';

const A2A = '/api/a2a/v1';
const userMessage = (text: string) => ({ kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }] });

describe('agent modules', () => {
  let stack: Stack;
  let marker: string;
  const rpc = (method: string, params: unknown) => stack.client.post(A2A, { jsonrpc: '2.0', id: 1, method, params });

  before(async () => {
    await resetDb();
    marker = path.join(process.env.TEST_DATA_DIR!, `signal-agent-${randomUUID()}.marker`);
    stack = await startStack({ AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/signal-agent.ts'), SIGNAL_AGENT_MARKER: marker });
  });
  after(async () => stack?.stop());

  it("a module's reply, artifact and final data message reach the task", async () => {
    const task = (await rpc('message/send', { message: userMessage('hello module') })).body.result;
    assert.equal(task.status.state, 'completed');
    assert.deepEqual(task.status.message.parts, [{ kind: 'data', data: { turns: 1, text: 'hello module' } }]);
    assert.deepEqual(task.history.map((m: any) => m.role), ['user', 'agent', 'agent']);
    assert.deepEqual(task.history[1].parts, [{ kind: 'text', text: 'working on: hello module' }]);
    assert.deepEqual(task.artifacts, [{ artifactId: 'summary', name: 'summary', parts: [{ kind: 'data', data: { length: 12 } }] }]);
    const timeline = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
    assert.deepEqual(timeline.body.items.map((i: any) => i.event_payload.type),
      ['message', 'task-status-update', 'task-status-update', 'message', 'artifact-update', 'message', 'task-status-update']);
  });

  it('canceling a long-running module agent aborts its signal on the worker', async () => {
    const task = (await rpc('message/send', { message: userMessage('wait'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => {
      const r = await rpc('tasks/get', { id: task.id });
      return r.body.result.status.message?.parts?.[0]?.text === 'waiting to be canceled';
    }, 'the module agent to start waiting');
    assert.ok(!fs.existsSync(marker));
    const canceled = await rpc('tasks/cancel', { id: task.id });
    assert.equal(canceled.body.result.status.state, 'canceled');
    const text = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to observe its abort signal');
    assert.match(text, new RegExp(`aborted task ${task.id}: task canceled`));
    const after = await rpc('tasks/get', { id: task.id });
    assert.equal(after.body.result.status.state, 'canceled');
  });

  it('a worker refuses to start with a module that exports no handler', async () => {
    const env = testEnv({ AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/no-handler-agent.ts') });
    await assert.rejects(startWorker(env), /exports no handler function/);
  });
});

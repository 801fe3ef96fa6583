import assert from 'node:assert/strict';
import { resetDb, startStack, textMessage, waitFor, type Stack } from './helpers/stack.ts';

describe('job pipeline: task execution through a real worker', () => {
  let stack: Stack;
  before(async () => {
    await resetDb();
    stack = await startStack();
  });
  after(async () => stack?.stop());

  it('runs a created task to completed with the agent reply in the timeline', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('hello pipeline') });
    assert.equal(created.status, 201);
    const id = created.body.task.id;
    const done = await waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${id}`);
      return r.body.task.status === 'completed' && r.body;
    }, 'task completion');
    assert.equal(done.status_message.role, 'agent');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: hello pipeline' }]);
    const tl = await stack.client.get(`/api/task/v1/${id}/timeline?order=asc`);
    const statuses = tl.body.items.filter((i: any) => i.event_payload.type === 'task-status-update').map((i: any) => i.event_payload.status);
    assert.deepEqual(statuses, ['submitted', 'working', 'completed']);
  });
});

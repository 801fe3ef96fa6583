// A remote A2A agent whose task works longer than five minutes without a word: its stream is
// followed to the end. Node's fetch (undici) gives up on an answer silent for 300 s (its
// bodyTimeout), which broke the stream: the run's attempt failed with the reason "terminated". Slow
// by nature (the silence must outlast undici's 300 s), hence a file of its own.
import assert from 'node:assert/strict';
import { textMessage, waitFor } from './helpers/stack.ts';
import { rawA2ARemote, useStackOnRawAgent } from './helpers/raw-agent-card.ts';

const SILENCE_MS = 310_000;

describe('remote A2A agent whose task is silent for more than five minutes', function () {
  this.timeout(SILENCE_MS + 120_000);
  const server = rawA2ARemote({ name: 'slow', description: 'works in silence', streaming: true }, ({ event }, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(event({ kind: 'task', id: 'remote-slow', contextId: 'remote-ctx', status: { state: 'working' } }));
    const done = setTimeout(() => res.end(event({
      kind: 'status-update', taskId: 'remote-slow', contextId: 'remote-ctx', final: true,
      status: { state: 'completed', message: { kind: 'message', role: 'agent', messageId: 'remote-done', parts: [{ kind: 'text', text: 'done at last' }] } },
    })), SILENCE_MS);
    res.on('close', () => clearTimeout(done));
  });

  const stack = useStackOnRawAgent(server, { AGENT_ATTEMPTS: '1' });

  it('follows its stream to the end', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('take your time') });
    const ended = await waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${created.body.task.id}`);
      return ['completed', 'failed'].includes(r.body.task.status) && r.body;
    }, 'the task to end', SILENCE_MS + 60_000, 1000);
    // Before: failed, "The agent failed after 1 attempt(s): terminated", 300 s in.
    assert.equal(ended.task.status, 'completed', ended.status_message?.parts?.[0]?.text);
    assert.equal(ended.status_message.parts[0].text, 'done at last');
  });
});

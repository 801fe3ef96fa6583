import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http, { type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import express from 'express';
import { pino } from 'pino';
import type { AgentCard, Artifact, Message, TaskState } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } from '@a2a-js/sdk/client';
import { DefaultRequestHandler, InMemoryTaskStore, type AgentExecutor, type ExecutionEventBus, type RequestContext } from '@a2a-js/sdk/server';
import { agentCardHandler, jsonRpcHandler, UserBuilder } from '@a2a-js/sdk/server/express';
import { remoteAgent } from '../workers/agents/remote-a2a.ts';
import type { AgentContext } from '../workers/agents/types.ts';
import { resetDb, startStack, startWorker, testDb, textMessage, waitFor, withQueue, type Stack } from './helpers/stack.ts';
import { answerAgentCard, rawA2ARemote, useStackOnRawAgent } from './helpers/raw-agent-card.ts';

const textOf = (m: Message) => m.parts.map((p) => (p.kind === 'text' ? p.text : '')).join('');
// Its messages carry metadata, which the local task keeps.
const REMOTE_METADATA = { model: 'remote-test', confidence: 0.9 };
const agentMessage = (taskId: string, contextId: string, text: string): Message => ({
  kind: 'message', role: 'agent', messageId: randomUUID(), taskId, contextId, parts: [{ kind: 'text', text }], metadata: REMOTE_METADATA,
});

// The remote agent: says it is thinking (a working update with a message), emits an artifact,
// then finishes. "[direct]" ("[direct named]") makes it answer with a plain message and no task. "[ask]" makes it ask
// for input first; "[giveup]" makes it cancel its task itself; "[hang]" makes it work until canceled; "[flood]" makes its artifact too large
// for the local task, and then work until canceled; "[bigask]" asks for input with a question too
// large for the local task; "[slowstart]" ("[slowstart <ms>]") makes it say nothing for 1.5 s (ms)
// after taking the message; "[grow]" makes it write its report in 8 chunks of 1,500 characters, one every
// 250 ms (12 kB in all, which the local task holds); "[chunks]" makes it write its story in chunks
// that rename it and add metadata, and ask for the end, which a follow-up appends with a description
// and a changed metadata key; "[closing]" closes its artifact with a last chunk of no parts (once
// with metadata); "[gatefirst]" makes the first task of its text say nothing until the test opens
// its gate (gates), the ones after it answer at once;
// a follow-up turn says which turn it is.
class RemoteExecutor implements AgentExecutor {
  readonly received: { taskId: string; contextId: string; text: string; continued: boolean; message: Message }[] = [];
  readonly canceled = new Set<string>();
  readonly gates = new Map<string, () => void>();
  private readonly hanging = new Map<string, () => void>();

  async execute(rc: RequestContext, bus: ExecutionEventBus): Promise<void> {
    const { taskId, contextId, userMessage, task } = rc;
    const text = textOf(userMessage);
    this.received.push({ taskId, contextId, text, continued: !!task, message: userMessage });
    const slow = /\[slowstart(?: (\d+))?\]/.exec(text);
    if (slow) await new Promise((resolve) => setTimeout(resolve, Number(slow[1] ?? 1500)));
    if (text.includes('[gatefirst]') && this.received.filter((r) => r.text === text).length === 1) await new Promise<void>((resolve) => this.gates.set(text, resolve));
    const direct = /\[direct( named)?\]/.exec(text);
    if (direct) {
      // A plain message instead of a task: the remote's whole answer. "[direct named]" names the task
      // id the SDK handed the executor, as many executors do (the SDK never creates that task).
      bus.publish({ kind: 'message', role: 'agent', messageId: randomUUID(), ...(direct[1] ? { taskId } : {}), contextId, parts: [{ kind: 'text', text: `Direct answer to ${text}` }] });
      bus.finished();
      return;
    }
    const status = (state: TaskState, message?: string, final = false) =>
      bus.publish({ kind: 'status-update', taskId, contextId, final, status: { state, timestamp: new Date().toISOString(), ...(message ? { message: agentMessage(taskId, contextId, message) } : {}) } });
    // A follow-up first reports the task as it stands, still waiting for input, as taskbridge's own
    // streams and non-blocking sends do.
    bus.publish(task ? { ...task } : { kind: 'task', id: taskId, contextId, status: { state: 'submitted', timestamp: new Date().toISOString() }, history: [userMessage] });
    status('working', `thinking about ${text}`);
    if (text.includes('[hang]')) {
      await new Promise<void>((resolve) => this.hanging.set(taskId, resolve));
      bus.finished();
      return;
    }
    if (text.includes('[bigask]')) {
      status('input-required', 'q'.repeat(10_000), true);
      bus.finished();
      return;
    }
    if (text.includes('[giveup]')) {
      // Cancels its own task, as a remote whose user or operator canceled it there does.
      status('canceled', 'Canceled by the remote operator', true);
      bus.finished();
      return;
    }
    if (text.includes('[ask]')) {
      status('input-required', 'Which colour?', true);
      bus.finished();
      return;
    }
    if (text.includes('[chunks]')) {
      const chunk = (append: boolean, artifact: Omit<Artifact, 'artifactId'>) => bus.publish({ kind: 'artifact-update', taskId, contextId, append, artifact: { artifactId: 'story', ...artifact } });
      if (!task) {
        chunk(false, { name: 'draft', metadata: { v: 1, keep: 'a' }, parts: [{ kind: 'text', text: 'once' }] });
        chunk(true, { name: 'story', metadata: { added: true }, parts: [{ kind: 'text', text: 'upon a time' }] });
        status('input-required', 'How does it end?', true);
      } else {
        chunk(true, { description: 'a short one', metadata: { v: 2 }, parts: [{ kind: 'text', text: 'the end' }] });
        status('completed', 'Told', true);
      }
      bus.finished();
      return;
    }
    if (text.includes('[closing]')) {
      const chunk = (artifactId: string, append: boolean, artifact: Partial<Artifact>, lastChunk = false) =>
        bus.publish({ kind: 'artifact-update', taskId, contextId, append, lastChunk, artifact: { artifactId, parts: [], ...artifact } });
      chunk('log', false, { name: 'log', parts: [{ kind: 'text', text: 'line 1' }] });
      chunk('log', true, {}, true);
      chunk('notes', false, { parts: [{ kind: 'text', text: 'note 1' }] });
      chunk('notes', true, { metadata: { complete: true } }, true);
      // Artifacts of no parts, which a task cannot hold: an empty first chunk, an empty new artifact.
      chunk('ghost', true, {}, true);
      chunk('blank', false, { name: 'blank' });
      // An empty first chunk that names the artifact, then its parts; an artifact emptied, then grown again.
      chunk('late', false, { name: 'late', metadata: { opened: true } });
      chunk('late', true, { parts: [{ kind: 'text', text: 'late 1' }] }, true);
      chunk('redo', false, { name: 'redo', parts: [{ kind: 'text', text: 'draft' }] });
      chunk('redo', false, { name: 'redone' });
      chunk('redo', true, { parts: [{ kind: 'text', text: 'final' }] }, true);
      status('completed', 'Closed', true);
      bus.finished();
      return;
    }
    if (text.includes('[grow]')) {
      for (let i = 0; i < 8; i++) {
        if (i) await new Promise((resolve) => setTimeout(resolve, 250));
        bus.publish({ kind: 'artifact-update', taskId, contextId, append: i > 0, lastChunk: i === 7, artifact: { artifactId: 'grown', name: 'grown', parts: [{ kind: 'text', text: String(i).repeat(1500) }] } });
      }
      status('completed', 'Grown', true);
      bus.finished();
      return;
    }
    // "[flood]": a report larger than the local task may hold.
    const report = text.includes('[flood]') ? 'z'.repeat(20_000) : `report on ${text}`;
    bus.publish({ kind: 'artifact-update', taskId, contextId, artifact: { artifactId: 'report', name: 'report', parts: [{ kind: 'text', text: report }] } });
    if (text.includes('[flood]')) {
      // ... and works on until canceled.
      await new Promise<void>((resolve) => this.hanging.set(taskId, resolve));
      bus.finished();
      return;
    }
    status('completed', task ? `Remote turn 2: ${text}` : `Remote echo: ${text}`, true);
    bus.finished();
  }

  async cancelTask(taskId: string, bus: ExecutionEventBus): Promise<void> {
    this.canceled.add(taskId);
    bus.publish({ kind: 'status-update', taskId, contextId: '', final: true, status: { state: 'canceled', timestamp: new Date().toISOString() } });
    this.hanging.get(taskId)?.();
    bus.finished();
  }
}

const REMOTE_KEY = 'remote-api-key-3f9a71c2';

// The remote answers 401 to any request without REMOTE_KEY as its bearer token.
// With endpointElsewhere, the same app also listens on a second port, and the card names its
// endpoint there: another origin than the card's.
// A remote whose tasks/get shows no history (the A2A spec leaves it optional).
class NoHistoryRequestHandler extends DefaultRequestHandler {
  override async getTask(...args: Parameters<DefaultRequestHandler['getTask']>) {
    return { ...(await super.getTask(...args)), history: [] };
  }
}

// A task created on `stack` with `text`, as GET shows it once it has ended (completed or failed).
async function outcome(stack: Stack, text: string) {
  const created = await stack.client.post('/api/task/v1', { message: textMessage(text) });
  return waitFor(async () => {
    const r = await stack.client.get(`/api/task/v1/${created.body.task.id}`);
    return ['completed', 'failed'].includes(r.body.task.status) && r.body;
  }, 'the task to end', 30000);
}

// A task made with `text`, as it stands once `until` its status.
async function taskOn(stack: Stack, text: string, until: (status: string) => boolean, what: string) {
  const created = await stack.client.post('/api/task/v1', { message: textMessage(text) });
  return waitFor(async () => {
    const r = await stack.client.get(`/api/task/v1/${created.body.task.id}`);
    return until(r.body.task.status) && r.body;
  }, what, 30000);
}
const failedTaskOn = (stack: Stack, text = 'anyone there?') => taskOn(stack, text, (s) => s === 'failed', 'the task to fail');
const endedTaskOn = (stack: Stack, text: string) => taskOn(stack, text, (s) => s !== 'submitted' && s !== 'working', 'the task to end');

// `first`: handlers every request meets before any other.
async function startRemoteAgent(executor: AgentExecutor, streaming: boolean, endpointElsewhere = false, keepsHistory = true, first: express.RequestHandler[] = []): Promise<{ url: string; server: Server; refused: string[]; endpointOrigin: string; close: () => Promise<void> }> {
  const app = express();
  const refused: string[] = [];
  if (first.length) app.use(first);
  app.use((req, res, next) => {
    if (req.headers.authorization === `Bearer ${REMOTE_KEY}`) return next();
    refused.push(`${req.method} ${req.path}`);
    res.status(401).json({ error: 'unauthenticated' });
  });
  const listen = () => new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const origin = (s: Server) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
  const server = await listen();
  const servers = endpointElsewhere ? [server, await listen()] : [server];
  // Under a path, given without a trailing slash: its card is <url>/.well-known/agent-card.json.
  const url = `${origin(server)}/agents/echo`;
  const endpointOrigin = origin(servers.at(-1)!);
  const card: AgentCard = {
    name: 'remote test agent', description: 'replies, emits an artifact and finishes', version: '1.0.0', protocolVersion: '0.3.0',
    url: `${endpointOrigin}/agents/echo/rpc`, preferredTransport: 'JSONRPC', capabilities: { streaming }, defaultInputModes: ['text'], defaultOutputModes: ['text'], skills: [],
  };
  const handler = new (keepsHistory ? DefaultRequestHandler : NoHistoryRequestHandler)(card, new InMemoryTaskStore(), executor);
  app.use('/agents/echo/.well-known/agent-card.json', agentCardHandler({ agentCardProvider: handler }));
  app.use('/agents/echo/rpc', jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));
  const close = async () => {
    for (const s of servers) {
      s.closeAllConnections();
      await new Promise((resolve) => s.close(resolve));
    }
  };
  return { url, server, refused, endpointOrigin, close };
}

for (const streaming of [true, false]) {
  describe(`remote A2A agent (${streaming ? 'streaming' : 'non-streaming, polled'} remote)`, () => {
    let stack: Stack;
    let remote: Awaited<ReturnType<typeof startRemoteAgent>>;
    const executor = new RemoteExecutor();
    // The configuration of each message/send or message/stream the remote was sent, by the message's id.
    const configurations = new Map<string, unknown>();
    const recordConfiguration: express.RequestHandler = (req, _res, next) => {
      const params = req.body?.params;
      if (params?.message?.messageId) configurations.set(params.message.messageId, params.configuration);
      next();
    };
    before(async () => {
      await resetDb();
      remote = await startRemoteAgent(executor, streaming, false, true, [express.json({ limit: '20mb' }), recordConfiguration]);
      stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, JOB_RECOVERY_MS: '1000', TASK_ARTIFACTS_MAX_BYTES: '16384', TASK_MESSAGES_MAX_BYTES: '8192' });
    });
    after(async () => {
      await stack?.stop();
      await remote?.close();
    });

    const finished = (id: string, status: string) =>
      waitFor(async () => {
        const r = await stack.client.get(`/api/task/v1/${id}`);
        return r.body.task.status === status && r.body;
      }, `task ${id} ${status}`, 30000);
    const timeline = async (id: string) => (await stack.client.get(`/api/task/v1/${id}/timeline?order=asc&page_size=100`)).body.items.map((i: any) => i.event_payload);
    // A2A message/send (blocking) of a user message with `text`, or the parts given, and more members.
    const send = (text: string, more: Record<string, unknown> = {}) => stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'message/send', params: {
      message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text }], ...more },
    } });
    // The state of a task on the remote, as its own tasks/get tells it.
    const remoteStateOf = async (remoteTask: string) => {
      const r = await fetch(`${remote.url}/rpc`, {
        method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${REMOTE_KEY}` },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id: remoteTask } }),
      });
      return ((await r.json()) as any).result?.status?.state;
    };

    it("mirrors the remote task's reply, status and artifact into the local task", async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('hello remote') });
      assert.equal(created.status, 201);
      const id = created.body.task.id;
      const done = await finished(id, 'completed');
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Remote echo: hello remote' }]);
      assert.deepEqual(done.status_message.metadata, REMOTE_METADATA);
      const texts = done.messages.map((m: any) => `${m.role}: ${m.parts[0].text}`);
      const events = await timeline(id);
      const statuses = events.filter((e: any) => e.type === 'task-status-update').map((e: any) => e.status);
      assert.equal(statuses[0], 'submitted');
      assert.equal(statuses.at(-1), 'completed');
      assert.ok(statuses.slice(1, -1).every((s: string) => s === 'working'), statuses.join(','));
      const artifacts = events.filter((e: any) => e.type === 'artifact-update').map((e: any) => e.artifact);
      assert.deepEqual(artifacts.map((a: any) => [a.artifactId, a.name, a.parts[0].text]), [['report', 'report', 'report on hello remote']]);
      if (streaming) {
        assert.ok(texts.includes('agent: thinking about hello remote'), texts.join(' | '));
        assert.deepEqual(done.messages.find((m: any) => m.parts[0].text === 'thinking about hello remote').metadata, REMOTE_METADATA);
      }
      const a2a = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id } });
      assert.equal(a2a.body.result?.artifacts?.[0]?.artifactId, 'report', a2a.text);
      // Every call carried the remote's API key, and the key is in no log line.
      assert.deepEqual(remote.refused, []);
      const logs = [...stack.api.logs, ...stack.workers.flatMap((w) => w.logs)].join('\n');
      assert.ok(!logs.includes(REMOTE_KEY));
    });

    it("forwards the message's metadata and extensions with its parts (and theirs), as the client sent them", async () => {
      const parts = [{ kind: 'text', text: 'with metadata', metadata: { lang: 'en' } }, { kind: 'data', data: { n: 1 } }];
      const sent = await send('', { parts, metadata: { trace: 'abc', nested: { x: [1] } }, extensions: ['https://example.com/ext/v1'] });
      assert.equal(sent.body.result?.status?.state, 'completed', sent.text);
      const got = executor.received.find((r) => r.text === 'with metadata')!.message;
      assert.deepEqual(got.parts, parts);
      assert.deepEqual(got.metadata, { trace: 'abc', nested: { x: [1] } });
      assert.deepEqual(got.extensions, ['https://example.com/ext/v1']);
    });

    it('forwards the output modes the client accepts in its own send, and names none when the client named none', async () => {
      const modes = ['application/json', 'text'];
      const sent = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'message/send', params: {
        message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text: 'modes given' }] },
        configuration: { acceptedOutputModes: modes },
      } });
      assert.equal(sent.body.result?.status?.state, 'completed', sent.text);
      const plain = await send('modes not given');
      assert.equal(plain.body.result?.status?.state, 'completed', plain.text);
      const configurationOf = (text: string) => configurations.get(executor.received.find((r) => r.text === text)!.message.messageId);
      assert.deepEqual(configurationOf('modes given'), { blocking: false, acceptedOutputModes: modes });
      assert.deepEqual(configurationOf('modes not given'), { blocking: false });
    });

    it('sends a new task in the context of earlier ones to the remote context those went to', async () => {
      const first = (await send('context one')).body.result;
      assert.equal(first.status.state, 'completed');
      const second = (await send('context two', { contextId: first.contextId })).body.result;
      assert.equal(second.status.state, 'completed');
      const unrelated = (await send('context three')).body.result;
      assert.equal(unrelated.status.state, 'completed');
      const remoteContext = (text: string) => executor.received.find((r) => r.text === text)!.contextId;
      assert.equal(remoteContext('context two'), remoteContext('context one'));
      assert.notEqual(remoteContext('context three'), remoteContext('context one'));
    });

    it('names the tasks a message refers to by their remote ids, leaving out those the remote never had', async () => {
      const earlier = (await send('the earlier one')).body.result;
      assert.equal(earlier.status.state, 'completed');
      const unknown = randomUUID();
      assert.equal((await send('see the earlier one', { referenceTaskIds: [earlier.id, unknown] })).body.result.status.state, 'completed');
      const received = (text: string) => executor.received.find((r) => r.text === text)!;
      assert.deepEqual(received('see the earlier one').message.referenceTaskIds, [received('the earlier one').taskId]);
      assert.equal(received('the earlier one').message.referenceTaskIds, undefined);
    });

    it('cancels the local task when the remote cancels its task itself, with its status message', async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('[giveup] please') });
      assert.equal(created.status, 201);
      const id = created.body.task.id;
      const done = await finished(id, 'canceled');
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Canceled by the remote operator' }]);
      const statuses = (await timeline(id)).filter((e: any) => e.type === 'task-status-update').map((e: any) => e.status);
      assert.equal(statuses.at(-1), 'canceled', statuses.join(','));
      const a2a = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id } });
      assert.equal(a2a.body.result.status.state, 'canceled');
    });

    it('completes the local task with a remote answer that is a plain message, whatever task id it names, following no remote task', async () => {
      for (const text of ['quick one [direct]', 'quick one [direct named]']) {
        const created = await stack.client.post('/api/task/v1', { message: textMessage(text) });
        const id = created.body.task.id;
        const done = await waitFor(async () => {
          const r = await stack.client.get(`/api/task/v1/${id}`);
          return ['completed', 'failed'].includes(r.body.task.status) && r.body;
        }, `task ${id} to end`, 30000);
        assert.equal(done.task.status, 'completed', `${text}: ${JSON.stringify(done.status_message)}`);
        assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `Direct answer to ${text}` }]);
        assert.equal(await testDb()('remote_agent_tasks').where({ task_id: id }).first(), undefined, `${text}: no remote task recorded`);
        assert.equal(executor.received.filter((r) => r.text === text).length, 1, `${text}: sent once`);
      }
    });

    it('continues the same remote task when the user answers an input request', async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('paint it [ask]') });
      const id = created.body.task.id;
      const asked = await finished(id, 'input-required');
      assert.equal(asked.status_message.parts[0].text, 'Which colour?');
      const follow = await stack.client.post(`/api/task/v1/${id}/message`, textMessage('blue'));
      assert.equal(follow.status, 201);
      const done = await finished(id, 'completed');
      assert.equal(done.status_message.parts[0].text, 'Remote turn 2: blue');
      // What the first turn mirrored is not mirrored again by the second.
      const texts = done.messages.map((m: any) => m.parts[0].text);
      assert.equal(texts.filter((t: string) => t === 'Which colour?').length, 1, texts.join(' | '));
      assert.ok(texts.filter((t: string) => t === 'thinking about paint it [ask]').length <= 1, texts.join(' | '));
      const turns = executor.received.filter((r) => r.text === 'paint it [ask]' || r.text === 'blue');
      assert.equal(turns.length, 2);
      assert.equal(turns[1].taskId, turns[0].taskId, 'the follow-up went to the same remote task');
      assert.equal(turns[1].continued, true);
    });

    it("fails the local task at once, saying why, and cancels the remote task, when the remote's artifact would take it over TASK_ARTIFACTS_MAX_BYTES", async () => {
      const before = stack.workers[0].logs.length;
      const created = await stack.client.post('/api/task/v1', { message: textMessage('big report [flood]') });
      const id = created.body.task.id;
      const failed = await finished(id, 'failed');
      assert.match(failed.status_message.parts[0].text,
        new RegExp(`^The agent failed after 1 attempt\\(s\\): Task '${id}' holds 0 bytes of artifacts; this artifact update \\(\\d+ bytes\\) would take it over the 16384 a task may hold \\(TASK_ARTIFACTS_MAX_BYTES\\)$`));
      assert.ok(!(await timeline(id)).some((e: any) => e.type === 'artifact-update'), 'no artifact stored');
      const sent = executor.received.filter((r) => r.text === 'big report [flood]');
      assert.equal(sent.length, 1, 'sent to the remote once');
      await waitFor(async () => executor.canceled.has(sent[0].taskId), 'the remote task to be canceled');
      // Forgotten right after the cancel is answered (and logged): looked for until then.
      await waitFor(async () => (await testDb()('remote_agent_tasks').where({ task_id: id }).first()) === undefined, 'the remote task to be forgotten');
      const logs = stack.workers[0].logs.slice(before).join('\n');
      assert.ok(!/"level":(50|60)/.test(logs), logs);
    });

    it('mirrors an artifact the remote writes in chunks once: a poll that finds it grown adds its new parts, not the whole of it again', async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('long report [grow]') });
      const id = created.body.task.id;
      const done = await waitFor(async () => {
        const r = await stack.client.get(`/api/task/v1/${id}`);
        return ['completed', 'failed'].includes(r.body.task.status) && r.body;
      }, 'the task to end', 30000);
      // Stored whole at every poll, its copies took the task over TASK_ARTIFACTS_MAX_BYTES (16384).
      assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
      const a2a = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id } });
      assert.deepEqual(a2a.body.result.artifacts.map((a: any) => [a.artifactId, a.parts.map((p: any) => p.text)]),
        [['grown', Array.from({ length: 8 }, (_, i) => String(i).repeat(1500))]]);
      const stored = (await timeline(id)).filter((e: any) => e.type === 'artifact-update').flatMap((e: any) => e.artifact.parts);
      assert.equal(stored.length, 8, 'each part stored once');
    });

    it("holds an artifact the remote wrote in chunks that renamed it and added metadata, across turns, as the remote's own task shows it", async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('a story [chunks]') });
      const id = created.body.task.id;
      await finished(id, 'input-required');
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('and then [chunks]'))).status, 201);
      await finished(id, 'completed');
      // The remote's task, read with the SDK's client.
      const keyed: typeof fetch = (input, init) => fetch(input, { ...init, headers: { ...Object.fromEntries(new Headers(init?.headers)), authorization: `Bearer ${REMOTE_KEY}` } });
      const client = await new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
        transports: [new JsonRpcTransportFactory({ fetchImpl: keyed })], cardResolver: new DefaultAgentCardResolver({ fetchImpl: keyed }),
      })).createFromUrl(`${remote.url}/`);
      const theirs = (await client.getTask({ id: executor.received.find((r) => r.text === 'a story [chunks]')!.taskId })).artifacts;
      assert.deepEqual(theirs, [{
        artifactId: 'story', name: 'story', description: 'a short one', metadata: { v: 2, keep: 'a', added: true },
        parts: ['once', 'upon a time', 'the end'].map((text) => ({ kind: 'text', text })),
      }]);
      // Before, the local copy kept the first chunk's name and metadata (streamed), or a poll stored
      // the artifact whole again once its name or metadata had changed.
      const ours = (await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id } })).body.result.artifacts;
      assert.deepEqual(ours, theirs);
      const stored = (await timeline(id)).filter((e: any) => e.type === 'artifact-update').flatMap((e: any) => e.artifact.parts);
      assert.equal(stored.length, 3, 'each part stored once');
    });

    it("takes a remote's last chunk of no parts, which adds nothing (or only its metadata) to the artifact, and leaves out artifacts of no parts", async () => {
      // Before, the streamed one failed the local task ('Invalid artifact: artifact.parts must NOT have
      // fewer than 1 items') and canceled the remote's.
      const done = await outcome(stack, 'close it [closing]');
      assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
      const a2a = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id: done.task.id } });
      assert.deepEqual(a2a.body.result.artifacts, [
        { artifactId: 'log', name: 'log', parts: [{ kind: 'text', text: 'line 1' }] },
        { artifactId: 'notes', parts: [{ kind: 'text', text: 'note 1' }], metadata: { complete: true } },
        // Before, streamed: 'late' without the name and metadata of its empty first chunk, 'redo' with
        // the parts it was emptied of ('draft', then 'final'), as the remote's task does not hold them.
        { artifactId: 'late', name: 'late', metadata: { opened: true }, parts: [{ kind: 'text', text: 'late 1' }] },
        { artifactId: 'redo', name: 'redone', parts: [{ kind: 'text', text: 'final' }] },
      ]);
      const stored = (await timeline(done.task.id)).filter((e: any) => e.type === 'artifact-update').map((e: any) => e.artifact.artifactId);
      assert.deepEqual(stored.filter((a: string) => a === 'log'), ['log'], 'a chunk that changes nothing is not stored');
    });

    it("cancels the remote task of a local task that failed on the remote's last word (a question too large for it)", async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('one question [bigask]') });
      const id = created.body.task.id;
      const failed = await finished(id, 'failed');
      assert.match(failed.status_message.parts[0].text, /^The agent failed after 1 attempt\(s\): .*\(TASK_MESSAGES_MAX_BYTES\)$/);
      const remoteTask = executor.received.find((r) => r.text === 'one question [bigask]')!.taskId;
      await waitFor(async () => (await remoteStateOf(remoteTask)) === 'canceled', 'the remote task to be canceled', 15000);
      await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('remote task canceled: its local task failed') && l.includes(remoteTask)), 'the log line');
      // Forgotten right after the cancel is answered (and logged): looked for until then.
      await waitFor(async () => (await testDb()('remote_agent_tasks').where({ task_id: id }).first()) === undefined, 'the remote task to be forgotten');
    });

    it('cancels the remote task when the local task is canceled', async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('long job [hang]') });
      const id = created.body.task.id;
      const started = await waitFor(async () => executor.received.find((r) => r.text === 'long job [hang]'), 'the remote run to start');
      await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'working', 'local working');
      const canceled = await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' });
      assert.equal(canceled.status, 200);
      await waitFor(async () => executor.canceled.has(started.taskId), 'the remote cancel');
      const after = await stack.client.get(`/api/task/v1/${id}`);
      assert.equal(after.body.task.status, 'canceled');
    });

    it('cancels the remote task of a local task canceled before the remote named it (its first event came late)', async () => {
      const text = 'late start [slowstart] [hang]';
      const created = await stack.client.post('/api/task/v1', { message: textMessage(text) });
      const id = created.body.task.id;
      const started = await waitFor(async () => executor.received.find((r) => r.text === text), 'the remote to take the message');
      assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
      await waitFor(async () => executor.canceled.has(started.taskId), 'the remote cancel', 15000);
      assert.equal(executor.received.filter((r) => r.text === text).length, 1, 'the message was sent once');
    });

    it('forwards nothing for a run stopped before it sent (canceled while it read the card)', async () => {
      // The handler itself, called as the runtime calls it, with its signal aborted at once.
      const text = 'canceled before sending';
      const created = await stack.client.post('/api/task/v1', { message: textMessage(text, 'agent') });
      const task = await testDb()('tasks').where({ id: created.body.task.id }).first();
      const message = created.body.message;
      const log = pino({ level: 'silent' });
      const { handler } = remoteAgent({ url: remote.url, apiKey: REMOTE_KEY, db: testDb(), log });
      const stop = new AbortController();
      const nothing = async () => { throw new Error('not expected'); };
      const ctx = { task, message, history: [message], signal: stop.signal, log, reply: nothing, setStatus: nothing, emitArtifact: nothing } as unknown as AgentContext;
      const run = handler(ctx);
      stop.abort(new Error('task canceled'));
      await assert.rejects(run);
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.equal(executor.received.filter((r) => r.text === text).length, 0, 'the remote was sent the message of a stopped run');
    });

    it('forwards an answer a client gave while the first run was going to the same remote task, which it leaves running', async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('first [hang]') });
      const id = created.body.task.id;
      const started = await waitFor(async () => executor.received.find((r) => r.text === 'first [hang]'), 'the remote run to start');
      await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'working', 'local working');
      // The client takes the task from its run and answers it.
      assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'input-required' })).status, 200);
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('second'))).status, 201);
      const done = await finished(id, 'completed');
      assert.equal(done.status_message.parts[0].text, 'Remote turn 2: second');
      const answer = executor.received.find((r) => r.text === 'second')!;
      assert.equal(answer.taskId, started.taskId, 'the answer went to the same remote task');
      assert.ok(!executor.canceled.has(started.taskId), 'the remote task was not canceled');
    });

    it('cancels the remote task of a local task canceled while it waits for input (no run going)', async () => {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('shall I [ask]') });
      const id = created.body.task.id;
      await finished(id, 'input-required');
      const remoteTask = executor.received.find((r) => r.text === 'shall I [ask]')!.taskId;
      // Its run is over: the remote's server cancels the task itself (its executor is not running).
      assert.equal(await remoteStateOf(remoteTask), 'input-required');
      assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
      await waitFor(async () => (await remoteStateOf(remoteTask)) === 'canceled', 'the remote task to be canceled', 15000);
      await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('remote task canceled: its local task was canceled between runs') && l.includes(remoteTask)), 'the log line');
    });

    if (streaming) it('fails the local task with the reason when the remote agent is unreachable, saying why', async () => {
      // A port nothing listens on (fetch refuses port 9 itself, as a "bad port").
      const closed = http.createServer();
      await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
      const { port } = closed.address() as AddressInfo;
      await new Promise((resolve) => closed.close(resolve));
      const other = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: `http://127.0.0.1:${port}`, AGENT_ATTEMPTS: '2' });
      try {
        const failed = await failedTaskOn(other);
        // Why: undici's own words, "fetch failed", said nothing of it.
        assert.equal(failed.status_message.parts[0].text, `The agent failed after 2 attempt(s): the remote agent card at http://127.0.0.1:${port} could not be read: the remote agent could not be reached: connect ECONNREFUSED 127.0.0.1:${port}`);
      } finally {
        await other.stop();
      }
    });

    if (streaming) it('names AGENT_REMOTE_URL in a failure without its user info or parameter values (to the client and in the log)', async () => {
      const other = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: 'http://agent:url-password-0123@127.0.0.1:9/card.json?token=url-token-4567', AGENT_ATTEMPTS: '1' });
      try {
        const failed = await failedTaskOn(other);
        const reason = failed.status_message.parts[0].text as string;
        assert.match(reason, /remote agent card at http:\/\/\*\*\*:\*\*\*@127\.0\.0\.1:9\/card\.json\?token=\*\*\* could not be read/);
        await waitFor(async () => other.workers[0].logs.some((l) => l.includes('agent run failed')), 'the failure in the worker log');
        for (const secret of ['url-password-0123', 'url-token-4567']) {
          assert.ok(!reason.includes(secret), reason);
          assert.ok(![...other.workers[0].logs, ...other.api.logs].some((l) => l.includes(secret)), `${secret} in a log line`);
        }
      } finally {
        await other.stop();
      }
    });
  });
}

describe("remote A2A agent: where AGENT_REMOTE_API_KEY is sent", () => {
  let remote: Awaited<ReturnType<typeof startRemoteAgent>>;
  before(async () => {
    await resetDb();
    remote = await startRemoteAgent(new RemoteExecutor(), true, true);
  });
  after(async () => remote?.close());

  it("withholds the key from an endpoint the card names on another origin", async () => {
    // Attempts to spare, a minute apart: the refusal fails the run at once all the same.
    const stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, AGENT_ATTEMPTS: '3', AGENT_BACKOFF_MS: '60000', AGENT_REMOTE_ALLOW_PRIVATE: 'true' });
    try {
      remote.refused.length = 0;
      const done = await outcome(stack, 'who gets the key?');
      assert.equal(done.task.status, 'failed');
      assert.match(done.status_message.parts[0].text, /refused this worker's credentials \(not retried; check AGENT_REMOTE_API_KEY\): .*\b401\b/);
      // The failure says why, naming the origin (the key itself never).
      assert.match(done.status_message.parts[0].text, new RegExp(`AGENT_REMOTE_API_KEY was withheld from ${remote.endpointOrigin.replace(/[.]/g, '\\.')}`));
      // The card was read with the key (AGENT_REMOTE_URL's origin); the endpoint got none.
      assert.ok(remote.refused.length > 0 && remote.refused.every((r) => r === 'POST /agents/echo/rpc'), remote.refused.join(', '));
      const logs = stack.workers.flatMap((w) => w.logs).join('\n');
      assert.ok(logs.includes('AGENT_REMOTE_API_KEY withheld') && logs.includes(remote.endpointOrigin), logs);
      assert.ok(!logs.includes(REMOTE_KEY));
    } finally {
      await stack.stop();
    }
  });

  it('fails the task at once, not retried, when the remote refuses the key itself', async () => {
    const stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: 'not-the-remote-key', AGENT_ATTEMPTS: '3', AGENT_BACKOFF_MS: '60000' });
    try {
      remote.refused.length = 0;
      const done = await outcome(stack, 'wrong key');
      assert.equal(done.task.status, 'failed');
      assert.match(done.status_message.parts[0].text, /^The remote agent refused this worker's credentials \(not retried; check AGENT_REMOTE_API_KEY\): the remote agent card at .* could not be read: .*401/);
      assert.deepEqual(remote.refused, ['GET /agents/echo/.well-known/agent-card.json']);
      assert.ok(!stack.workers.flatMap((w) => w.logs).join('\n').includes('not-the-remote-key'));
    } finally {
      await stack.stop();
    }
  });

  it('calls no endpoint the card names on another origin at an internal address, unless AGENT_REMOTE_ALLOW_PRIVATE', async () => {
    const stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, AGENT_ATTEMPTS: '1' });
    try {
      remote.refused.length = 0;
      const done = await outcome(stack, 'aimed inside');
      assert.equal(done.task.status, 'failed');
      assert.match(done.status_message.parts[0].text, new RegExp(`remote agent endpoint ${remote.endpointOrigin.replace(/[.]/g, '\\.')} that its card names .*private, loopback or link-local.*AGENT_REMOTE_ALLOW_PRIVATE=true`));
      // The card was read (AGENT_REMOTE_URL's own origin may be internal: the operator named it); the endpoint heard nothing.
      assert.deepEqual(remote.refused, []);
    } finally {
      await stack.stop();
    }
  });

  // A run (two attempts) on a remote (`streaming` or not) whose card names an endpoint that answers
  // every call with `answer`: the task as it failed, its job in Redis and the worker's output (stdout and stderr).
  // Its key: found nowhere else (a start of REMOTE_KEY, "remote-a", is in this worker's file names).
  const QUOTED_KEY = `tbk-${randomUUID()}`;
  async function failedOnRemote(streaming: boolean, answer: (req: http.IncomingMessage, res: http.ServerResponse) => void) {
    const remote = http.createServer((req, res) => {
      const origin = `http://127.0.0.1:${(remote.address() as AddressInfo).port}`;
      if (req.url === '/rpc-fails/.well-known/agent-card.json') answerAgentCard(res, { name: 'q', description: 'q', url: `${origin}/rpc-fails/rpc`, streaming });
      else answer(req, res);
    });
    await new Promise<void>((resolve) => remote.listen(0, '127.0.0.1', resolve));
    const origin = `http://127.0.0.1:${(remote.address() as AddressInfo).port}`;
    try {
      const stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: `${origin}/rpc-fails`, AGENT_REMOTE_API_KEY: QUOTED_KEY, AGENT_ATTEMPTS: '2' });
      try {
        const done = await outcome(stack, 'who sees the key?');
        assert.equal(done.task.status, 'failed');
        // The task reads failed before the worker has logged the last attempt and its job has ended.
        await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('agent run failed for good')), 'the final failure in the worker log');
        const jobs = await waitFor(() => withQueue(stack.env, 'agent-tasks', async (q) => {
          const ended = await q.getJobs(['failed', 'completed']);
          return ended.length > 0 && JSON.stringify(ended);
        }), 'the job to end in Redis');
        return { done, jobs, logs: [...stack.workers[0].logs] };
      } finally {
        await stack.stop();
      }
    } finally {
      remote.closeAllConnections();
      remote.close();
    }
  }

  it('masks the key where a remote quotes it in an error answer: in the status message, the worker log and the job in Redis', async () => {
    // A remote whose endpoint's errors (500) quote the request's Authorization header, as sent and
    // percent-encoded in lowercase.
    const { done, jobs, logs } = await failedOnRemote(false, (req, res) => {
      res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({
        error: `cannot serve ${req.method} with authorization ${req.headers.authorization} (${[...Buffer.from(req.headers.authorization ?? '')].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('')})`,
      }));
    });
    assert.match(done.status_message.parts[0].text, /500.*authorization \*\*\* \(\*\*\*\)/);
    assert.match(jobs, /authorization \*\*\* \(\*\*\*\)/, 'the job holds the masked reason');
    for (const text of [JSON.stringify(done), jobs, ...logs]) assert.ok(!text.includes(QUOTED_KEY), text.slice(0, 400));
  });

  it('quotes no part of the key from a stream line that is not JSON, where the SDK cuts its quote of the line at character 100', async () => {
    // The line echoes the Authorization header, the key across character 100.
    const { done, jobs, logs } = await failedOnRemote(true, (req, res) => {
      let body = '';
      req.on('data', (b) => { body += b; });
      req.on('end', () => {
        const { id, method } = JSON.parse(body) as { id: number; method: string };
        const echo = `${'.'.repeat(90 - 'Bearer '.length)}${req.headers.authorization} is what you sent`;
        // The retry reads the remote task the stream named: answered alike.
        if (method === 'tasks/get') {
          res.writeHead(200, { 'content-type': 'application/json' }).end(echo);
          return;
        }
        // The task named first: a stream that fails before it names one fails the task at once, unretried.
        const task = { kind: 'task', id: 'remote-q', contextId: 'remote-ctx', status: { state: 'working' } };
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(`data: ${JSON.stringify({ jsonrpc: '2.0', id, result: task })}\n\ndata: ${echo}\n\n`);
      });
    });
    // Before: 'Failed to parse SSE event data: "....Bearer remote-api-key..."...', the key's start unmasked.
    assert.equal(done.status_message.parts[0].text, "The agent failed after 2 attempt(s): the remote agent answered what is not JSON: Unexpected token '.'");
    assert.match(jobs, /the remote agent answered what is not JSON: Unexpected token '\.'/, 'the retried attempt\'s reason in the job');
    // No 8 characters of the key together (the masker lets a start of it shorter than that before an ellipsis pass).
    for (const text of [JSON.stringify(done), jobs, ...logs]) {
      for (let i = 0; i + 8 <= QUOTED_KEY.length; i++) assert.ok(!text.includes(QUOTED_KEY.slice(i, i + 8)), text.slice(0, 400));
    }
  });

  it('says the HTTP status of a remote (or its proxy) that answers an error page that is not JSON, its quote of the key masked', async () => {
    const { done, jobs, logs } = await failedOnRemote(false, (req, res) => {
      req.resume();
      res.writeHead(502, { 'content-type': 'text/html' }).end(`<html>Bad Gateway for ${req.headers.authorization}</html>`);
    });
    // Before: "the remote agent answered what is not JSON: Unexpected token '<'", the status lost.
    assert.match(done.status_message.parts[0].text, /^The agent failed after 2 attempt\(s\): HTTP error for message\/send! Status: 502 Bad Gateway\. Response: <html>Bad Gateway for (Bearer )?\*\*\*<\/html>/);
    for (const text of [JSON.stringify(done), jobs, ...logs]) assert.ok(!text.includes(QUOTED_KEY), text.slice(0, 400));
  });

  it("bounds a remote's error answer of megabytes, which the failure reason quotes, in the worker log and the job in Redis", async () => {
    const page = 'x'.repeat(4 * 1024 * 1024);
    const { done, jobs, logs } = await failedOnRemote(false, (req, res) => {
      req.resume();
      res.writeHead(500, { 'content-type': 'text/plain' }).end(`${req.headers.authorization} ${page}`);
    });
    assert.match(done.status_message.parts[0].text, /^The agent failed after 2 attempt\(s\): HTTP error for message\/send! Status: 500 Internal Server Error\. Response: (Bearer )?\*\*\* xxx/);
    // Before: the whole page in the two failures' log lines, and in the retried attempt's failedReason and stack in Redis.
    for (const line of logs) assert.ok(line.length < 4096, `a log line of ${line.length} characters: ${line.slice(0, 200)}`);
    const [job] = JSON.parse(jobs) as { failedReason?: string; stacktrace?: string[] }[];
    assert.match(job.failedReason ?? '', /Status: 500 Internal Server Error\. Response: (Bearer )?\*\*\* xxx/);
    assert.ok(job.failedReason!.length < 4096, `a failedReason of ${job.failedReason!.length} characters`);
    assert.ok(job.stacktrace?.length && job.stacktrace.every((s) => s.length < 4096), `stacks of ${job.stacktrace?.map((s) => s.length).join(', ')} characters`);
    for (const text of [JSON.stringify(done), jobs, ...logs]) assert.ok(!text.includes(QUOTED_KEY), text.slice(0, 400));
  });

  it('sends it to an origin AGENT_REMOTE_KEY_ORIGINS trusts', async () => {
    const stack = await startStack({
      AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, AGENT_ATTEMPTS: '1',
      AGENT_REMOTE_KEY_ORIGINS: `https://other.example,${remote.endpointOrigin}`,
    });
    try {
      remote.refused.length = 0;
      const done = await outcome(stack, 'trusted');
      assert.equal(done.task.status, 'completed');
      assert.deepEqual(remote.refused, []);
    } finally {
      await stack.stop();
    }
  });
});

// A remote agent that notes each task it is asked to cancel (and answers after `delayMs`), and a
// stack of `workers` on it with `env`; `waitingTaskCanceled` makes a task that waits for input,
// cancels it with `cancel`, and waits for its remote task to be canceled and forgotten.
function useCancelCountingRemote(env: Record<string, string>, workers: number, delayMs = 0) {
  const executor = new RemoteExecutor();
  const cancels: string[] = [];
  const on = {} as { stack: Stack; remote: Awaited<ReturnType<typeof startRemoteAgent>> };
  before(async () => {
    await resetDb();
    const countCancels: express.RequestHandler[] = [express.json(), (req, _res, next) => {
      if (req.body?.method !== 'tasks/cancel') return next();
      cancels.push(req.body.params?.id);
      setTimeout(next, delayMs);
    }];
    on.remote = await startRemoteAgent(executor, true, false, true, countCancels);
    on.stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: on.remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, ...env }, { workers });
  });
  after(async () => {
    await on.stack?.stop();
    await on.remote?.close();
  });
  const waitingTaskCanceled = async (text: string, cancel: (id: string) => Promise<void>, withinMs: number) => {
    const { stack } = on;
    const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'input-required', 'the task to wait for input');
    const remoteTask = executor.received.find((r) => r.text === text)!.taskId;
    await cancel(id);
    // Its run is over: the remote's server cancels the task itself (its executor is not running).
    await waitFor(async () => cancels.includes(remoteTask) && !(await testDb()('remote_agent_tasks').where({ task_id: id }).first()), 'the remote task canceled and forgotten', withinMs);
    return remoteTask;
  };
  return { on, cancels, waitingTaskCanceled };
}

describe('remote A2A agent: a fleet of workers cancels a left remote task', () => {
  // The remote takes 1.5 s to answer a cancel: the housekeeping pass of every worker (every
  // 300 ms) comes round while the first cancel is still under way.
  const { on, cancels, waitingTaskCanceled } = useCancelCountingRemote({ JOB_RECOVERY_MS: '300' }, 3, 1500);

  it('asks the remote once, whichever worker takes it', async () => {
    const remoteTask = await waitingTaskCanceled('left behind [ask]', async (id) => {
      assert.equal((await on.stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
    }, 15000);
    // A few more passes of every worker: none asks again.
    await sleep(1000);
    assert.deepEqual(cancels, [remoteTask]);
  });
});

describe('remote A2A agent: a task canceled between runs, long before the next housekeeping pass', () => {
  // JOB_RECOVERY_MS as by default: the passes come round once a minute.
  const { on, cancels, waitingTaskCanceled } = useCancelCountingRemote({ JOB_RECOVERY_MS: '60000' }, 2);

  it('cancels the remote task of a task canceled while it waits for input within seconds, once', async () => {
    // Before, at the next pass: up to JOB_RECOVERY_MS (a minute) of the remote going on; now 6 s after the cancel.
    const remoteTask = await waitingTaskCanceled('waiting [ask]', async (id) => {
      const canceled = await on.stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/cancel', params: { id } });
      assert.equal(canceled.body.result.status.state, 'canceled');
    }, 20000);
    // Both workers were told of the cancel: one asked the remote.
    await sleep(3000);
    assert.deepEqual(cancels, [remoteTask]);
  });
});

for (const keepsHistory of [true, false]) describe(`remote A2A agent${keepsHistory ? '' : ' that shows no task history'}: a worker stopped before the remote named its task`, () => {
  let stack: Stack;
  let remote: Awaited<ReturnType<typeof startRemoteAgent>>;
  const executor = new RemoteExecutor();
  before(async () => {
    await resetDb();
    remote = await startRemoteAgent(executor, true, false, keepsHistory);
    stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, WORKER_SHUTDOWN_GRACE_MS: '300' }, { workers: 1 });
  });
  after(async () => {
    await stack?.stop();
    await remote?.close();
  });

  // The remote says nothing for 1.5 s after taking the message ([slowstart]), well past the 300 ms
  // grace period, then reports at once what it did; the worker is stopped meanwhile.
  const stopWorkerDuring = async (text: string, send = async () => (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string) => {
    const id = await send();
    const started = await waitFor(async () => executor.received.find((r) => r.text === text), 'the remote to take the message');
    const worker = stack.workers.shift()!;
    const exited = worker.kill('SIGTERM');
    stack.workers.push(await startWorker(stack.env));
    await exited;
    assert.equal(worker.child.exitCode, 0);
    assert.ok(worker.logs.some((l) => l.includes('grace period over: agent runs handed back to the queue')), worker.logs.slice(-10).join('\n'));
    return { id, remoteTaskId: started.taskId };
  };
  const agentTexts = async (id: string) =>
    (await stack.client.get(`/api/task/v1/${id}/message?page_size=100`)).body.items.filter((m: any) => m.role === 'agent').map((m: any) => m.parts[0].text);

  it('sends the message once: the stopping worker records the remote task before handing the run back, and the next worker follows it', async () => {
    const text = 'stopped early [slowstart] [hang]';
    const { id, remoteTaskId } = await stopWorkerDuring(text);
    // The next worker mirrors the working update the remote made after the first worker stopped.
    await waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${id}`);
      return r.body.status_message?.parts[0]?.text === `thinking about ${text}` && r.body;
    }, 'the remote task followed by the next worker', 20000);
    assert.equal(executor.received.filter((r) => r.text === text).length, 1, 'the message was sent once');
    assert.deepEqual(await agentTexts(id), [`thinking about ${text}`]);
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
    await waitFor(async () => executor.canceled.has(remoteTaskId), 'the remote cancel', 15000);
  });

  // Without the remote's history, a run cannot tell whether an interrupted remote task has its message.
  if (keepsHistory) it('ends the turn the remote ended meanwhile (it asked for input), mirroring what it said, without sending again', async () => {
    const text = 'stopped early [slowstart] [ask]';
    const { id } = await stopWorkerDuring(text);
    const waiting = await waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${id}`);
      return r.body.task.status === 'input-required' && r.body;
    }, 'the local task to wait for input', 20000);
    assert.deepEqual(waiting.status_message.parts, [{ type: 'text-part', text: 'Which colour?' }]);
    assert.equal(executor.received.filter((r) => r.text === text).length, 1, 'the message was sent once');
    assert.deepEqual(await agentTexts(id), [`thinking about ${text}`, 'Which colour?']);
  });

  if (keepsHistory) it('follows a later turn handed back before the remote took it up, past the question it answers, to its end', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('second turn [ask]') })).body.task.id;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'input-required', 'the question');
    // The remote still shows its question for 4 s after taking the answer: the next worker finds it so.
    const answer = 'green [slowstart 4000]';
    await stopWorkerDuring(answer, async () => {
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage(answer))).status, 201);
      return id;
    });
    const done = await waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${id}`);
      return r.body.task.status !== 'working' && r.body;
    }, 'the second turn to end', 20000);
    assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
    assert.equal(done.status_message.parts[0].text, `Remote turn 2: ${answer}`);
    assert.equal(executor.received.filter((r) => r.text === answer).length, 1, 'the answer was sent once');
    assert.deepEqual(await agentTexts(id), ['thinking about second turn [ask]', 'Which colour?', `thinking about ${answer}`, `Remote turn 2: ${answer}`]);
  });
});

// The first worker sends the message and is frozen past its job's lock before the remote answers;
// the second takes the job again, sends the message again (nothing recorded) and records the remote
// task it follows. The remote then names the first task to the first worker: once it was woken and
// aborted, or while it is frozen, so that it reads the event before it learns of the abort. Recorded
// over the second's, the task's row named a remote task no run followed, and the first was left
// running with nobody to cancel it.
for (const named of ['after the stalled take was aborted', 'while the stalled take is frozen']) describe(`remote A2A agent: a first turn taken over from a worker that stalled, the remote naming its task ${named}`, () => {
  let stack: Stack;
  let remote: Awaited<ReturnType<typeof startRemoteAgent>>;
  const executor = new RemoteExecutor();
  before(async () => {
    await resetDb();
    remote = await startRemoteAgent(executor, true);
    stack = await startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: remote.url, AGENT_REMOTE_API_KEY: REMOTE_KEY, WORKER_LOCK_MS: '1000', WORKER_STALLED_CHECK_MS: '500' }, { workers: 0 });
  });
  after(async () => {
    for (const w of stack?.workers ?? []) w.child.kill('SIGCONT');
    await stack?.stop();
    await remote?.close();
  });

  it("cancels the remote task the stalled take named late, and keeps the task's row on the one the take that has the task follows", async () => {
    const first = await startWorker(stack.env);
    stack.workers.push(first);
    const text = 'taken over [gatefirst] [hang]';
    const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id;
    const stalled = await waitFor(async () => executor.received.find((r) => r.text === text), 'the remote to take the first send');
    first.child.kill('SIGSTOP');
    stack.workers.push(await startWorker(stack.env));
    const row = await waitFor(async () => {
      const r = await testDb()('remote_agent_tasks').where({ task_id: id }).first();
      return r?.remote_task_id !== undefined && r.remote_task_id !== stalled.taskId && r;
    }, 'the second take to record the remote task it follows', 20000);
    if (named.startsWith('while')) {
      executor.gates.get(text)!();
      await sleep(300);
      first.child.kill('SIGCONT');
    } else {
      first.child.kill('SIGCONT');
      await waitFor(async () => first.logs.some((l) => l.includes(id) && l.includes('agent run aborted: its job taken again elsewhere')), 'the first take aborted', 10000);
      executor.gates.get(text)!();
    }
    await waitFor(async () => executor.canceled.has(stalled.taskId), "the first take's remote task canceled", 10000);
    assert.equal((await testDb()('remote_agent_tasks').where({ task_id: id }).first())?.remote_task_id, row.remote_task_id);
    assert.equal(executor.canceled.has(row.remote_task_id), false);
    // The task's cancel reaches the remote task that is followed.
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
    await waitFor(async () => executor.canceled.has(row.remote_task_id), 'the followed remote task canceled', 15000);
  });
});

// A remote that misbehaves as `mode` says: its card trickles in a byte at a time for ever, or is a
// gzip bomb; or its card is fine and its message/stream sends one line that never ends.
describe('remote A2A agent that answers without end, or about another task', () => {
  // Unlike REMOTE_KEY, no message of these tests ends with a start of it ("remote-a"), which would be masked as a key cut short.
  const QUOTED_KEY = `qk-${randomUUID()}`;
  let mode: 'trickle-card' | 'trickle-card-sse' | 'trickle-rpc-sse' | 'empty-parts' | 'empty-answer' | 'cancel-refused' | 'bomb-card' | 'endless-line' | 'other-task' | 'shapeless' | 'shapeless-quoting' | 'garbled' | 'garbled-get' | 'other-get' | 'rpc-error' | 'refused-rpc' | 'not-json' | 'rpc-error-cut' | 'rpc-error-cut-end' = 'trickle-card';
  // What the remote answers, in 'garbled' mode, after the task: an event of a known kind with a member of another shape.
  let garbled: unknown;
  let streamClosed = false;
  let trickledCards = 0;
  // The gzip bomb, compressed before the run reads it: compressing 64 MiB takes longer than AGENT_REMOTE_TIMEOUT_MS on a busy machine.
  let bomb = Buffer.alloc(0);
  const server = http.createServer((req, res) => {
    const origin = `http://${req.headers.host}`;
    if (req.method === 'GET' && mode === 'trickle-card') {
      trickledCards++;
      res.writeHead(200, { 'content-type': 'application/json' });
      const tick = setInterval(() => res.write(' '), 100);
      res.on('close', () => clearInterval(tick));
    } else if ((req.method === 'GET' && mode === 'trickle-card-sse') || (req.method === 'POST' && mode === 'trickle-rpc-sse')) {
      // Labelled a stream, and never ending: a line a tick, as a stream's would be.
      trickledCards++;
      req.resume();
      res.writeHead(mode === 'trickle-card-sse' ? 200 : 500, { 'content-type': 'text/event-stream' });
      const tick = setInterval(() => res.write(': tick\n'), 100);
      res.on('close', () => clearInterval(tick));
    } else if (req.method === 'GET' && mode === 'bomb-card') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
      res.end(bomb);
    } else if (req.method === 'GET') {
      answerAgentCard(res, { name: 'endless', description: 'streams one endless line', url: `${origin}/rpc`, streaming: true });
    } else if (mode === 'not-json') {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('this is not json');
    } else if (mode === 'refused-rpc') {
      // Refused by its HTTP status, its body a JSON-RPC error: the SDK reports the error's code, not the status.
      req.resume();
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: 1, error: { code: -32001, message: 'Unauthorized' } }));
    } else if (mode === 'cancel-refused') {
      // A task that works on, whose cancel is refused with a long answer quoting the key.
      let body = '';
      req.on('data', (b) => { body += b; });
      req.on('end', () => {
        const { id, method } = JSON.parse(body) as { id: string | number; method: string };
        if (method === 'tasks/cancel') {
          res.writeHead(500, { 'content-type': 'text/plain' });
          res.end(`refused for ${req.headers.authorization}: ${'x'.repeat(5000)}`);
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', id, result: { kind: 'task', id: 'remote-w', contextId: 'remote-ctx', status: { state: 'working' } } })}\n\n`);
      });
    } else if (mode === 'empty-parts' || mode === 'empty-answer') {
      // Messages of no parts, which A2A allows: as the answer itself, or in a task that then completes.
      let body = '';
      req.on('data', (b) => { body += b; });
      req.on('end', () => {
        const { id } = JSON.parse(body) as { id: string | number };
        const event = (result: unknown) => `data: ${JSON.stringify({ jsonrpc: '2.0', id, result })}\n\n`;
        const empty = (messageId: string) => ({ kind: 'message', role: 'agent', messageId, parts: [] });
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        if (mode === 'empty-answer') {
          res.end(event(empty('empty-answer')));
          return;
        }
        res.write(event({ kind: 'task', id: 'remote-e', contextId: 'remote-ctx', status: { state: 'working' } }));
        res.write(event({ ...empty(randomUUID()), taskId: 'remote-e', contextId: 'remote-ctx' }));
        res.write(event({ kind: 'status-update', taskId: 'remote-e', contextId: 'remote-ctx', status: { state: 'working', message: empty(randomUUID()) } }));
        res.end(event({ kind: 'status-update', taskId: 'remote-e', contextId: 'remote-ctx', final: true,
          status: { state: 'completed', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text: 'done, after two empty messages' }] } } }));
      });
    } else if (mode === 'other-task' || mode === 'shapeless' || mode === 'shapeless-quoting' || mode === 'garbled' || mode === 'garbled-get' || mode === 'other-get' || mode === 'rpc-error' || mode === 'rpc-error-cut' || mode === 'rpc-error-cut-end') {
      let body = '';
      req.on('data', (b) => { body += b; });
      req.on('end', () => {
        const { id, method } = JSON.parse(body) as { id: string | number; method: string };
        const event = (result: unknown) => `data: ${JSON.stringify({ jsonrpc: '2.0', id, result })}\n\n`;
        // A later turn reads the remote task first: its history is garbled ("other-get": it is another task, ended).
        if (method === 'tasks/get') {
          res.writeHead(200, { 'content-type': 'application/json' });
          const task = mode === 'other-get'
            ? { kind: 'task', id: 'remote-z', contextId: 'remote-ctx', status: { state: 'completed', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text: 'not yours' }] } } }
            : { kind: 'task', id: 'remote-a', contextId: 'remote-ctx', status: { state: 'input-required' }, history: [null] };
          res.end(JSON.stringify({ jsonrpc: '2.0', id, result: task }));
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        if (mode === 'rpc-error' || mode === 'rpc-error-cut' || mode === 'rpc-error-cut-end') {
          // "rpc-error-cut": the error quotes the request's Authorization header cut short, inside its
          // message; "rpc-error-cut-end": at its message's end (which the SDK follows with the code and data).
          const cut = req.headers.authorization?.slice(0, 'Bearer '.length + 10);
          const message = mode === 'rpc-error' ? 'the model provider answered 403 Forbidden' : mode === 'rpc-error-cut' ? `the token "${req.headers.authorization?.slice(0, 'Bearer '.length + 12)}..." has expired` : `bad header ${cut}`;
          res.end(`data: ${JSON.stringify({ jsonrpc: '2.0', id, error: { code: -32603, message } })}\n\n`);
          return;
        }
        if (mode === 'garbled-get') {
          res.end(event({ kind: 'task', id: 'remote-a', contextId: 'remote-ctx', status: { state: 'input-required', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text: 'which one?' }] } } }));
          return;
        }
        res.write(event({ kind: 'task', id: 'remote-a', contextId: 'remote-ctx', status: { state: 'working' } }));
        if (mode === 'garbled') res.end(event(garbled));
        else if (mode === 'shapeless') res.end(event({ kind: 'status-update', taskId: 'remote-a', contextId: 'remote-ctx', status: null, final: true }));
        // Padded so that the key starts 10 characters before the 200 of the event a failure quotes.
        else if (mode === 'shapeless-quoting') {
          const start = JSON.stringify({ kind: 'status-update', taskId: 'remote-a', contextId: 'remote-ctx', status: null, final: true, note: '' }).length - 2;
          res.end(event({ kind: 'status-update', taskId: 'remote-a', contextId: 'remote-ctx', status: null, final: true, note: `${'.'.repeat(190 - start - 'Bearer '.length)}${req.headers.authorization}` }));
        }
        else res.end(event({ kind: 'status-update', taskId: 'remote-b', contextId: 'remote-ctx', status: { state: 'completed' }, final: true }));
      });
    } else {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: ');
      const chunk = Buffer.alloc(64 * 1024, 'x');
      res.on('close', () => { streamClosed = true; });
      // As fast as the worker reads it, until it hangs up.
      const pump = () => { while (!res.destroyed && res.write(chunk)); };
      res.on('drain', pump);
      pump();
    }
  });
  const stack = useStackOnRawAgent(server, { AGENT_REMOTE_API_KEY: QUOTED_KEY, AGENT_ATTEMPTS: '1', AGENT_REMOTE_TIMEOUT_MS: '1000' });

  const failureOf = async (text: string) => (await failedTaskOn(stack, text)).status_message.parts[0].text as string;

  it('fails the run whose card read does not end within AGENT_REMOTE_TIMEOUT_MS, and reads the card afresh for the next', async () => {
    mode = 'trickle-card';
    assert.match(await failureOf('first'), /card at .* could not be read: the remote agent did not answer within 1000 ms/);
    const reads = trickledCards;
    assert.match(await failureOf('second'), /did not answer within 1000 ms/);
    assert.ok(trickledCards > reads, 'the second run read the card itself, not the first run\'s failed read');
  });

  it('fails the run whose card decodes to more than it holds (a gzip bomb)', async () => {
    bomb = gzipSync(Buffer.alloc(64 * 1024 * 1024, ' '));
    mode = 'bomb-card';
    assert.match(await failureOf('bomb'), /card at .* could not be read: the remote agent answered a body longer than 16777216 bytes/);
  });

  // After the gzip bomb: the second case leaves the card read (the first fails before any is kept).
  it('bounds an answer labelled an event stream like any other where no stream was asked for or granted: a card, a refused message/stream', async () => {
    mode = 'trickle-card-sse';
    assert.match(await failureOf('card as a stream'), /card at .* could not be read: the remote agent did not answer within 1000 ms/);
    mode = 'trickle-rpc-sse';
    // The SDK reads a refused stream's body for its message: cut at the bound, it reads as empty.
    assert.match(await failureOf('refused as a stream'), /HTTP error establishing stream for message\/stream: 500 Internal Server Error\. Response: \(empty\)$/);
  });

  it('completes the task whose remote sends messages of no parts (which A2A allows), skipping them, or answers with one', async () => {
    mode = 'empty-parts';
    const done = await endedTaskOn(stack, 'answer emptily');
    // Before: the first empty message was refused as a reply, which failed the task.
    assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
    assert.equal(done.status_message.parts[0].text, 'done, after two empty messages');
    mode = 'empty-answer';
    const answered = await endedTaskOn(stack, 'answer with nothing');
    assert.equal(answered.task.status, 'completed', JSON.stringify(answered.status_message));
  });

  it('logs a refused cancel of the remote task cut short, the key masked', async () => {
    mode = 'cancel-refused';
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('work on') })).body.task.id;
    await waitFor(async () => (await testDb()('remote_agent_tasks').where({ task_id: id }).first())?.remote_task_id === 'remote-w', 'the remote task to be named');
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
    const line = await waitFor(async () => stack.workers[0].logs.find((l) => l.includes('remote task could not be canceled') && l.includes('remote-w')), 'the warn line');
    const { reason } = JSON.parse(line) as { reason: string };
    // Before: the remote's 5,000 characters whole, in every retry's line.
    assert.ok(reason.length <= 1001 && reason.endsWith('…'), `${reason.length} characters: ${reason.slice(0, 300)}`);
    assert.match(reason, /^HTTP error for tasks\/cancel! Status: 500 Internal Server Error\. Response: refused for \*\*\*: x/);
    assert.ok(!line.includes(QUOTED_KEY), 'the key is masked');
  });

  it('fails the run whose stream sends a line that never ends, and hangs up on it', async () => {
    mode = 'endless-line';
    assert.match(await failureOf('endless'), /the remote agent answered a stream line longer than 16777216 bytes/);
    await waitFor(async () => streamClosed, 'the stream to be closed');
  });

  it('fails the run whose stream turns to another task, and keeps following (and would cancel) its own', async () => {
    mode = 'other-task';
    const failed = await failedTaskOn(stack, 'other');
    assert.match(failed.status_message.parts[0].text, /the remote agent sent an event of task remote-b while following its task remote-a/);
    const row = await testDb()('remote_agent_tasks').where({ task_id: failed.task.id }).first();
    assert.equal(row?.remote_task_id, 'remote-a', 'the local task still names the remote task it sent its message to');
  });

  it('fails the run whose stream sends an event of no known shape, saying what it sent', async () => {
    mode = 'shapeless';
    assert.match(await failureOf('shapeless'), /^The agent failed after 1 attempt\(s\): the remote agent answered a status-update whose status is no status: \{"kind":"status-update","taskId":"remote-a","contextId":"remote-ctx","status":null,"final":true\}$/);
  });

  it('fails the run whose event of a known kind holds a member of another shape, saying where', async () => {
    mode = 'garbled';
    const ids = { taskId: 'remote-a', contextId: 'remote-ctx' };
    const message = (parts: unknown) => ({ kind: 'message', role: 'agent', messageId: 'remote-m', parts });
    const cases: [unknown, string][] = [
      [{ kind: 'reply', ...ids }, 'an event where a task, message, status-update or artifact-update belongs'],
      [message([null]), 'a message whose parts.0 is no part'],
      [message([{ kind: 'file', file: null }]), 'a message whose parts.0.file is no object'],
      [message([{ kind: 'text', text: 'x' }, { kind: 'file' }]), 'a message whose parts.1.file is no object'],
      [{ kind: 'task', id: 'remote-a', contextId: 'remote-ctx', history: [] }, 'a task whose status is no status'],
      [{ kind: 'status-update', ...ids, status: {} }, 'a status-update whose status.state is no A2A task state'],
      // Two faults: the missing member is named (ajv's order; the hand-written checks named the messageId).
      [{ kind: 'message', role: 'agent', messageId: 5 }, 'a message whose parts is no list'],
      [{ kind: 'message', role: 'agent', parts: [] }, 'a message whose messageId is no string of at most 256 characters without NUL'],
      // Kept for the run (every message id seen) and in Postgres (the remote task's): a long one held
      // megabytes a message, and a NUL failed the row's write, which sent the message again.
      [{ ...message([{ kind: 'text', text: 'x' }]), messageId: 'm'.repeat(257) }, 'a message whose messageId is no string of at most 256 characters without NUL'],
      [{ kind: 'status-update', taskId: 'remote-a\u0000', contextId: 'remote-ctx', status: { state: 'working' } }, 'a status-update whose taskId is no string of at most 256 characters without NUL'],
      [{ kind: 'task', id: 'remote-a', contextId: 'c'.repeat(300), status: { state: 'working' } }, 'a task whose contextId is no string of at most 256 characters without NUL'],
      [{ kind: 'artifact-update', ...ids, artifact: { artifactId: 'a\u0000', parts: [] } }, 'an artifact-update whose artifact.artifactId is no string of at most 256 characters without NUL'],
      [{ kind: 'task', id: 'remote-a', contextId: 'remote-ctx', status: { state: 'working' }, history: {} }, 'a task whose history is no list'],
      [{ kind: 'task', id: 'remote-a', contextId: 'remote-ctx', status: { state: 'working' }, artifacts: [null] }, 'a task whose artifacts.0 is no artifact'],
      [{ kind: 'status-update', ...ids, status: { state: 'working', message: 'thinking' } }, 'a status-update whose status.message is no message'],
      // Before: followed as a task still running, for ever.
      [{ kind: 'status-update', ...ids, status: { state: 'finished' }, final: true }, 'a status-update whose status.state is no A2A task state'],
      [{ kind: 'artifact-update', ...ids, artifact: { parts: [{ kind: 'text', text: 'x' }] } }, 'an artifact-update whose artifact.artifactId is no string of at most 256 characters without NUL'],
    ];
    for (const [event, where] of cases) {
      garbled = event;
      const failure = await failureOf('garbled');
      // Before: a TypeError ("Cannot read properties of null", "is not iterable"), or garbage stored.
      assert.equal(failure, `The agent failed after 1 attempt(s): the remote agent answered ${where}: ${JSON.stringify(event).slice(0, 200)}`);
    }
  });

  it('fails the later turn whose remote task, read first, holds a member of another shape', async () => {
    mode = 'garbled-get';
    const created = await stack.client.post('/api/task/v1', { message: textMessage('garbled later') });
    const id = created.body.task.id as string;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'input-required' || undefined, 'the task to ask for input');
    await stack.client.post(`/api/task/v1/${id}/message`, textMessage('this one'));
    const failed = await waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${id}`);
      return r.body.task.status === 'failed' && r.body;
    }, 'the task to fail');
    assert.match(failed.status_message.parts[0].text, /^The agent failed after 1 attempt\(s\): the remote agent answered a task whose history\.0 is no message: /);
  });

  it("takes a remote's error that quotes a 401 or 403 of its own for an agent failure, not for a refusal of this worker's key", async () => {
    mode = 'rpc-error';
    // Before: "The remote agent refused this worker's credentials (not retried; check AGENT_REMOTE_API_KEY): ...".
    assert.equal(await failureOf('rpc error'), 'The agent failed after 1 attempt(s): SSE event contained an error: the model provider answered 403 Forbidden (Code: -32603) Data: {}');
  });

  // A task the remote asks for input (mode garbled-get), whose next turn meets the remote in `later`: the task as it failed.
  async function laterTurnFailing(text: string, later: typeof mode) {
    mode = 'garbled-get';
    const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'input-required' || undefined, 'the task to ask for input');
    mode = later;
    await stack.client.post(`/api/task/v1/${id}/message`, textMessage('and now?'));
    return waitFor(async () => {
      const r = await stack.client.get(`/api/task/v1/${id}`);
      return r.body.task.status === 'failed' && r.body;
    }, 'the task to fail');
  }

  it('fails the later turn whose call the remote answers with what is not JSON, saying the remote did', async () => {
    const failed = await laterTurnFailing('not json later', 'not-json');
    // Before: the parser's words alone, which named no party.
    // Its words without the parser's quote of the answer, which may echo the request, key and all.
    assert.equal(failed.status_message.parts[0].text, 'The agent failed after 1 attempt(s): the remote agent answered what is not JSON: Unexpected token \'h\'');
  });

  it('fails the later turn whose remote answers tasks/get with another task, ending nothing by it', async () => {
    const failed = await laterTurnFailing('other task later', 'other-get');
    // Before: the local task completed with the other task's status message, "not yours".
    assert.equal(failed.status_message.parts[0].text, 'The agent failed after 1 attempt(s): the remote agent answered tasks/get for its task remote-a with task remote-z');
    assert.ok(!failed.messages.some((m: { parts: { text?: string }[] }) => m.parts.some((p) => p.text === 'not yours')));
  });

  it("takes a call answered 401 with a JSON-RPC error as its body for a refusal of this worker's key", async () => {
    // A later turn reads the remote task first (tasks/get, a JSON-RPC call): refused by its status.
    const failed = await laterTurnFailing('refused later', 'refused-rpc');
    // Before: "The agent failed after 1 attempt(s): Task not found" (the SDK's word for the error's code), retried had there been attempts left.
    assert.match(failed.status_message.parts[0].text, /^The remote agent refused this worker's credentials \(not retried; check AGENT_REMOTE_API_KEY\): the remote agent answered HTTP 401\b/);
  });

  it("masks the start of the key a remote's error quotes cut short, inside its message", async () => {
    mode = 'rpc-error-cut';
    // Before: the key's first 12 characters, as the remote quoted them (only a cut at the text's end was masked).
    assert.equal(await failureOf('rpc error cut'), 'The agent failed after 1 attempt(s): SSE event contained an error: the token "Bearer ***" has expired (Code: -32603) Data: {}');
  });

  it("masks the start of the key a remote's error quotes cut short at its message's end, which the SDK follows with the code", async () => {
    mode = 'rpc-error-cut-end';
    // Before: the key's first 10 characters (a cut was masked at the text's end only, and the SDK's ' (Code: …) Data: …' came after it).
    assert.equal(await failureOf('rpc error cut at the end'), 'The agent failed after 1 attempt(s): SSE event contained an error: bad header Bearer *** (Code: -32603) Data: {}');
  });

  it('masks the part of the key left where the quote of such an event is cut short', async () => {
    mode = 'shapeless-quoting';
    const failure = await failureOf('shapeless quoting');
    assert.match(failure, /"note":"\.+Bearer \*\*\*$/);
    assert.ok(!failure.includes(QUOTED_KEY.slice(0, 10)), failure);
  });
});

describe('remote A2A agent whose origin answers with a redirect', () => {
  // An internal service a redirect points at: it records what reached it and answers with a page of its own.
  const reached: string[] = [];
  const internal = http.createServer((req, res) => {
    let body = '';
    req.on('data', (b) => { body += b; });
    req.on('end', () => {
      reached.push(`${req.method} ${req.url} ${body}`);
      res.writeHead(404, { 'content-type': 'text/plain' }).end('INTERNAL-SECRET-PAGE admin console');
    });
  });
  // What the remote redirects: its card read, or its calls.
  let redirected: 'card' | 'call' = 'card';
  const server = http.createServer((req, res) => {
    req.resume();
    const to = `http://127.0.0.1:${(internal.address() as AddressInfo).port}/internal`;
    if (req.method === 'GET' && redirected === 'call') answerAgentCard(res, { name: 'moved', description: 'redirects its calls', url: `http://${req.headers.host}/rpc`, streaming: true });
    else res.writeHead(req.method === 'GET' ? 302 : 307, { location: to }).end();
  });
  before(() => new Promise<void>((resolve) => internal.listen(0, '127.0.0.1', resolve)));
  after(async () => {
    internal.closeAllConnections();
    await new Promise((resolve) => internal.close(resolve));
  });
  const stack = useStackOnRawAgent(server, { AGENT_ATTEMPTS: '1' });

  for (const what of ['card', 'call'] as const) {
    it(`fails the run whose ${what === 'card' ? 'card read' : 'message/stream call'} is redirected, following it nowhere`, async () => {
      redirected = what;
      reached.length = 0;
      const failed = await failedTaskOn(stack, `for the ${what}`);
      const reason = failed.status_message.parts[0].text as string;
      // Before: the redirect was followed (the message re-sent there, a POST) and the internal page quoted in the reason.
      assert.deepEqual(reached, []);
      assert.ok(!JSON.stringify(failed).includes('INTERNAL-SECRET-PAGE'), reason);
      assert.match(reason, new RegExp(`${what === 'card' ? 'card at .* could not be read: ' : ''}the remote agent answered HTTP ${what === 'card' ? '302 Found' : '307 Temporary Redirect'}: redirects are not followed \\(set AGENT_REMOTE_URL to the final address\\)`));
      assert.ok(!reason.includes('/internal'), 'the redirect\'s Location is not quoted');
    });
  }
});

describe('remote A2A agent that cannot stream and answers message/send only when its task ends', () => {
  let sends = 0;
  const server = rawA2ARemote({ name: 'slow', description: 'answers late', streaming: false }, ({ id, method }, res) => {
    if (method === 'message/send') sends++;
    const message = { kind: 'message', role: 'agent', messageId: 'slow-reply', parts: [{ kind: 'text', text: 'done, slowly' }] };
    // Twice AGENT_REMOTE_TIMEOUT_MS: blocking: false is only a hint to a remote.
    setTimeout(() => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id, result: { kind: 'task', id: 'remote-slow', contextId: 'remote-ctx', status: { state: 'completed', message } } }));
    }, 2000);
  });
  const stack = useStackOnRawAgent(server, { AGENT_REMOTE_TIMEOUT_MS: '1000' });

  it('waits for the answer past AGENT_REMOTE_TIMEOUT_MS, sending the message once', async () => {
    const done = await outcome(stack, 'take your time');
    assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
    assert.equal(done.status_message.parts[0].text, 'done, slowly');
    assert.equal(sends, 1);
  });
});

// A remote whose stream breaks (the connection closed mid-answer) after its first artifact, which
// fails the run's attempt: the retry finds the remote task as the remote left it meanwhile ('after':
// ended, asking for input, or still working and ending at the next read), with a history as `shown`
// says. A follow-up ends the remote task, unless it says "[break]": it then breaks as the first turn
// did ("[break] [unread]": before the remote takes it up); "[silent]" and "[reask]" break before any event.
describe('remote A2A agent whose stream breaks after an artifact: the retry', () => {
  // What the remote's history shows: nothing, its own messages (status messages among them), the
  // whole exchange, or the user's messages only (its status messages kept out of it).
  type Shown = 'no history' | 'agent messages only' | 'whole history' | 'user messages only';
  type After = 'completed' | 'input-required' | 'working';
  let shown: Shown = 'no history';
  let after: After = 'completed';
  // The message ids each remote task was sent, in order.
  const sent = new Map<string, string[]>();
  type RemoteTask = { id: string; contextId: string; status: any; artifacts: any[]; messages: any[]; reads: number; turn: number };
  const remoteTasks = new Map<string, RemoteTask>();
  let lostReads = 0;
  const agentSays = (taskId: string, text: string) => ({ kind: 'message', role: 'agent', messageId: randomUUID(), taskId, contextId: 'remote-ctx', parts: [{ kind: 'text', text }] });
  const artifact = (artifactId: string, text: string) => ({ artifactId, name: artifactId, parts: [{ kind: 'text', text }] });
  const snapshot = (t: RemoteTask) => ({
    kind: 'task', id: t.id, contextId: t.contextId, status: t.status, artifacts: [...t.artifacts],
    history: t.messages.filter((m) => ({ 'no history': false, 'agent messages only': m.role === 'agent', 'whole history': true, 'user messages only': m.role === 'user' })[shown]),
  });
  const firstSaid = (t: RemoteTask) => t.messages.find((m) => m.role === 'agent')?.parts[0].text;
  const setStatus = (t: RemoteTask, state: string, text?: string) => {
    const message = text ? agentSays(t.id, text) : undefined;
    if (message) t.messages.push(message);
    t.status = { state, timestamp: new Date().toISOString(), ...(message ? { message } : {}) };
  };
  // What the remote does after the break: ends the turn as `after` says, with a second artifact (x1 on the first turn).
  const endTurn = (t: RemoteTask, state: After) => {
    t.artifacts.push(artifact(`x${t.turn}`, 'written after the break'));
    setStatus(t, state, state === 'input-required' ? 'Which colour?' : 'done after the break');
  };
  const server = rawA2ARemote({ name: 'breaking', description: 'breaks its stream once', streaming: true }, ({ id, method, params, event }, res) => {
    if (method === 'tasks/get') {
      const t = remoteTasks.get(params.id);
      // A task the remote lost (it keeps them in memory, and restarted).
      if (!t) {
        lostReads++;
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, error: { code: -32001, message: 'Task gone (restarted)' } }));
        return;
      }
      const shows = snapshot(t);
      // Still working (or, "[unread]", asking) when the retry first reads it, done at the next read.
      if (++t.reads > 1 && (t.status.state === 'working' || (t.status.state === 'input-required' && sent.get(t.id)!.length > t.turn))) {
        t.turn = sent.get(t.id)!.length;
        endTurn(t, 'completed');
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, result: shows }));
      return;
    }
    if (method !== 'message/stream') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, error: { code: -32601, message: `no ${method} here` } }));
      return;
    }
    const message = params.message;
    const text = textOf(message);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    let t: RemoteTask | undefined = message.taskId && remoteTasks.get(message.taskId);
    if (t) {
      // A later send to the task: it is answered, and the task ends; one saying "[break]" breaks as the first did.
      sent.get(t.id)!.push(message.messageId);
      t.messages.push(message);
      // "[reask]": taken up at once, a new question asked with the old time stamp (a coarse clock),
      // then the break, before any event.
      if (text.includes('[reask]')) {
        const { timestamp } = t.status;
        setStatus(t, 'input-required', 'Which shade?');
        t.status.timestamp = timestamp;
        t.turn = sent.get(t.id)!.length;
        res.write('', () => res.socket?.destroy());
        return;
      }
      // "[silent]": the break comes before any event, the message recorded and not taken up.
      if (text.includes('[silent]')) {
        t.reads = 0;
        res.write('', () => res.socket?.destroy());
        return;
      }
      res.write(event(snapshot(t)));
      if (!text.includes('[break]')) {
        setStatus(t, 'completed', `answered: ${text}`);
        res.end(event({ kind: 'status-update', taskId: t.id, contextId: t.contextId, final: true, status: t.status }));
        return;
      }
      t.reads = 0;
      // "[unread]": the break comes before the remote takes the message up; it still shows its question at the next read.
      if (text.includes('[unread]')) {
        res.write('', () => res.socket?.destroy());
        return;
      }
      t.turn++;
    } else {
      t = { id: `remote-${randomUUID()}`, contextId: 'remote-ctx', status: { state: 'submitted' }, artifacts: [], messages: [message], reads: 0, turn: 1 };
      remoteTasks.set(t.id, t);
      sent.set(t.id, [message.messageId]);
      res.write(event(snapshot(t)));
    }
    const task = t;
    task.artifacts.push(artifact(`a${task.turn}`, 'written before the break'));
    setStatus(task, 'working', `thinking about ${text}`);
    res.write(event({ kind: 'status-update', taskId: task.id, contextId: task.contextId, final: false, status: task.status }));
    // The break, once what came before it is on its way; the remote goes on without the stream.
    res.write(event({ kind: 'artifact-update', taskId: task.id, contextId: task.contextId, artifact: task.artifacts.at(-1) }), () => {
      res.socket?.destroy();
      if (after !== 'working') endTurn(task, after);
    });
  });
  const stack = useStackOnRawAgent(server, { AGENT_BACKOFF_MS: '200' });

  // The task once its status is none of `passing`.
  const settled = (id: string, passing = ['submitted', 'working']) => waitFor(async () => {
    const r = await stack.client.get(`/api/task/v1/${id}`);
    return !passing.includes(r.body.task.status) && r.body;
  }, 'the task to settle', 30000);
  const agentTexts = async (id: string) =>
    (await stack.client.get(`/api/task/v1/${id}/message?page_size=100`)).body.items.filter((m: any) => m.role === 'agent').map((m: any) => m.parts[0].text);
  const artifactsOf = async (id: string) =>
    (await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id } })).body.result.artifacts.map((a: any) => [a.artifactId, a.parts.map((p: any) => p.text).join('')]);
  const storedArtifacts = async (id: string) =>
    (await stack.client.get(`/api/task/v1/${id}/timeline?order=asc&page_size=100`)).body.items.filter((i: any) => i.event_payload.type === 'artifact-update').length;

  for (const history of ['no history', 'agent messages only', 'whole history', 'user messages only'] as const) {
    for (const state of ['completed', 'input-required', 'working'] as const) {
      it(`(${history}, ${state} at the retry) follows the remote task the message went to, sending it once, and mirrors what the remote did after the break`, async () => {
        shown = history;
        after = state;
        const text = `break ${history} ${state}`;
        const created = await stack.client.post('/api/task/v1', { message: textMessage(text) });
        const id = created.body.task.id as string;
        const ended = await settled(id);
        const remoteTask = [...remoteTasks.values()].find((t) => firstSaid(t) === `thinking about ${text}`)!;
        // Before: sent again (the remote took it for its answer), or ended without what the remote did after the break.
        assert.equal(sent.get(remoteTask.id)!.length, 1, 'the message was sent once');
        assert.equal(ended.task.status, state === 'input-required' ? 'input-required' : 'completed', JSON.stringify(ended.status_message));
        const last = state === 'input-required' ? 'Which colour?' : 'done after the break';
        assert.equal(ended.status_message.parts[0].text, last);
        assert.deepEqual(await agentTexts(id), [`thinking about ${text}`, last]);
        assert.deepEqual(await artifactsOf(id), [['a1', 'written before the break'], ['x1', 'written after the break']]);
        assert.equal(await storedArtifacts(id), 2, 'each artifact stored once');
        if (state !== 'input-required') return;
        // The answer goes to the remote task, which has not been sent it before.
        assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('blue'))).status, 201);
        const done = await settled(id, ['input-required', 'working']);
        assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
        assert.equal(done.status_message.parts[0].text, 'answered: blue');
        assert.equal(sent.get(remoteTask.id)!.length, 2, 'the question was answered once');
      });
    }
    for (const state of ['completed', 'working'] as const) {
      it(`(${history}, ${state} at the retry) follows a later turn's remote task the same way, mirroring none of the earlier turn's messages again`, async () => {
        shown = history;
        after = 'input-required';
        const text = `ask then break ${history} ${state}`;
        const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
        assert.equal((await settled(id)).task.status, 'input-required');
        after = state;
        const answer = `green [break] ${state}`;
        assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage(answer))).status, 201);
        const done = await settled(id, ['input-required', 'working']);
        const remoteTask = [...remoteTasks.values()].find((t) => firstSaid(t) === `thinking about ${text}`)!;
        assert.equal(sent.get(remoteTask.id)!.length, 2, 'the answer was sent once');
        assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
        assert.equal(done.status_message.parts[0].text, 'done after the break');
        // Before (agent messages only): the first turn's messages, which that history holds, mirrored again.
        assert.deepEqual(await agentTexts(id), [`thinking about ${text}`, 'Which colour?', `thinking about ${answer}`, 'done after the break']);
        assert.deepEqual((await artifactsOf(id)).map(([artifactId]: string[]) => artifactId), ['a1', 'x1', 'a2', 'x2']);
        assert.equal(await storedArtifacts(id), 4, 'each artifact stored once');
      });
    }
  }

  for (const history of ['no history', 'agent messages only', 'whole history', 'user messages only'] as const) {
    it(`(${history}) follows a later turn whose stream broke before the remote took it up, past the question it answers, to its end`, async () => {
      shown = history;
      after = 'input-required';
      const text = `ask then break unread ${history}`;
      const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
      assert.equal((await settled(id)).task.status, 'input-required');
      const answer = 'green [break] [unread]';
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage(answer))).status, 201);
      const done = await settled(id, ['input-required', 'working']);
      const remoteTask = [...remoteTasks.values()].find((t) => firstSaid(t) === `thinking about ${text}`)!;
      assert.equal(sent.get(remoteTask.id)!.length, 2, 'the answer was sent once');
      assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
      assert.deepEqual(await agentTexts(id), [`thinking about ${text}`, 'Which colour?', 'done after the break']);
    });
  }

  it('fails a later turn at once, not retried, when the remote no longer has its task', async () => {
    shown = 'whole history';
    after = 'input-required';
    const text = 'ask then forget';
    const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
    assert.equal((await settled(id)).task.status, 'input-required');
    const remoteTask = [...remoteTasks.values()].find((t) => firstSaid(t) === `thinking about ${text}`)!;
    remoteTasks.delete(remoteTask.id);
    lostReads = 0;
    assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('green'))).status, 201);
    const failed = await settled(id, ['input-required', 'working']);
    assert.equal(failed.task.status, 'failed');
    // Before: read again by each of the run's attempts, then 'The agent failed after 3 attempt(s): Task not found'.
    assert.equal(failed.status_message.parts[0].text, 'The remote agent no longer has the task this one follows (not retried: it may have restarted, losing the tasks it kept in memory, or expired it): Task gone (restarted)');
    assert.equal(lostReads, 1, 'the remote task was looked for once');
    assert.equal(sent.get(remoteTask.id)!.length, 1, 'nothing was sent to a task the remote does not have');
  });

  // A new question the remote asked with the old one's time stamp is not the old one shown still:
  // taken for it, the retry followed the remote task for ever.
  for (const history of ['whole history', 'user messages only'] as const) {
    it(`(${history}) ends a later turn whose stream broke before any event on the new question the remote asked, stamped as the old one`, async () => {
      shown = history;
      after = 'input-required';
      const text = `ask then reask ${history}`;
      const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
      assert.equal((await settled(id)).task.status, 'input-required');
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('green [reask]'))).status, 201);
      await waitFor(async () => {
        const r = await stack.client.get(`/api/task/v1/${id}`);
        return r.body.task.status === 'input-required' && r.body.status_message?.parts[0].text === 'Which shade?';
      }, 'the task to wait for the answer to the new question', 30000);
      assert.deepEqual(await agentTexts(id), [`thinking about ${text}`, 'Which colour?', 'Which shade?']);
    });
  }

  // Before (user messages only): the retry took the question the remote still showed, its status
  // message not in a history that shows the answer, for a new one: the question stored twice, the task
  // waiting for input again.
  for (const history of ['whole history', 'user messages only'] as const) {
    it(`(${history}) follows a later turn whose stream broke before any event, the remote holding the answer it has not taken up, to its end`, async () => {
      shown = history;
      after = 'input-required';
      const text = `ask then break silent ${history}`;
      const id = (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
      assert.equal((await settled(id)).task.status, 'input-required');
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('green [silent]'))).status, 201);
      const done = await settled(id, ['input-required', 'working']);
      const remoteTask = [...remoteTasks.values()].find((t) => firstSaid(t) === `thinking about ${text}`)!;
      assert.equal(sent.get(remoteTask.id)!.length, 2, 'the answer was sent once');
      assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
      assert.deepEqual(await agentTexts(id), [`thinking about ${text}`, 'Which colour?', 'done after the break']);
    });
  }
});

describe('remote A2A agent whose stream fails before it names a task', () => {
  // The message ids the remote was sent, and the tasks it made for them (one per message/stream).
  const received: string[] = [];
  const server = rawA2ARemote({ name: 'string ids', description: 'echoes the request id as a string', streaming: true }, (call, res) => {
    if (call.method !== 'message/stream') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: call.id, error: { code: -32001, message: 'Task not found' } }));
      return;
    }
    received.push(call.params.message.messageId);
    const task = { kind: 'task', id: `remote-${received.length}`, contextId: 'remote-ctx', status: { state: 'working' } };
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const text: string = call.params.message.parts[0].text;
    // '[long]': a first event with no result and 2 MB of something else, which the SDK's error quotes
    // whole; '[nul]': the id echoed back with a NUL in it, which the SDK's error quotes; '[empty]': no event.
    if (text.includes('[long]')) res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', id: call.id, noise: 'n'.repeat(2_000_000) })}\n\n`);
    else if (text.includes('[nul]')) res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', id: `${call.id}\u0000`, result: task })}\n\n`);
    else if (text.includes('[empty]')) res.end();
    else res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', id: String(call.id), result: task })}\n\n`);
  });
  const stack = useStackOnRawAgent(server, { AGENT_ATTEMPTS: '3' });

  it('sends the message once and fails the task at once, saying why, when the remote answers its first event under an id of another type', async () => {
    const failed = await failedTaskOn(stack, 'string id');
    // Before: sent on each of the 3 attempts (3 remote tasks, none known, none canceled), failing with "Expected 3, got 3.".
    assert.equal(received.length, 1, `the remote was sent the message ${received.length} times`);
    assert.match(failed.status_message.parts[0].text, /^The remote agent's stream failed before it named a task for the message, which may have reached it \(not retried, so that the remote does not get it again\): the remote agent answered with JSON-RPC id \d+ of another JSON type than the request's \(a string for a number\)$/);
  });

  it('cuts what the failure quotes of a first event that is no answer (2 MB of it) to the bound of a failure reason', async () => {
    const before = received.length;
    const failed = await failedTaskOn(stack, 'a long one [long]');
    assert.equal(received.length, before + 1);
    const text = failed.status_message.parts[0].text as string;
    assert.match(text, /^The remote agent's stream failed before it named a task for the message, .*: SSE event JSON-RPC response is missing 'result' field\. Data: \{"jsonrpc":"2\.0","id":\d+,"noise":"nnnn/);
    assert.ok(text.length < 1200, `a status message of ${text.length} characters`);
    assert.ok(text.endsWith('…'));
  });

  it('sends the message once and fails the task saying why when the remote ends the stream it took without an event, or echoes an id holding a NUL', async () => {
    for (const [marker, why] of [['[empty]', /: the remote agent ended its stream before an event named a task$/], ['[nul]', /: JSON-RPC response ID mismatch/]] as const) {
      const before = received.length;
      const failed = await failedTaskOn(stack, `one more ${marker}`);
      // Before: '[empty]' was sent on each of the 3 attempts; '[nul]' failed as an unstorable status message, not saying this.
      assert.equal(received.length, before + 1, `${marker}: the remote was sent the message ${received.length - before} times`);
      assert.match(failed.status_message.parts[0].text, /^The remote agent's stream failed before it named a task for the message/);
      assert.match(failed.status_message.parts[0].text, why);
    }
  });
});

// A remote whose first task for a message cannot be recorded: Postgres refuses the row naming it (a
// trigger raising `errcode` stands for a database failure at that moment). The retry cannot know of
// that task.
function unrecordableFirstTask(name: string, errcode: string, env: Record<string, string>) {
  const UNRECORDABLE = `remote-unrecordable-${name}`;
  const sends: string[] = [];
  const canceled: string[] = [];
  const seen = { canceledBeforeRetry: [] as string[] };
  const server = rawA2ARemote({ name, description: 'its first task cannot be recorded', streaming: true }, ({ id, method, params, event }, res) => {
    if (method === 'tasks/cancel') {
      canceled.push(params.id);
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, result: { kind: 'task', id: params.id, contextId: 'remote-ctx', status: { state: 'canceled' } } }));
      return;
    }
    sends.push(params.message.messageId);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    // The first send's task works on (its stream open); the next one's completes.
    if (sends.length === 1) {
      res.write(event({ kind: 'task', id: UNRECORDABLE, contextId: 'remote-ctx', status: { state: 'working' } }));
      return;
    }
    const taskId = `remote-${sends.length}`;
    seen.canceledBeforeRetry = [...canceled];
    res.write(event({ kind: 'task', id: taskId, contextId: 'remote-ctx', status: { state: 'working' } }));
    res.end(event({ kind: 'status-update', taskId, contextId: 'remote-ctx', final: true,
      status: { state: 'completed', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text: 'done' }] } } }));
  });
  const stack = useStackOnRawAgent(server, env);

  before(async () => {
    await testDb().raw(`create function refuse_unrecordable() returns trigger language plpgsql as $$
      begin if new.remote_task_id = '${UNRECORDABLE}' then raise exception 'the database refused the row' using errcode = '${errcode}'; end if; return new; end $$`);
    await testDb().raw('create trigger refuse_unrecordable before insert or update on remote_agent_tasks for each row execute function refuse_unrecordable()');
  });
  after(async () => {
    await testDb().raw('drop trigger if exists refuse_unrecordable on remote_agent_tasks');
    await testDb().raw('drop function if exists refuse_unrecordable()');
  });

  // Sends a task, and checks it completed on the retry's remote task after the first was canceled.
  const completedOnRetry = async () => {
    const done = await endedTaskOn(stack, 'record me');
    const id = done.task.id as string;
    assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'done' }]);
    assert.equal(sends.length, 2);
    // Before: left working on the remote, with no row naming it for anything to cancel it by.
    assert.deepEqual(seen.canceledBeforeRetry, [UNRECORDABLE]);
    assert.deepEqual(canceled, [UNRECORDABLE]);
    assert.equal((await testDb()('remote_agent_tasks').where({ task_id: id }).first())?.remote_task_id, 'remote-2');
  };
  return { UNRECORDABLE, stack, completedOnRetry };
}

describe('remote A2A agent whose task could not be recorded', () => {
  const remote = unrecordableFirstTask('unrecordable', 'P0001', { AGENT_ATTEMPTS: '2', AGENT_BACKOFF_MS: '100' });

  it('cancels that remote task before the retry sends the message again, and the retry completes the task', async () => {
    await remote.completedOnRetry();
    // The failed attempt's reason says what failed without the database's text (which quotes our SQL).
    const retried = remote.stack.workers[0].logs.find((l) => l.includes('agent run failed; it will be retried'));
    assert.equal(JSON.parse(retried!).reason, `the remote task ${remote.UNRECORDABLE} could not be recorded: a database error (SQLSTATE P0001)`);
  });
});

describe('remote A2A agent whose task could not be recorded during a Postgres outage', () => {
  // 57P01 (admin_shutdown): what a Postgres restarting answers. One attempt: none may be used up.
  const remote = unrecordableFirstTask('unrecordable-outage', '57P01', { AGENT_ATTEMPTS: '1' });

  it('hands the run back to the queue as the runtime does for its own statements, not failing it', async () => {
    // Before: the task failed, 'The agent failed after 1 attempt(s): the remote task … could not be recorded'.
    await remote.completedOnRetry();
    const logs = remote.stack.workers[0].logs;
    const handedBack = logs.find((l) => l.includes('Postgres or Redis is unavailable: the run goes back to the queue'));
    assert.equal(JSON.parse(handedBack!).reason, `the remote task ${remote.UNRECORDABLE} could not be recorded: a database error (SQLSTATE 57P01)`);
    assert.equal(logs.filter((l) => l.includes('agent run failed')).length, 0);
  });
});

describe('remote A2A agent whose events change nothing the local task holds', () => {
  const server = rawA2ARemote({ name: 'noise', description: 'sends fresh status messages and empty artifacts without end', streaming: true }, (call, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const ids = { taskId: 'remote-noise', contextId: 'remote-ctx' };
    res.write(call.event({ kind: 'task', id: ids.taskId, contextId: ids.contextId, status: { state: 'working' } }));
    const text = JSON.stringify(call.params);
    // 600 in all, past the 500 a run notes; the stream then stays open, as the remote's task would.
    for (let i = 0; i < 300; i++) {
      if (text.includes('[chunks]')) {
        // One artifact of no parts, then chunks of no parts each adding a metadata key (and a message of no parts).
        res.write(call.event({ kind: 'artifact-update', ...ids, append: i > 0, artifact: { artifactId: 'empty', parts: [], metadata: { [`k${i}`]: i } } }));
        res.write(call.event({ kind: 'message', ...ids, role: 'agent', messageId: randomUUID(), parts: [] }));
        continue;
      }
      // Each with an id never seen: a status message of a state other than working, an artifact of no parts.
      res.write(call.event({ kind: 'status-update', ...ids, final: false, status: { state: 'submitted', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [] } } }));
      res.write(call.event({ kind: 'artifact-update', ...ids, artifact: { artifactId: randomUUID(), parts: [] } }));
    }
  });
  const stack = useStackOnRawAgent(server, { AGENT_ATTEMPTS: '1' });

  it('fails the run once it has noted more of them than it keeps, rather than following the remote task on', async () => {
    // Before: the task stayed working, the worker keeping every id.
    // Before, with [chunks]: the artifact's metadata grew in the worker for as long as the remote sent them.
    for (const text of ['noise', 'noise [chunks]']) {
      const failed = await failedTaskOn(stack, text);
      assert.equal(failed.status_message.parts[0].text, 'The agent failed after 1 attempt(s): the remote agent sent more than 500 messages, status messages or artifacts the local task does not hold (messages of no parts, status messages of another state than working, artifacts of no parts)', text);
    }
  });
});

// A remote whose follow-up stream opens by reporting the question again as a status-update that is
// not its last (`final: false`), stamped anew, with the question's message ("[same]") or none
// ("[none]"), then takes up the answer.
describe('remote A2A agent that reports the question again as it takes up the answer', () => {
  const remoteTask = 'remote-asking';
  const questionOf = (text: string) => ({ kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text }] });
  const question = questionOf('Which colour?');
  let asked = question;
  const asking = () => ({ state: 'input-required', timestamp: new Date().toISOString(), message: asked });
  // The status a read shows where it was stored (a re-asked question), else stamped anew.
  let standing: ReturnType<typeof asking> | undefined;
  const server = rawA2ARemote({ name: 'asking again', description: 'reports its question again', streaming: true }, ({ id, method, params, event }, res) => {
    if (method === 'tasks/get') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, result: { kind: 'task', id: remoteTask, contextId: 'remote-ctx', status: standing ?? asking() } }));
      return;
    }
    const text = params.message.parts[0].text as string;
    const ids = { taskId: remoteTask, contextId: 'remote-ctx' };
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    standing = undefined;
    if (!params.message.taskId) {
      asked = question;
      res.end(event({ kind: 'task', id: remoteTask, contextId: 'remote-ctx', status: asking() }));
      return;
    }
    // "[reask]": a new question, in an update that says it is not the last (as the Python SDK's
    // TaskUpdater.requires_input() does by default), and the stream ends.
    if (text.includes('[reask]')) {
      // "[none]" too: a replay without the question comes first.
      if (text.includes('[none]')) res.write(event({ kind: 'status-update', ...ids, final: false, status: { state: 'input-required', timestamp: new Date().toISOString() } }));
      asked = questionOf('Which shade?');
      standing = asking();
      res.end(event({ kind: 'status-update', ...ids, final: false, status: standing }));
      return;
    }
    const again = text.includes('[none]') ? { state: 'input-required', timestamp: new Date(Date.now() + 1000).toISOString() } : { ...asking(), timestamp: new Date(Date.now() + 1000).toISOString() };
    res.write(event({ kind: 'status-update', ...ids, final: false, status: again }));
    res.write(event({ kind: 'status-update', ...ids, final: false, status: { state: 'working' } }));
    res.end(event({ kind: 'status-update', ...ids, final: true, status: { state: 'completed', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text: `took ${text}` }] } } }));
  });
  const stack = useStackOnRawAgent(server, { AGENT_ATTEMPTS: '1' });

  // The task once it has settled with a status message other than `before` (the question it answers).
  const settled = (id: string, before?: string) => waitFor(async () => {
    const r = await stack.client.get(`/api/task/v1/${id}`);
    return !['submitted', 'working'].includes(r.body.task.status) && r.body.status_message?.id !== before && r.body;
  }, 'the task to settle', 20000);

  it('does not end the follow-up on that report: the task completes with the remote\'s answer', async () => {
    for (const answer of ['blue [same]', 'green [none]']) {
      const id = (await stack.client.post('/api/task/v1', { message: textMessage('paint it') })).body.task.id as string;
      const asked = await settled(id);
      assert.equal(asked.task.status, 'input-required');
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage(answer))).status, 201);
      // Before: the task ended input-required again ('Task input-required'), the answer dropped.
      const done = await settled(id, asked.status_message.id);
      assert.equal(done.task.status, 'completed', `${answer}: ${JSON.stringify(done.status_message)}`);
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `took ${answer}` }]);
    }
  });

  it('ends the follow-up on a new question in such a report, after a replay without the question too: the task waits for its answer', async () => {
    for (const answer of ['red [reask]', 'red [none] [reask]']) {
      const id = (await stack.client.post('/api/task/v1', { message: textMessage('paint it') })).body.task.id as string;
      const first = await settled(id);
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage(answer))).status, 201);
      // Before: taken for the question reported again, the new one was followed by polling for ever,
      // the task working, and the client's answer to it never sent.
      const again = await settled(id, first.status_message.id);
      assert.equal(again.task.status, 'input-required', answer);
      assert.deepEqual(again.status_message.parts, [{ type: 'text-part', text: 'Which shade?' }]);
      assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('crimson'))).status, 201);
      const done = await settled(id, again.status_message.id);
      assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
      assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'took crimson' }]);
    }
  });
});

// A remote whose card named an endpoint that does not answer (404), then, mended, one that does.
describe('remote A2A agent whose card changes', () => {
  let endpoint = '/gone';
  let cardReads = 0;
  let cardGone = false;
  const server = http.createServer((req, res) => {
    if (req.method === 'GET') {
      cardReads += 1;
      if (cardGone) return void res.writeHead(404, { 'content-type': 'text/plain' }).end('no card here');
      answerAgentCard(res, { name: 'moving', description: 'moves its endpoint', streaming: true, url: `http://${req.headers.host}${endpoint}` });
      return;
    }
    let body = '';
    req.on('data', (b) => { body += b; });
    req.on('end', () => {
      if (req.url !== '/rpc') return void res.writeHead(404, { 'content-type': 'text/plain' }).end('no such endpoint');
      if (body.includes('[fail]')) return void res.writeHead(500, { 'content-type': 'text/plain' }).end('a fault of the remote');
      const { id } = JSON.parse(body) as { id: string | number };
      const event = (result: unknown) => `data: ${JSON.stringify({ jsonrpc: '2.0', id, result })}\n\n`;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(event({ kind: 'task', id: 'remote-moved', contextId: 'remote-ctx', status: { state: 'working' } }));
      res.end(event({ kind: 'status-update', taskId: 'remote-moved', contextId: 'remote-ctx', final: true,
        status: { state: 'completed', message: { kind: 'message', role: 'agent', messageId: randomUUID(), parts: [{ kind: 'text', text: 'reached' }] } } }));
    });
  });
  const stack = useStackOnRawAgent(server, { AGENT_ATTEMPTS: '1' });

  it('reads the card again after a run failed, so the next run reaches the endpoint the card names now', async () => {
    const failed = await failedTaskOn(stack, 'to the old endpoint');
    assert.match(failed.status_message.parts[0].text, /404/);
    const reads = cardReads;
    endpoint = '/rpc';
    // Before: every later run failed alike, the card read once per worker process.
    const done = await endedTaskOn(stack, 'to the new one');
    assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'reached' }]);
    assert.equal(cardReads, reads + 1);
  });

  it('keeps the card it has when the read after a failed run fails: later runs still reach the endpoint it names', async () => {
    endpoint = '/rpc';
    const failed = await failedTaskOn(stack, 'a fault [fail]');
    assert.match(failed.status_message.parts[0].text, /500/);
    cardGone = true;
    try {
      const reads = cardReads;
      // Before: the card was dropped after the failed run, and every run failed while it could not be read.
      const done = await endedTaskOn(stack, 'with the card gone');
      assert.equal(done.task.status, 'completed', JSON.stringify(done.status_message));
      assert.equal(cardReads, reads + 1, 'the card was read again, and its read failed');
    } finally {
      cardGone = false;
    }
  });
});

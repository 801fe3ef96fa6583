// A2A streaming over raw SSE: message/stream and tasks/resubscribe deliver the task snapshot,
// then every timeline event in order, `final: true` on the last, and close; several subscribers
// all get every event; a closed stream does not cancel the task.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import * as v03 from '@a2a-js/sdk/client';
import { freePort, startRedis, type LocalService } from '../scripts/local-services.ts';
import { behindServiceProxy } from './helpers/black-hole-proxy.ts';
import { ADMIN_KEY, apiEndClosed, Client, denseMessage, requestLogsThrough, resetDb, startApi, startStack, testDb, textMessage, useStack, waitFor, type Stack } from './helpers/stack.ts';

const A2A = '/api/a2a/v1';
const userMessage = (text: string, extra: Record<string, unknown> = {}) => ({ kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }], ...extra });

interface Sse { status: number; contentType: string; events: any[]; ended: boolean }

// Reads an SSE response to its end (or until `stopAfter` events, then aborts the request).
async function sse(url: string, method: string, params: unknown, opts: { id?: unknown; stopAfter?: number } = {}): Promise<Sse> {
  const ac = new AbortController();
  const res = await fetch(url + A2A, {
    method: 'POST', signal: ac.signal,
    headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: opts.id ?? 'stream-1', method, params }),
  });
  return readSse(res, ac, opts.stopAfter);
}

async function readSse(res: globalThis.Response, ac: AbortController, stopAfter?: number): Promise<Sse> {
  const out: Sse = { status: res.status, contentType: res.headers.get('content-type') ?? '', events: [], ended: false };
  if (!out.contentType.startsWith('text/event-stream')) {
    out.events.push(await res.json());
    out.ended = true;
    return out;
  }
  const decoder = new TextDecoder();
  let buf = '';
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buf += decoder.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (data) out.events.push(JSON.parse(data));
        if (stopAfter && out.events.length >= stopAfter) {
          ac.abort();
          return out;
        }
      }
    }
    out.ended = true;
  } catch (err) {
    if ((err as Error).name !== 'AbortError') throw err;
  }
  return out;
}

describe('A2A streaming (SSE)', () => {
  // A blocking send waits far longer than any test here: one that ends did so for its task, not the wait.
  // A body may hold a message heavier than one read of the timeline (8 MiB as parsed).
  const stack = useStack({ A2A_BLOCKING_TIMEOUT_MS: '60000', BODY_LIMIT_BYTES: String(9 * 2 ** 20) });
  const rpc = (method: string, params: unknown) => stack.client.post(A2A, { jsonrpc: '2.0', id: 1, method, params });

  it('message/stream: snapshot, status, message and artifact events in order, final last, then closed', async () => {
    const s = await sse(stack.api.url, 'message/stream', { message: userMessage('[sleep 200] [artifact] streamed') }, { id: 99 });
    assert.equal(s.status, 200);
    assert.match(s.contentType, /^text\/event-stream/);
    assert.ok(s.ended, 'the server closed the stream');
    for (const e of s.events) {
      assert.equal(e.jsonrpc, '2.0');
      assert.equal(e.id, 99);
    }
    const results = s.events.map((e) => e.result);
    const [snapshot, ...rest] = results;
    assert.equal(snapshot.kind, 'task');
    assert.equal(snapshot.status.state, 'submitted');
    assert.deepEqual(snapshot.history.map((m: any) => m.role), ['user']);
    for (const e of rest) {
      assert.equal(e.taskId, snapshot.id);
      assert.equal(e.contextId, snapshot.contextId);
    }
    const shape = rest.map((e: any) => (e.kind === 'status-update' ? `status:${e.status.state}` : e.kind));
    assert.deepEqual(shape, ['status:working', 'status:working', 'artifact-update', 'status:completed']);
    assert.equal(rest[1].status.message.parts[0].text, 'Working for 200 ms');
    assert.deepEqual(rest[2].artifact.parts, [{ kind: 'text', text: '[sleep 200] [artifact] streamed' }]);
    const last = rest.at(-1);
    assert.equal(last.final, true);
    assert.deepEqual(last.status.message.parts, [{ kind: 'text', text: 'Echo: [sleep 200] [artifact] streamed' }]);
    assert.ok(rest.slice(0, -1).every((e: any) => e.kind !== 'status-update' || e.final === false));
  });

  it('ends with final on input-required, and a follow-up stream continues the same task', async () => {
    const first = await sse(stack.api.url, 'message/stream', { message: userMessage('[input] ask me') });
    const last = first.events.at(-1).result;
    assert.equal(last.status.state, 'input-required');
    assert.equal(last.final, true);
    assert.ok(first.ended);
    const taskId = first.events[0].result.id;
    const second = await sse(stack.api.url, 'message/stream', { message: userMessage('answer', { taskId }) });
    assert.equal(second.events[0].result.id, taskId);
    assert.equal(second.events[0].result.status.state, 'input-required');
    const states = second.events.slice(1).filter((e) => e.result.kind === 'status-update').map((e) => e.result.status.state);
    assert.deepEqual(states, ['working', 'completed']);
    assert.ok(second.ended);
  });

  it("resubscribe to a task waiting for input that a message has answered follows the answer's run (no final input-required)", async () => {
    const first = await rpc('message/send', { message: userMessage('[input] ask') });
    const taskId = first.body.result.id;
    assert.equal(first.body.result.status.state, 'input-required');
    // The worker stopped: the answer is stored, its run cannot begin.
    stack.workers[0].child.kill('SIGSTOP');
    let res: globalThis.Response;
    const ac = new AbortController();
    try {
      const answer = await rpc('message/send', { message: userMessage('the answer', { taskId }), configuration: { blocking: false } });
      assert.equal(answer.body.result.status.state, 'input-required', answer.text);
      // The stream has read the task once its head arrives.
      res = await fetch(stack.api.url + A2A, {
        method: 'POST', signal: ac.signal,
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', accept: 'text/event-stream' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 'r', method: 'tasks/resubscribe', params: { id: taskId } }),
      });
    } finally {
      stack.workers[0].child.kill('SIGCONT');
    }
    const s = await readSse(res, ac);
    assert.ok(s.ended);
    assert.equal(s.events[0].result.status.state, 'input-required');
    const updates = s.events.slice(1).filter((e) => e.result.kind === 'status-update').map((e) => [e.result.status.state, e.result.final]);
    assert.deepEqual(updates, [['working', false], ['completed', true]]);
  });

  it('a retried message/stream stores nothing and streams the task from now: an ended task as resubscribe does, snapshot then final', async () => {
    const first = await sse(stack.api.url, 'message/stream', { message: userMessage('[input] retry me') });
    const taskId = first.events[0].result.id;
    const answer = userMessage('answered', { taskId });
    const answered = await sse(stack.api.url, 'message/stream', { message: answer });
    assert.equal(answered.events.at(-1).result.status.state, 'completed');
    const users = async () => Number((await testDb()('messages').where({ task_id: taskId, role: 'user' }).count({ n: '*' }))[0].n);
    assert.equal(await users(), 2);

    const retried = await sse(stack.api.url, 'message/stream', { message: answer });
    assert.ok(retried.ended);
    const [snapshot, ...rest] = retried.events.map((e) => e.result);
    assert.equal(snapshot.kind, 'task');
    assert.equal(snapshot.status.state, 'completed');
    assert.equal(rest.length, 1);
    assert.deepEqual(rest[0], { kind: 'status-update', taskId, contextId: snapshot.contextId, final: true, status: snapshot.status });
    const resubscribed = await sse(stack.api.url, 'tasks/resubscribe', { id: taskId });
    assert.deepEqual(resubscribed.events.at(-1).result, rest[0]);
    assert.equal(await users(), 2);

    // A retry while the answer is still to run follows it to its end.
    const next = await sse(stack.api.url, 'message/stream', { message: userMessage('[input] retry again') });
    const nextId = next.events[0].result.id;
    const again = userMessage('again', { taskId: nextId });
    await rpc('message/send', { message: again, configuration: { blocking: false } });
    const followed = await sse(stack.api.url, 'message/stream', { message: again });
    assert.ok(followed.ended);
    const last = followed.events.at(-1).result;
    assert.equal(last.status.state, 'completed');
    assert.equal(last.final, true);
    assert.equal(last.status.message.parts[0].text, 'Echo (turn 2): again');
    assert.equal(Number((await testDb()('messages').where({ task_id: nextId, role: 'user' }).count({ n: '*' }))[0].n), 2);
  });

  it('a follow-up stream\'s snapshot is the task as the message found it, even when the run starts at once', async () => {
    // Many at a time, so that runs start while their streams are being opened.
    const ids = await Promise.all(Array.from({ length: 12 }, async (_, i) => {
      const first = await sse(stack.api.url, 'message/stream', { message: userMessage(`[input] ask ${i}`) });
      return first.events[0].result.id as string;
    }));
    const seconds = await Promise.all(ids.map((taskId, i) => sse(stack.api.url, 'message/stream', { message: userMessage(`answer ${i}`, { taskId }), configuration: { historyLength: 2 } })));
    seconds.forEach((second, i) => {
      const [snapshot, ...rest] = second.events.map((e) => e.result);
      assert.equal(snapshot.id, ids[i]);
      assert.equal(snapshot.status.state, 'input-required', `task ${i}: snapshot ${snapshot.status.state}`);
      assert.deepEqual(snapshot.history.map((m: any) => m.parts[0].text), ['I need more input: what should I echo next?', `answer ${i}`]);
      assert.deepEqual(rest.filter((e) => e.kind === 'status-update').map((e) => e.status.state), ['working', 'completed']);
    });
  });

  it('several subscribers (resubscribe) get every event; closing one never cancels the task', async () => {
    const task = (await rpc('message/send', { message: userMessage('[sleep 1500] [artifact] shared'), configuration: { blocking: false } })).body.result;
    const [a, b, dropped] = await Promise.all([
      sse(stack.api.url, 'tasks/resubscribe', { id: task.id }),
      sse(stack.api.url, 'tasks/resubscribe', { id: task.id }),
      sse(stack.api.url, 'tasks/resubscribe', { id: task.id }, { stopAfter: 1 }),
    ]);
    assert.equal(dropped.events.length, 1);
    for (const s of [a, b]) {
      assert.ok(s.ended);
      assert.equal(s.events[0].result.kind, 'task');
      const last = s.events.at(-1).result;
      assert.equal(last.kind, 'status-update');
      assert.equal(last.status.state, 'completed');
      assert.equal(last.final, true);
      assert.ok(s.events.some((e) => e.result.kind === 'artifact-update'));
    }
    // Both saw the same events after their snapshots, from where each snapshot stood.
    const tail = (s: Sse) => s.events.slice(1).map((e) => JSON.stringify(e.result));
    const shorter = tail(a).length <= tail(b).length ? tail(a) : tail(b);
    const longer = shorter === tail(a) ? tail(b) : tail(a);
    assert.deepEqual(longer.slice(longer.length - shorter.length), shorter);
    const got = await rpc('tasks/get', { id: task.id });
    assert.equal(got.body.result.status.state, 'completed');
  });

  it('a client that drops a message/stream leaves the task running to completion', async () => {
    const s = await sse(stack.api.url, 'message/stream', { message: userMessage('[sleep 800] keep going') }, { stopAfter: 1 });
    const id = s.events[0].result.id;
    await waitFor(async () => (await rpc('tasks/get', { id })).body.result.status.state === 'completed', 'task completes without its stream');
  });

  it('follows messages heavier together than one read of the timeline (8 MiB as parsed): each arrives once, in order, then the final status', async () => {
    const id = await quietTask(stack.client);
    const stream = await openStream(stack.api.url, id);
    assert.equal(stream.res.status, 200);
    // 3.5 MB each once parsed: a read of the timeline takes three at most.
    for (let n = 1; n <= 5; n++) assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, denseMessage(n, 'agent'))).status, 201);
    assert.equal((await rpc('tasks/cancel', { id })).body.result.status.state, 'canceled');
    const s = await stream.read();
    assert.ok(s.ended);
    const [snapshot, ...events] = s.events.map((e) => e.result);
    assert.equal(snapshot.kind, 'task');
    assert.deepEqual(events.map((e) => e.kind), ['message', 'message', 'message', 'message', 'message', 'status-update']);
    assert.deepEqual(events.slice(0, 5).map((e) => e.parts[0].data.n), [1, 2, 3, 4, 5]);
    assert.equal(events[5].status.state, 'canceled');
    assert.equal(events[5].final, true);
  });

  it('sends a status message once, inside its status-update, also when a read of the timeline ends between the two', async () => {
    const id = await quietTask(stack.client);
    const stream = await openStream(stack.api.url, id);
    assert.equal(stream.res.status, 200);
    assert.equal((await stack.client.post(`/api/task/v1/${id}/message`, textMessage('before', 'agent'))).status, 201);
    // Over 8 MiB as parsed: the read that takes it ends with it, its status-update starts the next.
    const text = 'x'.repeat(8.25 * 2 ** 20);
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'working', message: textMessage(text, 'agent') })).status, 200);
    assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'input-required' })).status, 200);
    const s = await stream.read();
    assert.ok(s.ended);
    const [snapshot, ...events] = s.events.map((e) => e.result);
    assert.equal(snapshot.kind, 'task');
    assert.deepEqual(events.map((e) => (e.kind === 'status-update' ? `status:${e.status.state}` : e.kind)), ['message', 'status:working', 'status:input-required']);
    assert.equal(events[0].parts[0].text, 'before');
    assert.equal(events[1].status.message.parts[0].text.length, text.length);
    assert.equal(events[2].final, true);
  });

  it('resubscribe to a finished task: snapshot then one final status-update, closed', async () => {
    const done = (await rpc('message/send', { message: userMessage('finish first') })).body.result;
    assert.equal(done.status.state, 'completed');
    const s = await sse(stack.api.url, 'tasks/resubscribe', { id: done.id });
    assert.ok(s.ended);
    assert.deepEqual(s.events.map((e) => e.result.kind), ['task', 'status-update']);
    assert.equal(s.events[1].result.final, true);
    assert.equal(s.events[1].result.status.state, 'completed');
  });

  it('a stream on one API process sees a cancel made through another, and ends on it', async () => {
    const other = await startApi(stack.env);
    try {
      const task = (await rpc('message/send', { message: userMessage('[sleep 60000] cancel me elsewhere'), configuration: { blocking: false } })).body.result;
      const streamed = sse(stack.api.url, 'tasks/resubscribe', { id: task.id });
      await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.state === 'working', 'the task to start');
      const canceled = await new Client(other.url).post(A2A, { jsonrpc: '2.0', id: 2, method: 'tasks/cancel', params: { id: task.id } });
      assert.equal(canceled.body.result.status.state, 'canceled');
      const s = await streamed;
      assert.ok(s.ended);
      const last = s.events.at(-1).result;
      assert.deepEqual([last.kind, last.status.state, last.final], ['status-update', 'canceled', true]);
    } finally {
      await other.stop();
    }
  });

  it('a stream, or a blocking send, whose task is deleted meanwhile ends on a -32001 error instead of waiting for ever', async () => {
    const task = (await rpc('message/send', { message: userMessage('[sleep 60000] deleted while followed'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.state === 'working', 'the task to start');
    const streamed = sse(stack.api.url, 'tasks/resubscribe', { id: task.id }, { id: 'gone' });
    const blocking = stack.client.post(A2A, { jsonrpc: '2.0', id: 'b', method: 'message/send', params: { message: userMessage('[sleep 60000] deleted too') } });
    const other = await waitFor(async () => (await testDb()('tasks as t').join('messages as m', 'm.task_id', 't.id').where('t.status', 'working')
      .whereRaw(`m.parts->0->>'text' = ?`, ['[sleep 60000] deleted too']).first<{ id: string }>('t.id')) ?? false, 'the blocking send\'s task to start');
    const at = Date.now();
    // As an operator deletes a task: its messages and timeline go with it (ON DELETE CASCADE).
    await testDb()('tasks').whereIn('id', [task.id, other.id]).delete();
    const [s, b] = await Promise.all([streamed, blocking]);
    assert.ok(Date.now() - at < 18_000, `ended ${Date.now() - at} ms after the delete`);
    assert.ok(s.ended, 'the server closed the stream');
    assert.deepEqual([s.events[0].result.kind, s.events.at(-1).id, s.events.at(-1).error?.code], ['task', 'gone', -32001]);
    assert.deepEqual([b.body.id, b.body.error?.code], ['b', -32001]);
  });

  it("a stream refused for its task or its params is one SSE error event, then closed (as the SDK's server answers)", async () => {
    const s = await sse(stack.api.url, 'tasks/resubscribe', { id: randomUUID() }, { id: 'r' });
    assert.match(s.contentType, /^text\/event-stream/);
    assert.equal(s.events.length, 1);
    assert.deepEqual([s.events[0].id, s.events[0].error.code], ['r', -32001]);
    assert.equal(s.ended, true);
    const unknown = await sse(stack.api.url, 'message/stream', { message: userMessage('to nowhere', { taskId: randomUUID() }) }, { id: 'u' });
    assert.match(unknown.contentType, /^text\/event-stream/);
    assert.deepEqual([unknown.events.length, unknown.events[0].id, unknown.events[0].error.code], [1, 'u', -32001]);
    const tasksBefore = await testDb()('tasks').count({ n: '*' });
    const bad = await sse(stack.api.url, 'message/stream', { message: { kind: 'message', role: 'user', parts: [{ kind: 'text', text: 'no id' }] } }, { id: 'b' });
    assert.match(bad.contentType, /^text\/event-stream/);
    assert.deepEqual([bad.events.length, bad.events[0].id, bad.events[0].error.code, bad.events[0].error.message], [1, 'b', -32602, 'Invalid params: params.message.messageId is required']);
    assert.equal(bad.ended, true);
    const noId = await sse(stack.api.url, 'tasks/resubscribe', { historyLength: 1 }, { id: 7 });
    assert.match(noId.contentType, /^text\/event-stream/);
    assert.deepEqual([noId.events.length, noId.events[0].id, noId.events[0].error.code, noId.events[0].error.message], [1, 7, -32602, 'Invalid params: params.id is required']);
    assert.deepEqual(await testDb()('tasks').count({ n: '*' }), tasksBefore, 'a refused stream creates no task');
    const logged = await requestLogsThrough(stack, await stack.client.get('/api/openapi.json'), { all: true });
    assert.ok(!logged.some((l) => l.includes('a2a stream failed')), 'refusals are not logged as failures');
  });
});

// A task no agent runs (its first message is an agent's): it stays submitted, so its streams stay open.
const quietTask = async (client: Client) => (await client.post('/api/task/v1', { message: { role: 'agent', parts: [{ type: 'text-part', text: 'stays submitted' }] } })).body.task.id as string;

// A resubscribe stream that stays open (its task never ends), until `close`; `read` reads it to its end.
async function openStream(apiUrl: string, taskId: string, key = ADMIN_KEY) {
  const ac = new AbortController();
  const res = await fetch(apiUrl + A2A, {
    method: 'POST', signal: ac.signal,
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/resubscribe', params: { id: taskId } }),
  });
  return { res, close: () => ac.abort(), read: () => readSse(res, ac) };
}

describe('A2A streams per API key (A2A_STREAMS_PER_KEY)', () => {
  // Long enough that renewals every third of it keep up on a loaded machine, and that a dead
  // process's places are still held when the next request comes.
  const LEASE_MS = 6000;
  const stack = useStack({ A2A_STREAMS_PER_KEY: '2', A2A_STREAM_LEASE_MS: String(LEASE_MS) }, { workers: 0 });

  const open = (taskId: string, key = ADMIN_KEY, apiUrl = stack.api.url) => openStream(apiUrl, taskId, key);
  // A stream opened once the key has a place again (each refused try closed).
  const openOnceFree = (taskId: string, what: string, apiUrl = stack.api.url, timeoutMs?: number, intervalMs?: number) => waitFor(async () => {
    const s = await open(taskId, ADMIN_KEY, apiUrl);
    if (s.res.status === 200) return s;
    s.close();
    return undefined;
  }, what, timeoutMs, intervalMs);

  it('refuses a key past its open streams with 429 and Retry-After, before the call does anything; a closed stream frees its place', async () => {
    const task = await quietTask(stack.client);
    const first = await open(task);
    const second = await open(task);
    for (const s of [first, second]) assert.match(s.res.headers.get('content-type') ?? '', /^text\/event-stream/);

    const tasksBefore = await testDb()('tasks').count({ n: '*' });
    const refused = await stack.client.post(A2A, { jsonrpc: '2.0', id: 2, method: 'message/stream', params: { message: userMessage('one too many') } });
    assert.equal(refused.status, 429, refused.text);
    assert.equal(refused.body.data.code, 'rate_limited');
    assert.match(refused.body.message, /holds 2 A2A streams open, the most A2A_STREAMS_PER_KEY allows/);
    assert.deepEqual(refused.body.data, { code: 'rate_limited', open: 2, limit: 2, retry_after_ms: 5000 });
    assert.equal(refused.headers.get('retry-after'), '5');
    assert.deepEqual(await testDb()('tasks').count({ n: '*' }), tasksBefore, 'the refused message/stream created no task');
    // Calls that are not streams, and other keys, are not counted.
    assert.equal((await stack.client.post(A2A, { jsonrpc: '2.0', id: 3, method: 'tasks/get', params: { id: task } })).status, 200);
    // Nor is a stream method whose envelope is refused: its answer is the -32600, not a 429.
    for (const envelope of [{ jsonrpc: '2.0' }, { jsonrpc: '1.0', id: 4 }, { jsonrpc: '2.0', id: { not: 'an id' } }]) {
      const r = await stack.client.post(A2A, { ...envelope, method: 'message/stream', params: { message: userMessage('bad envelope') } });
      assert.deepEqual([r.status, r.body.error?.code], [200, -32600], r.text);
    }
    const other = (await stack.client.post('/api/auth/v1/api-key', { name: 'other streamer', scopes: ['a2a'] })).body.key;
    const third = await open(task, other);
    assert.equal(third.res.status, 200);

    first.close();
    const again = await openOnceFree(task, 'a place to free up');
    for (const s of [second, third, again]) s.close();
  });

  it("counts a key's streams on every API process together, for as long as they are open; one closed anywhere frees a place", async () => {
    const task = await quietTask(stack.client);
    const second = await startApi(stack.env);
    try {
      const here = await open(task);
      const there = await open(task, ADMIN_KEY, second.url);
      for (const s of [here, there]) assert.equal(s.res.status, 200);
      // Each process holds one of the key's two places: both refuse a third, here and there, and
      // still do two leases later (the processes renew them).
      for (const wait of [0, 2 * LEASE_MS]) {
        await new Promise((resolve) => setTimeout(resolve, wait));
        for (const url of [stack.api.url, second.url]) {
          const refused = await open(task, ADMIN_KEY, url);
          assert.equal(refused.res.status, 429, `after ${wait} ms`);
          assert.deepEqual(((await refused.res.json()) as { data: unknown }).data, { code: 'rate_limited', open: 2, limit: 2, retry_after_ms: 5000 });
        }
      }
      here.close();
      const again = await openOnceFree(task, 'the place closed on the first process to free up on the second', second.url);
      for (const s of [there, again]) s.close();
    } finally {
      await second.stop();
    }
  });

  it('gives back the places of an API process that dies with streams open once their lease ends', async () => {
    const task = await quietTask(stack.client);
    const doomed = await startApi(stack.env);
    const streams = [await open(task, ADMIN_KEY, doomed.url), await open(task, ADMIN_KEY, doomed.url)];
    for (const s of streams) assert.equal(s.res.status, 200);
    await doomed.kill('SIGKILL');
    for (const s of streams) s.close();
    const died = Date.now();
    // Its places outlive it, until their lease ends.
    const refused = await open(task);
    assert.equal(refused.res.status, 429);
    refused.close();
    const back = await openOnceFree(task, "the dead process's places to come back", stack.api.url, 4 * LEASE_MS, 100);
    assert.ok(Date.now() - died >= LEASE_MS / 3, 'a place is kept until its lease ends, not dropped when a stream is refused');
    back.close();
  });

  it('gives back the places of clients that hang up while their stream is being set up', async () => {
    const task = await quietTask(stack.client);
    const { port } = new URL(stack.api.url);
    // The whole request, then the connection closed a moment later: while the API reads the body or
    // writes the task, before the first event.
    const hangUp = (method: string, params: unknown, afterMs: number) => new Promise<void>((resolve) => {
      const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method, params });
      const socket = net.connect(Number(port), '127.0.0.1', () => {
        socket.write(`POST ${A2A} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
        setTimeout(() => { socket.destroy(); resolve(); }, afterMs);
      });
      socket.on('error', () => resolve());
    });
    for (const afterMs of [0, 1, 1, 2, 2, 3, 5, 8]) {
      await Promise.all([hangUp('message/stream', { message: userMessage('gone at once') }, afterMs), hangUp('tasks/resubscribe', { id: task }, afterMs)]);
    }
    const streams = await waitFor(async () => {
      const both = [await open(task), await open(task)];
      if (both.every((s) => s.res.status === 200)) return both;
      for (const s of both) s.close();
      return undefined;
    }, 'the places of the hung-up streams to come back', 5000, 200);
    for (const s of streams) s.close();
  });

  it("ends a revoked key's open streams, on every API process, and no other key's, telling their clients why", async () => {
    const task = await quietTask(stack.client);
    const created = (await stack.client.post('/api/auth/v1/api-key', { name: 'to be revoked', scopes: ['a2a'] })).body;
    const kept = (await stack.client.post('/api/auth/v1/api-key', { name: 'kept', scopes: ['a2a'] })).body.key;
    // The revoked key's streams are on a second API process: it learns of the revocation from Postgres.
    const second = await startApi(stack.env);
    try {
      const doomed = await open(task, created.key, second.url);
      // The same key's stream as the SDK client reads it, open (its snapshot read) before the revocation.
      const withKey: typeof fetch = (input, init) => fetch(input, { ...init, headers: { ...init?.headers as Record<string, string>, authorization: `Bearer ${created.key}` } });
      const sdkStream = new v03.JsonRpcTransport({ endpoint: second.url + A2A, fetchImpl: withKey }).resubscribeTask({ id: task });
      assert.equal(((await sdkStream.next()).value as { kind: string }).kind, 'task');
      const stays = await open(task, kept);
      const doomedEnd = doomed.read();
      let staysEnded = false;
      void stays.read().then(() => { staysEnded = true; }, () => undefined);
      assert.equal((await stack.client.delete(`/api/auth/v1/api-key/${created.id}`)).status, 200);
      const ended = await Promise.race([doomedEnd, new Promise<string>((resolve) => setTimeout(() => resolve('still open'), 10_000))]);
      assert.notEqual(ended, 'still open');
      // Not a bare end, which a client takes for a dropped connection and resubscribes after: the
      // snapshot, then the error the key's next call would get.
      const { events } = ended as Sse;
      assert.equal(events[0].result.kind, 'task');
      assert.deepEqual(events.slice(1), [{ jsonrpc: '2.0', id: 1, error: { code: -32603, message: 'Unknown or revoked API key', data: { code: 'unauthenticated' } } }]);
      await assert.rejects(sdkStream.next(), /SSE event contained an error: Unknown or revoked API key \(Code: -32603\)/);
      assert.equal(staysEnded, false, "the other key's stream stays open");
      stays.close();
    } finally {
      await second.stop();
    }
  });
});

describe('clients that stop reading (API_WRITE_STALL_MS)', function () {
  this.timeout(60000);
  const stack = useStack({ API_WRITE_STALL_MS: '1000', A2A_STREAMS_PER_KEY: '1' }, { workers: 0 });

  // Sends an A2A call on a raw socket and reads none of the answer until `readRest`, which resolves
  // with the bytes that arrived by the time the API closed the connection (or 'still open').
  const unread = (method: string, params: unknown) => {
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method, params });
    const socket = net.connect(Number(new URL(stack.api.url).port), '127.0.0.1', () => {
      socket.write(`POST ${A2A} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    socket.pause();
    socket.on('error', () => undefined);
    const readRest = () => {
      let bytes = 0;
      socket.on('data', (b: Buffer) => { bytes += b.length; });
      const ended = new Promise<number>((resolve) => socket.once('end', () => resolve(bytes)));
      socket.resume();
      return Promise.race([ended, new Promise<string>((resolve) => setTimeout(() => { socket.destroy(); resolve('still open'); }, 20_000))]);
    };
    return { socket, readRest };
  };

  it('cuts an answer the client takes nothing of (a stream or tasks/get of a large task), freeing its stream place; an idle stream stays', async () => {
    // 15 MB of history: more than the loopback socket buffers hold, so the answer cannot all be sent.
    const task = await quietTask(stack.client);
    const big = 'y'.repeat(1_000_000);
    for (let i = 0; i < 15; i++) assert.equal((await stack.client.post(`/api/task/v1/${task}/message`, { role: 'agent', parts: [{ type: 'text-part', text: big }] })).status, 201);
    const stream = unread('tasks/resubscribe', { id: task });
    const get = unread('tasks/get', { id: task });
    const whole = Buffer.byteLength(JSON.stringify((await stack.client.post(A2A, { jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id: task } })).body));
    // Read only once the API has cut both: reading earlier would let the answers through whole.
    await waitFor(async () => apiEndClosed(stack.api.url, stream.socket) && apiEndClosed(stack.api.url, get.socket), 'the API to cut both connections');
    for (const r of [await stream.readRest(), await get.readRest()]) {
      assert.equal(typeof r, 'number', 'the API closed the connection');
      assert.ok((r as number) < whole, `cut short: ${r} of ${whole} bytes`);
    }

    // The key's one stream place is free again; a stream that is read but has nothing to say is kept.
    const small = await quietTask(stack.client);
    const ac = new AbortController();
    const res = await fetch(stack.api.url + A2A, {
      method: 'POST', signal: ac.signal,
      headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/resubscribe', params: { id: small } }),
    });
    assert.equal(res.status, 200);
    let ended = false;
    void (async () => { for await (const _ of res.body as unknown as AsyncIterable<Uint8Array>) { /* the snapshot */ } ended = true; })().catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 3000));
    assert.equal(ended, false, 'an idle stream whose client reads is not cut');
    ac.abort();
  });
});

describe('A2A stream places of API processes that stop, and with Redis silent', () => {
  // Leases far longer than the tests: a place that comes back does so because it was given back.
  const stack = useStack({ A2A_STREAMS_PER_KEY: '2', A2A_STREAM_LEASE_MS: '600000' }, { workers: 0 });

  it('an API process stopping (SIGTERM) with streams open gives their places back as it goes', async () => {
    const task = await quietTask(stack.client);
    const going = await startApi(stack.env);
    const streams = [await openStream(going.url, task), await openStream(going.url, task)];
    for (const s of streams) assert.equal(s.res.status, 200);
    const refused = await openStream(stack.api.url, task);
    assert.equal(refused.res.status, 429);
    refused.close();
    await going.stop();
    for (const s of streams) s.close();
    const here = await openStream(stack.api.url, task);
    assert.equal(here.res.status, 200, 'the stopped process gave its places back');
    here.close();
  });

  describe('Redis gone silent', () => {
    const own = behindServiceProxy('REDIS_URL', { A2A_STREAMS_PER_KEY: '2' });

    it('opens a stream within seconds, not after DB_QUERY_TIMEOUT_MS (30 s), counting it here alone; one past the limit is still refused', async () => {
      const s = own.stack;
      const task = await quietTask(s.client);
      own.proxy.swallow();
      const started = Date.now();
      const streams = [await openStream(s.api.url, task), await openStream(s.api.url, task)];
      for (const x of streams) assert.equal(x.res.status, 200);
      assert.ok(Date.now() - started < 10_000, `two streams opened in ${Date.now() - started} ms`);
      const refused = await openStream(s.api.url, task);
      assert.equal(refused.res.status, 429);
      refused.close();
      for (const x of streams) x.close();
      own.proxy.forward();
    });
  });
});

describe("A2A streams of keys revoked by other paths", () => {
  const stack = useStack({}, { workers: 0 });

  // A stream of a new a2a key on a task that stays submitted; resolves 'ended' when the API ends it.
  const streamOfNewKey = async () => {
    const task = await quietTask(stack.client);
    const key = (await stack.client.post('/api/auth/v1/api-key', { name: 'streams', scopes: ['a2a'] })).body;
    const res = await fetch(`${stack.api.url}${A2A}`, {
      method: 'POST', headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/resubscribe', params: { id: task } }),
    });
    assert.equal(res.status, 200);
    const ended = (async () => {
      for await (const _ of res.body as unknown as AsyncIterable<Uint8Array>) { /* the snapshot, keep-alives */ }
      return 'ended';
    })().catch((e) => (e as Error).name);
    const within = (ms: number) => Promise.race([ended, new Promise((resolve) => setTimeout(() => resolve('still open'), ms))]);
    return { id: key.id as string, within };
  };

  it('ends the streams of a key deleted with plain SQL', async () => {
    const s = await streamOfNewKey();
    await testDb()('api_keys').where({ id: s.id }).delete();
    assert.equal(await s.within(10_000), 'ended');
  });

  it("ends the streams of a key revoked while the API process's listener was away, once it listens again", async () => {
    const s = await streamOfNewKey();
    // The API's listener connection is cut, and the key revoked with SQL before it is back: its
    // notice goes to nobody.
    const cut = await testDb().raw(`select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'taskbridge listen api_key_revoked'`);
    assert.equal(cut.rows.length, 1);
    await testDb()('api_keys').where({ id: s.id }).update({ revoked_at: new Date() });
    assert.equal(await s.within(10_000), 'ended');
    assert.ok(stack.api.logs.some((l) => l.includes('Postgres listener lost its connection')));
  });

  it('tells nothing more, on revocation, to a stream that has sent its task in an ended state: the task is all there is to tell', async () => {
    // 15 MB of history, more than the loopback socket buffers hold: the snapshot's write waits on a
    // client that reads nothing, until the revocation ends the stream right after it.
    const task = await quietTask(stack.client);
    const big = 'y'.repeat(1_000_000);
    for (let i = 0; i < 15; i++) assert.equal((await stack.client.post(`/api/task/v1/${task}/message`, { role: 'agent', parts: [{ type: 'text-part', text: big }] })).status, 201);
    for (const status of ['working', 'completed']) assert.equal((await stack.client.put(`/api/task/v1/${task}`, { status })).status, 200);
    const key = (await stack.client.post('/api/auth/v1/api-key', { name: 'revoked mid-snapshot', scopes: ['a2a'] })).body;
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/resubscribe', params: { id: task } });
    const socket = net.connect(Number(new URL(stack.api.url).port), '127.0.0.1', () => {
      socket.write(`POST ${A2A} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer ${key.key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    socket.pause();
    socket.on('error', () => undefined);
    // More than 64 kB waiting to be read on the client's end: only the snapshot is that long.
    const received = () => fs.readFileSync('/proc/net/tcp', 'utf8').split('\n').some((line) => {
      const [, from, , , queues] = line.trim().split(/\s+/);
      return from === `0100007F:${socket.localPort?.toString(16).toUpperCase().padStart(4, '0')}` && parseInt(queues.split(':')[1], 16) > 65536;
    });
    await waitFor(async () => received(), 'the snapshot to be under way');
    assert.equal((await stack.client.delete(`/api/auth/v1/api-key/${key.id}`)).status, 200);
    const streamsOpen = async () => Number(/^taskbridge_a2a_streams_open (\S+)$/m.exec((await stack.client.get('/metrics')).text)?.[1]);
    await waitFor(async () => (await streamsOpen()) === 0, 'the stream to end');
    const answer = await new Promise<string>((resolve) => {
      const chunks: Buffer[] = [];
      socket.on('data', (b: Buffer) => chunks.push(b));
      socket.once('close', () => resolve(Buffer.concat(chunks).toString('utf8')));
      socket.resume();
    });
    const events = answer.split('\r\n\r\n').slice(1).join('\r\n\r\n').split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
    assert.deepEqual(events.map((e) => e.result ? `${e.result.kind} ${e.result.status?.state}` : `error ${e.error.message}`), ['task completed']);
  });
});

describe('A2A blocking send and streams while Redis is away', function () {
  this.timeout(120000);
  let redis: LocalService | undefined;
  let stack: Stack | undefined;
  const dataDir = path.join(process.env.TEST_DATA_DIR!, 'a2a-redis-away');
  let port: number;

  before(async () => {
    await resetDb();
    port = await freePort();
    redis = await startRedis({ dataDir, ephemeral: true, port });
    stack = await startStack({ REDIS_URL: redis.url, A2A_BLOCKING_TIMEOUT_MS: '1500' });
  });
  after(async () => {
    await stack?.stop();
    await redis?.stop();
  });

  it('answers blocking sends after the bounded wait, and a stream opened meanwhile ends once Redis is back', async () => {
    await redis!.stop();
    redis = undefined;
    const rpc = (method: string, params: unknown) => stack!.client.post(A2A, { jsonrpc: '2.0', id: 1, method, params });
    const blocked = await rpc('message/send', { message: userMessage('while redis is away') });
    assert.equal(blocked.body.result.status.state, 'submitted');
    const again = await rpc('message/send', { message: userMessage('again while redis is away') });
    assert.equal(again.body.result.status.state, 'submitted');
    // Only the first follower waited for the subscription: the others go straight to polling Postgres.
    const waited = stack!.api.logs.filter((l) => l.includes('task notes unavailable'));
    assert.equal(waited.length, 1, waited.join('\n'));
    const streamed = sse(stack!.api.url, 'message/stream', { message: userMessage('stream while redis is away') });
    redis = await startRedis({ dataDir, ephemeral: true, port });
    const s = await streamed;
    assert.ok(s.ended);
    assert.deepEqual([s.events.at(-1).result.status.state, s.events.at(-1).result.final], ['completed', true]);
    await waitFor(async () => (await rpc('tasks/get', { id: blocked.body.result.id })).body.result.status.state === 'completed', 'the first task to complete', 60000);
    assert.equal(stack!.api.logs.filter((l) => l.includes('task notes unavailable')).length, 1);
  });
});


import assert from 'node:assert/strict';
import dns from 'node:dns';
import http from 'node:http';
import net from 'node:net';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { startWorker, testDb, useStack, waitFor, textMessage, withQueue } from './helpers/stack.ts';
import { deletePushConfig, getPushConfig, listPushConfigs, MAX_CONFIGS_PER_TASK, setPushConfig } from '../domain/push-config.ts';
import { AppError } from '../domain/errors.ts';
import { loadConfig, type Config } from '../domain/config.ts';
import { postNotification } from '../domain/push-delivery.ts';
import { leasePushConfig, listStalledDeliveries, releasePushConfig, setDeliveredSeq, upsertPushConfig } from '../db/push-configs.ts';
import { applyStatusChanges, type StatusChange } from '../db/tasks.ts';
import type { TaskState } from '../domain/task-states.ts';
import type { TimelineItem } from '../domain/shapes/task.ts';

interface Received { token: string | undefined; authorization: string | undefined; body: any; at: number }
type Answer = number | { status: number; headers: Record<string, string> };

// A local webhook receiver; `answer` picks the HTTP status (and headers) for each request, after
// recording it with the time it arrived.
async function startReceiver(answer: (r: Received, all: Received[]) => Answer | Promise<Answer> = () => 200) {
  const all: Received[] = [];
  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      const r: Received = { token: req.headers['x-a2a-notification-token'] as string | undefined, authorization: req.headers.authorization, body: JSON.parse(raw), at: Date.now() };
      all.push(r);
      void Promise.resolve(answer(r, all)).then((a) => (typeof a === 'number' ? res.writeHead(a) : res.writeHead(a.status, a.headers)).end());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
  return { url, all, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
}


// Rejects with the status and message of the AppError `fn` throws.
async function rejection(fn: () => Promise<unknown>): Promise<{ status: number; code: string; message: string }> {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof AppError, `expected an AppError, got ${(e as Error).message}`);
    return { status: e.status, code: e.code, message: e.message };
  }
  assert.fail('expected a rejection');
}

// A status change as an agent run's end writes it (db/tasks.ts applyStatusChanges), with an agent message when `text` is given.
function change(taskId: string, to: TaskState, from: TaskState, text?: string): StatusChange {
  const at = new Date();
  const message = text === undefined ? undefined : {
    id: randomUUID(), task_id: taskId, role: 'agent' as const, parts: [{ type: 'text-part' as const, text }], reference_task_ids: [], metadata: {}, created_at: at.toISOString(),
  };
  const item = (event_payload: TimelineItem['event_payload']) => ({ id: randomUUID(), task_id: taskId, created_at: at.toISOString(), event_payload });
  return {
    taskId, to, from: [from], at, message,
    timeline: [...(message ? [item({ type: 'message', message })] : []), item({ type: 'task-status-update', status: to, ...(message ? { status_message_id: message.id } : {}) })],
  };
}

// Spoils a task's push config token as stored, so that it no longer decrypts (a fault of ours: every
// delivery run fails before posting); resolves to the sealed token, to put back.
async function spoilSecrets(taskId: string): Promise<string> {
  const [{ encrypted_secrets: sealed }] = await testDb()('push_configs').where({ task_id: taskId }).select('encrypted_secrets');
  const broken = `${sealed.slice(0, -8)}${sealed.slice(-8) === 'AAAAAAAA' ? 'BBBBBBBB' : 'AAAAAAAA'}`;
  await testDb()('push_configs').where({ task_id: taskId }).update({ encrypted_secrets: broken });
  return sealed;
}

describe('push notifications', () => {
  const stack = useStack({ PUSH_ALLOW_PRIVATE: 'true', PUSH_ATTEMPTS: '4', PUSH_BACKOFF_MS: '100' });
  let allowPrivate: Config;
  let denyPrivate: Config;
  const receivers: { close(): Promise<void> }[] = [];
  before(async () => {
    // The stack's configuration, for calling the domain functions directly. Configs with a token
    // are set through the API: encrypting needs the stack's keys, and this process's key caches
    // outlive the stacks of other test files.
    allowPrivate = loadConfig(stack.env);
    denyPrivate = { ...allowPrivate, PUSH_ALLOW_PRIVATE: false };
  });
  after(async () => { await Promise.all(receivers.map((r) => r.close())); });

  // A task that no agent runs (its first message is an agent message): the test drives its status.
  async function idleTask(): Promise<string> {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('driven by the test', 'agent') });
    assert.equal(created.status, 201);
    return created.body.task.id;
  }
  const setStatus = async (id: string, status: string, text?: string) => {
    const r = await stack.client.put(`/api/task/v1/${id}`, { status, ...(text ? { message: textMessage(text, 'agent') } : {}) });
    assert.equal(r.status, 200, r.text);
  };
  const rpc = async (method: string, params: unknown) => {
    const r = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: method, method, params });
    assert.equal(r.status, 200, r.text);
    return r.body;
  };
  const setConfig = async (taskId: string, pushNotificationConfig: Record<string, unknown>) => {
    const r = await rpc('tasks/pushNotificationConfig/set', { taskId, pushNotificationConfig });
    assert.equal(r.error, undefined, JSON.stringify(r.error));
    return r.result;
  };
  const states = (list: Received[], taskId: string) => list.filter((r) => r.body.id === taskId).map((r) => r.body.status.state);

  it('delivers every status update in order, with the token, as the A2A Task', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const id = await idleTask();
    await setConfig(id, { url: rx.url, token: 'tok-in-order-123' });
    await setStatus(id, 'working');
    await setStatus(id, 'input-required', 'need more');
    await setStatus(id, 'working');
    await setStatus(id, 'completed', 'all done');
    await waitFor(async () => rx.all.length >= 4, 'four notifications');
    assert.deepEqual(states(rx.all, id), ['working', 'input-required', 'working', 'completed']);
    for (const r of rx.all) assert.equal(r.token, 'tok-in-order-123');
    const last = rx.all[3].body;
    assert.equal(last.kind, 'task');
    assert.equal(typeof last.contextId, 'string');
    assert.equal(last.status.message.parts[0].text, 'all done');
    assert.match(last.status.timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.equal(rx.all[1].body.status.message.parts[0].text, 'need more');
  });


  it('posts the current status at once to a config set on a task that has ended or waits for input (no other update may come), then every later one', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    // A client that sent a message without blocking and set its config once the answer came: the
    // task may have ended (or stopped for input) meanwhile. Before, nothing was ever posted.
    const ended = await idleTask();
    await setStatus(ended, 'working');
    await setStatus(ended, 'completed', 'done before the config');
    const waiting = await idleTask();
    await setStatus(waiting, 'working');
    await setStatus(waiting, 'input-required', 'which one?');
    const going = await idleTask();
    await setStatus(going, 'working');
    await setConfig(ended, { url: rx.url, token: 'tok-late-ended' });
    await setConfig(waiting, { url: rx.url, token: 'tok-late-waiting' });
    await setConfig(going, { url: rx.url });
    await waitFor(async () => states(rx.all, ended).length > 0 && states(rx.all, waiting).length > 0, 'the two current statuses posted');
    const endedPost = rx.all.find((r) => r.body.id === ended)!;
    assert.equal(endedPost.token, 'tok-late-ended');
    assert.equal(endedPost.body.status.state, 'completed');
    assert.equal(endedPost.body.status.message.parts[0].text, 'done before the config');
    assert.equal(rx.all.find((r) => r.body.id === waiting)!.token, 'tok-late-waiting');
    // The waiting task goes on; a task still going gets its next update only; setting the ended
    // task's config again posts nothing more.
    await setStatus(waiting, 'working');
    await setStatus(waiting, 'completed');
    await setStatus(going, 'completed');
    await setConfig(ended, { url: rx.url, token: 'tok-late-again' });
    await waitFor(async () => states(rx.all, waiting).length >= 3 && states(rx.all, going).length >= 1, 'the later updates');
    await sleep(300);
    assert.deepEqual(states(rx.all, waiting), ['input-required', 'working', 'completed']);
    assert.deepEqual(states(rx.all, going), ['completed']);
    assert.deepEqual(states(rx.all, ended), ['completed']);
  });

  it('tells a config a set created from one it replaced (the catch-up delivery is for new ones only)', async () => {
    const id = await idleTask();
    const row = { task_id: id, id: 'set-twice', url: 'http://127.0.0.1:9/hook', authentication: null, encrypted_secrets: null, secrets_dek_id: null };
    const first = await upsertPushConfig(testDb(), row);
    const again = await upsertPushConfig(testDb(), { ...row, url: 'http://127.0.0.1:9/other' });
    assert.equal(first.created, true);
    assert.equal(again.created, false);
    assert.equal(again.row.url, 'http://127.0.0.1:9/other');
    assert.equal('created' in again.row, false);
  });

  it('with A2A_PUSH_NOTIFICATIONS off in the worker, posts nothing and passes the updates over; back on, posts the next update only', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const id = await idleTask();
    await setConfig(id, { url: rx.url, token: 'tok-switched-123' });
    await setStatus(id, 'working');
    await waitFor(async () => rx.all.length >= 1, 'the update while on');
    const caughtUp = async () => {
      const row = await testDb()('push_configs').where({ task_id: id }).first();
      return row.delivered_seq === row.status_seq;
    };
    const swap = async (env: Record<string, string>) => {
      await stack.workers[0].stop();
      stack.workers[0] = await startWorker(env);
    };
    await swap({ ...stack.env, A2A_PUSH_NOTIFICATIONS: 'false' });
    try {
      await setStatus(id, 'input-required', 'need more');
      await setStatus(id, 'working');
      await waitFor(caughtUp, 'the updates passed over');
      await sleep(300);
    } finally {
      await swap(stack.env);
    }
    assert.deepEqual(states(rx.all, id), ['working']);
    await setStatus(id, 'completed', 'all done');
    await waitFor(async () => rx.all.length >= 2, 'the update once on again');
    await waitFor(caughtUp, 'the config caught up');
    assert.deepEqual(states(rx.all, id), ['working', 'completed']);
  });

  it('takes an inline push config with a message to an existing task, checked before anything is stored; a retry of the message sets none', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const id = await idleTask();
    const messages = async () => (await stack.client.get(`/api/task/v1/${id}/message`)).body.items.length;
    const message = { kind: 'message', messageId: `m-${randomUUID()}`, role: 'user', parts: [{ kind: 'text', text: 'tell my hook too' }], taskId: id };
    const send = (pushNotificationConfig: Record<string, unknown>) => rpc('message/send', { message, configuration: { blocking: false, pushNotificationConfig } });

    const refused = await send({ id: 'inline', url: 'gopher://example.com/', token: 'tok-refused-789' });
    assert.equal(refused.error?.code, -32602, JSON.stringify(refused));
    assert.equal(await messages(), 1, 'a refused config stores no message');
    assert.equal((await send({ id: 'inline', url: rx.url, token: 'tok-first-123' })).error, undefined);
    // The same message again (a client whose answer was lost) with another token: a retry, nothing set.
    assert.equal((await send({ id: 'inline', url: rx.url, token: 'tok-retry-456' })).error, undefined);
    assert.equal(await messages(), 2);

    await setStatus(id, 'working');
    await waitFor(async () => rx.all.length >= 1, 'the update');
    assert.deepEqual(states(rx.all, id), ['working']);
    assert.equal(rx.all[0].token, 'tok-first-123');
    assert.deepEqual((await rpc('tasks/pushNotificationConfig/list', { id })).result.map((c: any) => c.pushNotificationConfig.id), ['inline']);
  });

  it('takes the inline push config of a new task once: a retry of its first send sets none, and a bad one is still refused', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const message = { kind: 'message', messageId: `m-${randomUUID()}`, role: 'user', parts: [{ kind: 'text', text: '[input] hook me' }] };
    const send = (pushNotificationConfig: Record<string, unknown>) => rpc('message/send', { message, configuration: { blocking: false, pushNotificationConfig } });
    const first = await send({ id: 'inline', url: rx.url, token: 'tok-first-321' });
    assert.equal(first.error, undefined, JSON.stringify(first));
    const retry = await send({ id: 'inline', url: rx.url, token: 'tok-retry-654' });
    assert.equal(retry.error, undefined, JSON.stringify(retry));
    assert.equal(retry.result.id, first.result.id);
    const refused = await send({ id: 'inline', url: 'gopher://example.com/', token: 'tok-refused-987' });
    assert.equal(refused.error?.code, -32602, JSON.stringify(refused));
    const id = first.result.id;
    await waitFor(async () => states(rx.all, id).includes('input-required'), 'the update that it waits for input');
    for (const r of rx.all.filter((x) => x.body.id === id)) assert.equal(r.token, 'tok-first-321');
    assert.deepEqual((await rpc('tasks/pushNotificationConfig/list', { id })).result.map((c: any) => c.pushNotificationConfig.id), ['inline']);
  });

  it('refuses a message to an ended task as such (-32600) whatever inline push config it brings, checking none', async () => {
    const id = await idleTask();
    await setStatus(id, 'working');
    await setStatus(id, 'completed');
    const message = { kind: 'message', messageId: `m-${randomUUID()}`, role: 'user', parts: [{ kind: 'text', text: 'too late' }], taskId: id };
    const sent = await rpc('message/send', { message, configuration: { blocking: false, pushNotificationConfig: { id: 'late', url: 'gopher://example.com/' } } });
    assert.equal(sent.error?.code, -32600, JSON.stringify(sent));
    assert.match(sent.error.message, /is completed/);
  });

  it("does not hold up the task's status changes, a config set or a rotation of its alias while a webhook is slow to answer", async () => {
    // The webhook keeps its first notification waiting until the test lets it go.
    let letGo!: () => void;
    const held = new Promise<void>((resolve) => (letGo = resolve));
    const slow = await startReceiver(async (_r, all) => (all.length === 1 ? held.then(() => 200) : 200));
    const other = await startReceiver();
    receivers.push(slow, other);
    const id = await idleTask();
    await setConfig(id, { id: 'p1', url: slow.url, token: 'tok-slow' });
    await setStatus(id, 'working');
    await waitFor(async () => slow.all.length === 1, 'the delivery to be in flight');
    const within = <T>(p: Promise<T>, what: string) =>
      Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} waited for the webhook`)), 5000))]);
    try {
      // The same config set again (a new URL), the task's own status changes and a rotation of the
      // alias that seals the token all go through while the delivery waits on the webhook.
      await within(setConfig(id, { id: 'p1', url: other.url, token: 'tok-slow' }), 'the config set');
      await within(setStatus(id, 'input-required', 'need more'), 'the status change');
      const rotated = await within(stack.client.post('/api/encryption/v1/dek/alias/default/rotate'), 'the alias rotation');
      assert.ok([200, 202].includes(rotated.status), rotated.text);
    } finally {
      letGo();
    }
    // Then the rest arrives, in order, at the config's new URL.
    await waitFor(async () => states(other.all, id).includes('input-required'), 'the later update at the new URL');
    assert.deepEqual([...states(slow.all, id), ...states(other.all, id)], ['working', 'input-required']);
    assert.ok(other.all.every((r) => r.token === 'tok-slow'));
  });

  it('sends the updates still pending when a config is set again to its new URL, with its new token', async () => {
    // The first post fails once the backlog exists; its retry (a run that has read the whole
    // backlog) is held at the old URL while the config is set again.
    let failFirst!: () => void;
    const backlogThere = new Promise<void>((resolve) => (failFirst = resolve));
    let letGo!: () => void;
    const held = new Promise<void>((resolve) => (letGo = resolve));
    const old = await startReceiver(async (_r, all) => (all.length === 1 ? backlogThere.then(() => 500) : all.length === 2 ? held.then(() => 200) : 200));
    const next = await startReceiver();
    receivers.push(old, next);
    const id = await idleTask();
    await setConfig(id, { id: 'moved', url: old.url, token: 'tok-old' });
    await setStatus(id, 'working', 's0');
    await waitFor(async () => old.all.length === 1, 'the first post');
    for (const t of ['s1', 's2', 's3']) await setStatus(id, 'working', t);
    failFirst();
    await waitFor(async () => old.all.length === 2, 'the retry of the first update');
    await setConfig(id, { id: 'moved', url: next.url, token: 'tok-new' });
    letGo();
    await waitFor(async () => next.all.length >= 3, 'the rest at the new URL');
    const text = (list: Received[]) => list.map((r) => r.body.status.message.parts[0].text);
    assert.deepEqual(text(old.all), ['s0', 's0'], 'only the update in flight when the config was set went to the old URL');
    assert.deepEqual(text(next.all), ['s1', 's2', 's3']);
    assert.ok(next.all.every((r) => r.token === 'tok-new'));
  });

  it('gives the pending update fresh attempts at the new URL when a failing config is set again', async () => {
    const old = await startReceiver(() => 503);
    const next = await startReceiver((_r, all) => (all.length <= 2 ? 503 : 200));
    receivers.push(old, next);
    const id = await idleTask();
    await setConfig(id, { id: 'fixed', url: old.url });
    await setStatus(id, 'working');
    await waitFor(async () => old.all.length === 2, 'two failed posts at the old URL');
    await setConfig(id, { id: 'fixed', url: next.url });
    await setStatus(id, 'completed');
    // PUSH_ATTEMPTS=4: two failures at the new URL are not the update's third and fourth.
    await waitFor(async () => states(next.all, id).includes('completed'), 'the completed notification at the new URL');
    assert.deepEqual(states(next.all, id), ['working', 'working', 'working', 'completed']);
    assert.ok(old.all.length <= 3, `at most the post in flight went to the old URL after the set: ${old.all.length}`);
    assert.ok(!stack.workers[0].logs.some((l) => l.includes('push notification given up') && l.includes(id)), 'nothing given up');
  });

  it("posts the pending update to the new URL at once when a config the old URL holds off (Retry-After) is set again, not when the hold would have ended", async () => {
    // Retry-After 60 s, the most a webhook is waited for: the pending update's own job comes back only then.
    const old = await startReceiver(() => ({ status: 503, headers: { 'retry-after': '60' } }));
    const next = await startReceiver();
    receivers.push(old, next);
    const id = await idleTask();
    await setConfig(id, { id: 'mended', url: old.url, token: 'tok-broken' });
    await setStatus(id, 'working', 'w1');
    await waitFor(async () => old.all.length === 1, 'the post the old URL holds off');
    await setConfig(id, { id: 'mended', url: next.url, token: 'tok-mended' });
    await waitFor(async () => next.all.length === 1, 'the pending update at the new URL');
    assert.deepEqual([next.all[0].body.status.message.parts[0].text, next.all[0].token], ['w1', 'tok-mended']);
    await setStatus(id, 'completed');
    await waitFor(async () => states(next.all, id).includes('completed'), 'the next update at the new URL');
    assert.deepEqual(states(next.all, id), ['working', 'completed']);
    assert.equal(old.all.length, 1);
  });

  it('does not hold a config set again while its failing post was still out: the failure is the old URL\'s, and the new one gets the update at once', async () => {
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const old = await startReceiver(async () => { await answered; return { status: 503, headers: { 'retry-after': '60' } }; });
    const next = await startReceiver();
    receivers.push(old, next);
    const id = await idleTask();
    await setConfig(id, { id: 'mended-mid-post', url: old.url });
    await setStatus(id, 'working', 'w1');
    await waitFor(async () => old.all.length === 1, 'the post to the old URL, unanswered');
    await setConfig(id, { id: 'mended-mid-post', url: next.url });
    answer();
    await waitFor(async () => next.all.length === 1, 'the pending update at the new URL');
    assert.equal(next.all[0].body.status.message.parts[0].text, 'w1');
    assert.equal(old.all.length, 1);
  });

  it('delivers the updates of a task sent with an inline config over A2A message/send', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const sent = await rpc('message/send', {
      message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text: 'push me [artifact]' }] },
      configuration: { blocking: false, pushNotificationConfig: { url: rx.url, token: 'tok-inline' } },
    });
    const id = sent.result.id;
    await waitFor(async () => states(rx.all, id).includes('completed'), 'the completed notification');
    // Every status change, the first (submitted, written with the config) included.
    assert.deepEqual(states(rx.all, id), ['submitted', 'working', 'completed']);
    assert.ok(rx.all.every((r) => r.token === 'tok-inline'));
    // Each is the task as it stood at that change: at submitted it already holds the user's message.
    const first = rx.all.find((r) => r.body.id === id && r.body.status.state === 'submitted')!.body;
    assert.deepEqual(first.history.map((m: any) => m.parts[0].text), ['push me [artifact]']);
    const last = rx.all.find((r) => r.body.id === id && r.body.status.state === 'completed')!.body;
    assert.equal(last.status.message.parts[0].text, 'Echo: push me [artifact]');
    assert.equal(last.artifacts?.[0]?.parts?.[0]?.text, 'push me [artifact]');
    assert.equal(last.history.at(0).parts[0].text, 'push me [artifact]');
  });

  it("holds in a notification's history the newest messages within 1 MiB, and always the newest", async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const id = await idleTask();
    await setConfig(id, { url: rx.url });
    const big = (c: string) => `${c}${c.repeat(600 * 1024)}`;
    await setStatus(id, 'working', big('a'));
    await setStatus(id, 'input-required', big('b'));
    await setStatus(id, 'working', 'small');
    await setStatus(id, 'completed');
    await waitFor(async () => states(rx.all, id).includes('completed'), 'the completed notification');
    const historyAt = (state: string) => rx.all.find((r) => r.body.id === id && r.body.status.state === state)!.body.history.map((m: any) => m.parts[0].text.slice(0, 10));
    assert.deepEqual(historyAt('working'), ['driven by ', 'aaaaaaaaaa']);
    // 1.2 MB of the two large messages: the newest alone.
    assert.deepEqual(historyAt('input-required'), ['bbbbbbbbbb']);
    assert.deepEqual(historyAt('completed'), ['bbbbbbbbbb', 'small']);
    const last = rx.all.find((r) => r.body.id === id && r.body.status.state === 'completed')!.body;
    assert.equal(last.status.message, undefined);
    const asked = rx.all.find((r) => r.body.id === id && r.body.status.state === 'input-required')!.body;
    assert.equal(asked.status.message.parts[0].text, big('b'));
  });

  it('manages configs over A2A tasks/pushNotificationConfig/* without ever returning the token', async () => {
    const id = await idleTask();
    const token = 'tok-jsonrpc-9d2e41';
    const set = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { id: 'hook', url: 'http://127.0.0.1:9/hook', token } });
    assert.deepEqual(set.result, { taskId: id, pushNotificationConfig: { id: 'hook', url: 'http://127.0.0.1:9/hook' } });
    const got = await rpc('tasks/pushNotificationConfig/get', { id, pushNotificationConfigId: 'hook' });
    assert.equal(got.result.pushNotificationConfig.url, 'http://127.0.0.1:9/hook');
    const list = await rpc('tasks/pushNotificationConfig/list', { id });
    assert.equal(list.result.length, 1);
    for (const body of [set, got, list]) assert.ok(!JSON.stringify(body).includes(token), JSON.stringify(body));
    const del = await rpc('tasks/pushNotificationConfig/delete', { id, pushNotificationConfigId: 'hook' });
    assert.equal(del.error, undefined, JSON.stringify(del));
    assert.deepEqual((await rpc('tasks/pushNotificationConfig/list', { id })).result, []);
    const gone = await rpc('tasks/pushNotificationConfig/get', { id, pushNotificationConfigId: 'hook' });
    assert.deepEqual(gone.error, { code: -32602, message: "push notification config 'hook' not found", data: { resource: 'push_notification_config', id: 'hook' } });
    const none = await rpc('tasks/pushNotificationConfig/get', { id });
    assert.deepEqual(none.error, { code: -32602, message: `task '${id}' has no push notification config`, data: { resource: 'push_notification_config', task_id: id } });
    const bad = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url: 'gopher://example.com/' } });
    assert.equal(bad.error.code, -32602);
    assert.match(bad.error.message, /must use http or https, not 'gopher'/);
    const unknown = await rpc('tasks/pushNotificationConfig/list', { id: randomUUID() });
    assert.equal(unknown.error.code, -32001);
  });

  it('gives a config set without an id the task id, so setting it again replaces it, and get without an id reads it', async () => {
    const id = await idleTask();
    await setConfig(id, { id: 'named', url: 'http://127.0.0.1:9/named' });
    assert.equal((await rpc('tasks/pushNotificationConfig/get', { id })).result.pushNotificationConfig.id, 'named', 'the only config');
    const first = await setConfig(id, { url: 'http://127.0.0.1:9/first', token: 'tok-first' });
    assert.deepEqual(first, { taskId: id, pushNotificationConfig: { id, url: 'http://127.0.0.1:9/first' } });
    await setConfig(id, { url: 'http://127.0.0.1:9/second' });
    const list = await rpc('tasks/pushNotificationConfig/list', { id });
    assert.deepEqual(list.result, [
      { taskId: id, pushNotificationConfig: { id: 'named', url: 'http://127.0.0.1:9/named' } },
      { taskId: id, pushNotificationConfig: { id, url: 'http://127.0.0.1:9/second' } },
    ]);
    // As the SDK's server reads it: without pushNotificationConfigId, the config whose id is the task's.
    assert.equal((await rpc('tasks/pushNotificationConfig/get', { id })).result.pushNotificationConfig.url, 'http://127.0.0.1:9/second');

    const sent = await rpc('message/send', {
      message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text: 'inline hook' }] },
      configuration: { blocking: false, pushNotificationConfig: { url: 'http://127.0.0.1:9/inline' } },
    });
    const inline = await rpc('tasks/pushNotificationConfig/list', { id: sent.result.id });
    assert.deepEqual(inline.result.map((c: any) => c.pushNotificationConfig.id), [sent.result.id]);
  });

  it('delivers a long series of updates in order across several delivery runs', async () => {
    // The first update is held at the receiver until all the others exist, so one backlog of
    // more updates than a run takes has to be worked off.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const rx = await startReceiver(async (_r, all) => {
      if (all.length === 1) await held;
      return 200;
    });
    receivers.push(rx);
    const id = await idleTask();
    await setPushConfig(testDb(), id, { url: rx.url }, allowPrivate);
    const texts = Array.from({ length: 45 }, (_, i) => `step ${i}`);
    for (const t of texts) await setStatus(id, 'working', t);
    release();
    await setStatus(id, 'completed', 'finished');
    await waitFor(async () => states(rx.all, id).includes('completed'), 'the completed notification', 30000);
    const seen = rx.all.filter((r) => r.body.id === id).map((r) => r.body.status.message.parts[0].text);
    assert.deepEqual(seen, [...texts, 'finished']);
  });

  it("keeps a backlog's delivery jobs from polling the config's lease while one run posts to a slow webhook", async function () {
    this.timeout(180_000);
    // Each post is answered after a second: the 20 updates take about 20 s to go out, one run at a
    // time, while the jobs of the later ones find the config leased. Runs per job are what BullMQ
    // records (attemptsStarted, shown on the queue dashboard). Coming back every 200 ms, as before,
    // made about 4 runs a second per waiting job, 700-900 runs here; waiting twice as long each time,
    // up to 5 s, makes a job's runs grow with the log of its wait: about 150 here.
    const rx = await startReceiver(async () => {
      await sleep(1000);
      return 200;
    });
    receivers.push(rx);
    const id = await idleTask();
    await setPushConfig(testDb(), id, { url: rx.url }, allowPrivate);
    const updates = 20;
    for (let i = 0; i < updates; i++) await setStatus(id, i % 2 ? 'input-required' : 'working', `step ${i}`);
    await waitFor(async () => rx.all.length >= updates, 'every notification', 120_000, 500);
    assert.deepEqual(rx.all.map((r) => r.body.status.message.parts[0].text), Array.from({ length: updates }, (_, i) => `step ${i}`));
    // The jobs of the last updates end when they next come back and find them delivered.
    const runs = await withQueue(stack.env, 'push-notifications', async (queue) => {
      const jobs = await waitFor(async () => {
        const done = (await queue.getJobs(['completed'], 0, -1)).filter((j) => j.data.task_id === id);
        return done.length === updates && done;
      }, 'every delivery job completed', 30_000, 200);
      return jobs.reduce((n, j) => n + j.attemptsStarted, 0);
    });
    assert.ok(runs <= 300, `${runs} delivery job runs for ${updates} updates`);
  });

  it('fans out every update of tasks whose changes one statement writes together', async () => {
    // Agent runs that end at the same time share one status statement (db/tasks.ts); the fan-out
    // runs once for it and must still give each config of each task its own updates, in order.
    const [rxA1, rxA2, rxB] = await Promise.all([startReceiver(), startReceiver(), startReceiver()]);
    receivers.push(rxA1, rxA2, rxB);
    const [a, b, quiet] = [await idleTask(), await idleTask(), await idleTask()];
    await setPushConfig(testDb(), a, { id: 'one', url: rxA1.url }, allowPrivate);
    await setPushConfig(testDb(), a, { id: 'two', url: rxA2.url }, allowPrivate);
    await setPushConfig(testDb(), b, { url: rxB.url }, allowPrivate);
    const ids = [a, b, quiet];
    await applyStatusChanges(testDb(), ids.map((id) => change(id, 'working', 'submitted')));
    await applyStatusChanges(testDb(), ids.map((id) => change(id, 'completed', 'working', `done ${id}`)));
    await waitFor(async () => [rxA1, rxA2, rxB].every((rx) => rx.all.length >= 2), 'two notifications at each receiver');
    for (const [rx, id] of [[rxA1, a], [rxA2, a], [rxB, b]] as const) {
      assert.deepEqual(rx.all.map((r) => [r.body.id, r.body.status.state]), [[id, 'working'], [id, 'completed']]);
      assert.equal(rx.all[1].body.status.message.parts[0].text, `done ${id}`);
    }
  });

  it('a status statement over several tasks takes their configs in (task_id, id) order, as alias rotation writes them: the two never deadlock', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const ids: string[] = [];
    for (let i = 0; i < 8; i++) ids.push(await idleTask());
    ids.sort();
    // Stored the other way round: a statement taking them as they lie would not take the first first.
    for (const id of [...ids].reverse()) await setPushConfig(testDb(), id, { url: rx.url }, allowPrivate);
    const holder = await testDb().transaction();
    try {
      await holder('push_configs').where({ task_id: ids[0] }).forUpdate();
      const status = applyStatusChanges(testDb(), ids.map((id) => change(id, 'working', 'submitted')));
      await waitFor(async () => {
        const { rows } = await testDb().raw(`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and pid <> pg_backend_pid()`);
        return rows[0].n >= 1;
      }, 'the status statement to wait for the first config');
      // Waiting for the first config, it holds none after it: a writer taking them in order gets them at once.
      const other = await testDb().transaction();
      try {
        await other.raw('set local lock_timeout = 1000');
        assert.equal((await other('push_configs').whereIn('task_id', ids.slice(1)).orderBy(['task_id', 'id']).forUpdate()).length, ids.length - 1);
      } finally {
        await other.rollback();
      }
      await holder.rollback();
      assert.equal((await status).length, ids.length);
    } finally {
      await holder.rollback().catch(() => undefined);
    }
  });

  it('retries a receiver that fails twice until it gets the update', async () => {
    const rx = await startReceiver((_r, all) => (all.length <= 2 ? 500 : 200));
    receivers.push(rx);
    const id = await idleTask();
    await setConfig(id, { url: rx.url, token: 'tok-retry' });
    await setStatus(id, 'working');
    await setStatus(id, 'completed');
    await waitFor(async () => states(rx.all, id).includes('completed'), 'the completed notification');
    // The first update was tried three times before it got through; the second only then.
    assert.deepEqual(states(rx.all, id), ['working', 'working', 'working', 'completed']);
    // Each failed post is logged at warn with the ids, the cause and when it is tried again
    // (PUSH_BACKOFF_MS=100, doubled each time); no job attempt is spent on the webhook's failures.
    const failed = stack.workers[0].logs.filter((l) => l.includes('push notification post failed') && l.includes(id)).map((l) => JSON.parse(l));
    assert.deepEqual(failed.map((l) => [l.level, l.task_id, typeof l.config_id, l.status, l.attempt, l.attempts, l.retry_in_ms]),
      [[40, id, 'string', 500, 1, 4, 100], [40, id, 'string', 500, 2, 4, 200]]);
    for (const l of failed) assert.match(l.reason, /HTTP 500/);
    assert.ok(!stack.workers[0].logs.some((l) => l.includes('job attempt failed') && l.includes(id)));
  });


  it('retries a webhook that answers 101 (an upgrade) instead of hanging its delivery run for good', async () => {
    // Speaks raw HTTP: the first post is answered 101 Switching Protocols, the next ones 200.
    const posts: string[] = [];
    const server = net.createServer((socket) => {
      let raw = '';
      socket.on('data', (chunk) => {
        raw += chunk;
        const head = raw.indexOf('\r\n\r\n');
        const length = Number(/content-length: (\d+)/i.exec(raw)?.[1]);
        if (head < 0 || Buffer.byteLength(raw.slice(head + 4)) < length) return;
        posts.push(JSON.parse(raw.slice(head + 4)).status.state);
        raw = '';
        socket.write(posts.length === 1
          ? 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
          : 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    receivers.push({ close: () => new Promise<void>((resolve) => server.close(() => resolve())) });
    const id = await idleTask();
    await setConfig(id, { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook` });
    await setStatus(id, 'working');
    // Before: the post never settled (Node drops an unheard upgrade's socket without an error), so the
    // run held its slot for ever and the update waited for another job after the lease ran out.
    await waitFor(async () => posts.length >= 2, 'the update posted again', 8000);
    await setStatus(id, 'completed');
    await waitFor(async () => posts.includes('completed'), 'the next update');
    assert.deepEqual(posts, ['working', 'working', 'completed']);
    const failed = stack.workers[0].logs.filter((l) => l.includes('push notification post failed') && l.includes(id)).map((l) => JSON.parse(l));
    assert.deepEqual(failed.map((l) => [l.status, l.reason]), [[101, 'webhook answered HTTP 101']]);
  });
  it('logs a delivery job that fails for good for a fault of ours at error, with its stack, once', async () => {
    // A config whose stored token cannot be decrypted: every run fails on our side, before posting.
    const jobId = `broken-${randomUUID()}`;
    const taskId = await idleTask();
    await setConfig(taskId, { id: 'undecryptable', url: 'http://127.0.0.1:9/hook', token: 'tok-undecryptable' });
    await spoilSecrets(taskId);
    // The update's own job (from the outbox) fails too, as a job of its own.
    await setStatus(taskId, 'working');
    const [{ seq }] = await testDb()('timeline_items').where({ task_id: taskId }).max({ seq: 'seq' });
    await withQueue(stack.env, 'push-notifications', (q) => q.add('deliver', { task_id: taskId, config_id: 'undecryptable', timeline_seq: Number(seq) }, { jobId, attempts: 2 }));
    const line = await waitFor(async () => stack.workers[0].logs.find((l) => l.includes('job failed for good') && l.includes(jobId)), 'the failed-for-good log line');
    const parsed = JSON.parse(line);
    assert.deepEqual([parsed.level, parsed.queue, parsed.task_id, parsed.attempt, parsed.attempts], [50, 'push-notifications', taskId, 2, 2]);
    assert.equal(parsed.err.type, 'DecryptError');
    assert.match(parsed.err.stack, /\n\s+at /);
    assert.equal(stack.workers[0].logs.filter((l) => l.includes(jobId) && l.includes('"level":50')).length, 1);
  });

  it('posts each update PUSH_ATTEMPTS times at most, gives up one that keeps failing, and gives the later ones their own attempts', async () => {
    // The working update always fails; the failed update fails its first three posts.
    let failedPosts = 0;
    const rx = await startReceiver((r) => (r.body.status.state === 'working' || ++failedPosts <= 3 ? 503 : 200));
    receivers.push(rx);
    const id = await idleTask();
    await setPushConfig(testDb(), id, { url: rx.url }, allowPrivate);
    await setStatus(id, 'working');
    await setStatus(id, 'failed', 'broken');
    await waitFor(async () => failedPosts === 4, 'the failed notification', 30000);
    // PUSH_ATTEMPTS=4 posts of each update, whichever update's job made them (the later update's
    // job posting the earlier one counts there), in order: nothing overtook the working update.
    await sleep(300);
    assert.deepEqual(states(rx.all, id), [...Array(4).fill('working'), ...Array(4).fill('failed')]);
    await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('push notification given up') && l.includes(id)), 'the give-up log line');
    const gaveUp = stack.workers[0].logs.filter((l) => l.includes('push notification given up') && l.includes(id)).map((l) => JSON.parse(l));
    assert.deepEqual(gaveUp.map((l) => l.status), [503]);
  });

  it('gives up at once an update the webhook refuses with a 4xx retrying cannot change, then delivers the later ones', async () => {
    const rx = await startReceiver((r) => (r.body.status.state === 'working' ? 404 : 200));
    receivers.push(rx);
    const id = await idleTask();
    await setPushConfig(testDb(), id, { url: rx.url }, allowPrivate);
    await setStatus(id, 'working');
    await setStatus(id, 'completed');
    await waitFor(async () => states(rx.all, id).includes('completed'), 'the completed notification');
    assert.deepEqual(states(rx.all, id), ['working', 'completed'], 'the refused update was posted once, not PUSH_ATTEMPTS times');
    const gaveUp = stack.workers[0].logs.filter((l) => l.includes('push notification given up') && l.includes(id)).map((l) => JSON.parse(l));
    assert.deepEqual(gaveUp.map((l) => [l.level, l.status]), [[40, 404]]);
    assert.ok(!stack.workers[0].logs.some((l) => l.includes('job attempt failed') && l.includes(id)), 'no attempt was spent on a retry');
  });

  it('gives up at once an update the webhook answers with a redirect (not followed), saying so without the token', async () => {
    const rx = await startReceiver(() => ({ status: 301, headers: { location: 'http://127.0.0.1:9/moved?sig=location-secret' } }));
    receivers.push(rx);
    const id = await idleTask();
    await setConfig(id, { url: rx.url, token: 'redirected-token-secret' });
    await setStatus(id, 'working');
    await setStatus(id, 'completed');
    const gaveUp = await waitFor(async () => {
      const lines = stack.workers[0].logs.filter((l) => l.includes('push notification given up') && l.includes(id));
      return lines.length === 2 ? lines.map((l) => JSON.parse(l)) : undefined;
    }, 'both updates given up');
    assert.deepEqual(states(rx.all, id), ['working', 'completed'], 'each update posted once, not PUSH_ATTEMPTS times');
    for (const l of gaveUp) {
      assert.equal(l.status, 301);
      assert.equal(l.reason, "webhook answered HTTP 301: redirects are not followed; set the push config's url to the final address");
    }
    assert.ok(!stack.workers[0].logs.some((l) => l.includes('redirected-token-secret') || l.includes('location-secret')), 'no token or Location in the logs');
  });

  it("waits at least a 429's Retry-After before posting to that webhook again, the later updates included", async () => {
    const rx = await startReceiver((_r, all) => (all.length === 1 ? { status: 429, headers: { 'retry-after': '2' } } : 200));
    receivers.push(rx);
    const id = await idleTask();
    await setPushConfig(testDb(), id, { url: rx.url }, allowPrivate);
    await setStatus(id, 'working');
    await waitFor(async () => rx.all.length === 1, 'the first post');
    await setStatus(id, 'completed');
    await waitFor(async () => states(rx.all, id).includes('completed'), 'the completed notification');
    assert.deepEqual(states(rx.all, id), ['working', 'working', 'completed']);
    // A lower bound only: how much later it came depends on the machine.
    for (const later of rx.all.slice(1)) assert.ok(later.at - rx.all[0].at >= 2000, `posted ${later.at - rx.all[0].at} ms after the 429`);
    // The wait for the hold spent no attempt: only the 429 did, held for its Retry-After.
    const failed = stack.workers[0].logs.filter((l) => l.includes('push notification post failed') && l.includes(id)).map((l) => JSON.parse(l));
    assert.deepEqual(failed.map((l) => [l.status, l.attempt, l.retry_in_ms]), [[429, 1, 2000]]);
    assert.match(failed[0].reason, /HTTP 429 \(retry after 2000 ms\)/);
  });

  it('lets a webhook origin seen slow hold at most PUSH_CONCURRENCY_PER_HOST delivery slots, so another origin still gets its updates', async () => {
    // The first post is answered after more than half PUSH_TIMEOUT_MS (10 s here): the origin is slow
    // from then on. Every later post is held unanswered until the test lets go; the ones the worker
    // gave up on (timed out) are counted.
    const held: http.ServerResponse[] = [];
    let posts = 0;
    let aborted = 0;
    let letGo = false;
    const hang = http.createServer((req, res) => {
      req.resume();
      posts += 1;
      if (posts === 1) return void setTimeout(() => res.writeHead(200).end(), 5500);
      if (letGo) return void res.writeHead(200).end();
      held.push(res);
      res.on('close', () => { if (!res.writableEnded) aborted += 1; });
    });
    await new Promise<void>((resolve) => hang.listen(0, '127.0.0.1', resolve));
    const other = await startReceiver();
    receivers.push(other);
    try {
      const hangUrl = `http://127.0.0.1:${(hang.address() as AddressInfo).port}/hook`;
      const seed = await idleTask();
      await setPushConfig(testDb(), seed, { url: hangUrl }, allowPrivate);
      const before = (await testDb()('push_configs').where({ task_id: seed }).first()).delivered_seq;
      await setStatus(seed, 'working');
      // Recorded once the slow post has been answered, so after the worker noted it.
      await waitFor(async () => (await testDb()('push_configs').where({ task_id: seed }).first()).delivered_seq > before, 'the slow first post recorded');
      // As many deliveries to the slow origin as the worker has slots (PUSH_CONCURRENCY, 10).
      for (let i = 0; i < 10; i++) {
        const id = await idleTask();
        await setPushConfig(testDb(), id, { url: hangUrl }, allowPrivate);
        await setStatus(id, 'working');
      }
      await waitFor(async () => held.length >= 5, 'posts held by the hanging webhook');
      const id = await idleTask();
      await setPushConfig(testDb(), id, { url: other.url }, allowPrivate);
      await setStatus(id, 'working');
      await waitFor(async () => states(other.all, id).includes('working'), 'the update at the other origin');
      assert.equal(aborted, 0, 'the other origin waited for a post to the hanging one to time out');
      assert.equal(held.length, 5, 'posts in flight to the slow origin (PUSH_CONCURRENCY_PER_HOST)');
    } finally {
      letGo = true;
      for (const res of held) res.writeHead(200).end();
      hang.closeAllConnections();
      await new Promise<void>((resolve) => hang.close(() => resolve()));
    }
  });

  it('lets a webhook origin that answers promptly use every delivery slot, more than PUSH_CONCURRENCY_PER_HOST', async () => {
    // Holds each answer until `n` posts are open at once (a post the worker gave up on no longer
    // counts), then answers them all.
    const n = 8; // over PUSH_CONCURRENCY_PER_HOST (5), within PUSH_CONCURRENCY (10)
    const open = new Set<http.ServerResponse>();
    let reached = false;
    const rx = http.createServer((req, res) => {
      req.resume();
      if (reached) return void res.writeHead(200).end();
      open.add(res);
      res.on('close', () => open.delete(res));
      if (open.size < n) return;
      reached = true;
      for (const r of open) r.writeHead(200).end();
    });
    await new Promise<void>((resolve) => rx.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(rx.address() as AddressInfo).port}/hook`;
      for (let i = 0; i < n; i++) {
        const id = await idleTask();
        await setPushConfig(testDb(), id, { url }, allowPrivate);
        await setStatus(id, 'working');
      }
      await waitFor(async () => reached, `${n} posts in flight at once`);
    } finally {
      for (const r of open) if (!r.writableEnded) r.writeHead(200).end();
      rx.closeAllConnections();
      await new Promise<void>((resolve) => rx.close(() => resolve()));
    }
  });

  it('sends authentication credentials and never shows, stores in clear or logs the token', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const id = await idleTask();
    const token = 'secret-token-5f1c2e9a';
    const credentials = 'secret-credential-77aa';
    const set = await setConfig(id, { id: 'mine', url: rx.url, token, authentication: { schemes: ['Bearer'], credentials } });
    assert.deepEqual(set, { taskId: id, pushNotificationConfig: { id: 'mine', url: rx.url, authentication: { schemes: ['Bearer'] } } });
    const got = await getPushConfig(testDb(), id, 'mine');
    const first = await getPushConfig(testDb(), id);
    const list = await listPushConfigs(testDb(), id);
    for (const shown of [set, got, first, list]) {
      const json = JSON.stringify(shown);
      assert.ok(!json.includes(token) && !json.includes(credentials), `token or credentials shown: ${json}`);
    }
    assert.equal(list.length, 1);
    const stored = JSON.stringify(await testDb()('push_configs').where({ task_id: id }));
    assert.ok(!stored.includes(token) && !stored.includes(credentials), `stored in clear: ${stored}`);
    await setStatus(id, 'working');
    await waitFor(async () => rx.all.some((r) => r.body.id === id), 'a notification');
    const r = rx.all.find((x) => x.body.id === id)!;
    assert.equal(r.token, token);
    assert.equal(r.authorization, `Bearer ${credentials}`);
    const logs = [...stack.api.logs, ...stack.workers.flatMap((w) => w.logs)].join('\n');
    assert.ok(!logs.includes(token) && !logs.includes(credentials), 'a token or credential reached the logs');
  });

  it('takes an empty token or credentials as none (A2A clients send "" for none), inline and by set', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const id = await idleTask();
    await setConfig(id, { id: 'empty', url: rx.url, token: '', authentication: { schemes: ['Bearer'], credentials: '' } });
    await setStatus(id, 'working');
    await waitFor(async () => rx.all.some((r) => r.body.id === id), 'a notification');
    const r = rx.all.find((x) => x.body.id === id)!;
    assert.deepEqual([r.token, r.authorization], [undefined, undefined]);
    const sent = await rpc('message/send', {
      message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text: 'hello' }] },
      configuration: { blocking: false, pushNotificationConfig: { url: rx.url, token: '' } },
    });
    assert.equal(sent.error, undefined, JSON.stringify(sent.error));
    assert.equal(sent.result.kind, 'task');
  });

  it('replaces a config with the same id, and deletes configs', async () => {
    const id = await idleTask();
    await setPushConfig(testDb(), id, { id: 'a', url: 'http://127.0.0.1:9/one' }, allowPrivate);
    await setPushConfig(testDb(), id, { id: 'a', url: 'http://127.0.0.1:9/two' }, allowPrivate);
    await setPushConfig(testDb(), id, { url: 'http://127.0.0.1:9/three' }, allowPrivate);
    const list = await listPushConfigs(testDb(), id);
    assert.equal(list.length, 2);
    assert.equal(list.find((c) => c.id === 'a')!.url, 'http://127.0.0.1:9/two');
    await deletePushConfig(testDb(), id, 'a');
    assert.equal((await listPushConfigs(testDb(), id)).length, 1);
    const gone = await rejection(() => deletePushConfig(testDb(), id, 'a'));
    assert.equal(gone.status, 404);
    assert.equal((await rejection(() => getPushConfig(testDb(), id, 'a'))).status, 404);
  });

  it('keeps at most MAX_CONFIGS_PER_TASK configs per task; one of them can still be set again', async () => {
    const id = await idleTask();
    for (let i = 0; i < MAX_CONFIGS_PER_TASK; i++) await setPushConfig(testDb(), id, { id: `c${i}`, url: 'http://127.0.0.1:9/hook' }, allowPrivate);
    const over = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { id: 'one-more', url: 'http://127.0.0.1:9/hook' } });
    assert.equal(over.error?.code, -32602, JSON.stringify(over));
    assert.match(over.error.message, new RegExp(`at most ${MAX_CONFIGS_PER_TASK} push notification configs`));
    assert.equal((await listPushConfigs(testDb(), id)).length, MAX_CONFIGS_PER_TASK);
    await setConfig(id, { id: 'c0', url: 'http://127.0.0.1:9/replaced' });
    await deletePushConfig(testDb(), id, 'c1');
    await setConfig(id, { id: 'one-more', url: 'http://127.0.0.1:9/hook' });
    assert.equal((await listPushConfigs(testDb(), id)).length, MAX_CONFIGS_PER_TASK);
  });

  it('takes at most 32 authentication schemes per config (-32602), so that its task lists in a bounded answer', async () => {
    const id = await idleTask();
    const set = (n: number) => rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { id: `s${n}`, url: 'http://127.0.0.1:9/', authentication: { schemes: new Array(n).fill('Bearer') } } });
    // Before: any number was stored and shown (15,000 fit a 1 MiB request; a task's 100 configs listed as 100 MB).
    const over = await set(33);
    assert.equal(over.error?.code, -32602, JSON.stringify(over).slice(0, 300));
    assert.match(over.error.message, /authentication\.schemes must be a list of 1 to 32 HTTP auth scheme names/);
    assert.equal((await set(32)).result.pushNotificationConfig.authentication.schemes.length, 32);
    assert.deepEqual((await rpc('tasks/pushNotificationConfig/list', { id })).result.map((c: any) => c.pushNotificationConfig.id), ['s32']);
  });

  it('counts a config id in characters as the request schema does: 256 emoji are an id, 257 are -32602', async () => {
    const id = await idleTask();
    const set = (configId: string) => rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { id: configId, url: 'http://127.0.0.1:9/' } });
    const longest = '\u{1F600}'.repeat(256);
    // Before: refused as over 256 characters (512 UTF-16 units), though the schema had taken it.
    const kept = await set(longest);
    assert.equal(kept.result?.pushNotificationConfig.id, longest, JSON.stringify(kept).slice(0, 300));
    assert.equal((await rpc('tasks/pushNotificationConfig/get', { id, pushNotificationConfigId: longest })).result.pushNotificationConfig.id, longest);
    const over = await set(`${longest}\u{1F600}`);
    assert.equal(over.error?.code, -32602, JSON.stringify(over).slice(0, 300));
    assert.deepEqual((await listPushConfigs(testDb(), id)).map((c) => c.id), [longest]);
  });

  it('answers 404 for configs of an unknown task', async () => {
    const unknown = '00000000-0000-4000-8000-000000000000';
    for (const call of [
      () => setPushConfig(testDb(), unknown, { url: 'http://127.0.0.1:9/' }, allowPrivate),
      () => getPushConfig(testDb(), unknown),
      () => listPushConfigs(testDb(), unknown),
      () => deletePushConfig(testDb(), unknown, 'x'),
    ]) {
      const r = await rejection(call);
      assert.equal(r.status, 404);
      assert.match(r.message, /task '00000000-0000-4000-8000-000000000000' not found/);
    }
  });

  it('refuses internal addresses again when connecting, unless allowed', async () => {
    const rx = await startReceiver();
    receivers.push(rx);
    const opts = { allowPrivate: false, timeoutMs: 5000 };
    const port = new URL(rx.url).port;
    await assert.rejects(postNotification(rx.url, { kind: 'task' }, {}, opts), /webhook address 127\.0\.0\.1 is internal/);
    // A name is checked by the connection's own DNS lookup (a later re-resolution cannot slip past).
    await assert.rejects(postNotification(`http://localhost:${port}/hook`, { kind: 'task' }, {}, opts), /resolves to an internal address/);
    assert.equal(rx.all.length, 0);
    assert.equal(await postNotification(`http://localhost:${port}/hook`, { kind: 'task' }, {}, { ...opts, allowPrivate: true }), 200);
    assert.equal(rx.all.length, 1);
  });

  it('leases a config to one delivery run at a time; a run whose lease ran out records nothing more', async () => {
    const id = await idleTask();
    await setConfig(id, { id: 'leased', url: 'http://127.0.0.1:9/x' });
    const db = testDb();
    const base = (await db('push_configs').where({ task_id: id, id: 'leased' }).first()).delivered_seq;
    assert.ok(await leasePushConfig(db, id, 'leased', 'a0000000-0000-4000-8000-000000000001', 60_000));
    assert.equal(await leasePushConfig(db, id, 'leased', 'a0000000-0000-4000-8000-000000000002', 60_000), undefined, 'held by the first run');
    assert.ok(await setDeliveredSeq(db, id, 'leased', base + 1, 'a0000000-0000-4000-8000-000000000001', 60_000));
    // The first run's lease runs out; a second run takes the config, and the first can no longer record.
    await db('push_configs').where({ task_id: id, id: 'leased' }).update({ lease_until: db.raw(`now() - interval '1 second'`) });
    assert.ok(await leasePushConfig(db, id, 'leased', 'a0000000-0000-4000-8000-000000000002', 60_000));
    assert.equal(await setDeliveredSeq(db, id, 'leased', base + 2, 'a0000000-0000-4000-8000-000000000001', 60_000), undefined);
    assert.equal((await db('push_configs').where({ task_id: id, id: 'leased' }).first()).delivered_seq, base + 1);
    await releasePushConfig(db, id, 'leased', 'a0000000-0000-4000-8000-000000000001');
    assert.equal((await db('push_configs').where({ task_id: id, id: 'leased' }).first()).lease_id, 'a0000000-0000-4000-8000-000000000002', "a lost lease's release leaves the new one");
  });

  it('gives up a post after PUSH_TIMEOUT_MS in all, even on a webhook that trickles its answer', async () => {
    // Answers a byte of its headers every 200 ms, for ever: never idle long enough for a socket timeout.
    const sockets = new Set<net.Socket>();
    const server = net.createServer((socket) => {
      sockets.add(socket);
      socket.once('data', () => {
        socket.write('HTTP/1.1 200 OK\r\nX-Slow: ');
        const drip = setInterval(() => socket.write('a'), 200);
        socket.on('close', () => clearInterval(drip));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
      const post = postNotification(url, { kind: 'task' }, {}, { allowPrivate: true, timeoutMs: 1000 });
      const outcome = await Promise.race([post.then(() => 'answered', (e: Error) => e.message), new Promise((resolve) => setTimeout(() => resolve('still waiting'), 8000))]);
      assert.match(String(outcome), /no answer within 1000 ms/);
    } finally {
      for (const s of sockets) s.destroy();
      server.close();
    }
  });

  it('rejects bad webhook URLs with specific messages and stores nothing', async () => {
    const id = await idleTask();
    const cases: [string, RegExp][] = [
      ['not a url', /is not an absolute URL/],
      ['ftp://example.com/hook', /must use http or https, not 'ftp'/],
      ['file:///etc/passwd', /must use http or https, not 'file'/],
      ['http://user:pw@example.com/hook', /must not contain credentials/],
      // Node would post to port 80 (a receiver the client never named got every update, token and all).
      ['http://93.184.216.34:0/hook', /must not name port 0/],
      ['https://example.com:00/hook', /must not name port 0/],
      ['http://127.0.0.1:8080/hook', /resolves to a private, loopback or link-local address \(127\.0\.0\.1\)/],
      ['http://10.1.2.3/hook', /private, loopback or link-local address \(10\.1\.2\.3\)/],
      ['http://192.168.0.10/hook', /private/],
      ['http://169.254.169.254/latest/meta-data', /link-local address \(169\.254\.169\.254\)/],
      ['http://[::1]:8080/hook', /\(::1\)/],
      ['http://203.0.113.7/hook', /\(203\.0\.113\.7\)/],
      ['http://198.51.100.1/hook', /\(198\.51\.100\.1\)/],
      ['http://192.0.2.10/hook', /\(192\.0\.2\.10\)/],
      ['http://[2001:db8::1]/hook', /\(2001:db8::1\)/],
      ['http://[2001:0:4136:e378::1]/hook', /\(2001:0:4136:e378::1\)/],
      ['http://[::ffff:127.0.0.1]/hook', /private, loopback/],
      ['http://[::ffff:0:127.0.0.1]/hook', /private, loopback/],
      ['http://[::127.0.0.1]/hook', /private, loopback/],
      ['http://[2002:7f00:1::]/hook', /private, loopback/],
      ['http://[64:ff9b:1::a00:1]/hook', /private, loopback/],
      ['http://localhost:8080/hook', /host 'localhost' resolves to a private/],
      ['http://no-such-host.invalid/hook', /cannot be resolved/],
      // A name no resolver takes (over 255 characters): no retry makes it resolve.
      [`http://x.${'a'.repeat(300)}.com/hook`, /cannot be resolved \(EINVAL\)/],
    ];
    for (const [url, message] of cases) {
      const r = await rejection(() => setPushConfig(testDb(), id, { url }, denyPrivate));
      assert.equal(r.status, 400, url);
      assert.match(r.message, message, url);
    }
    // What a name resolves to inside is not told to the caller.
    assert.doesNotMatch((await rejection(() => setPushConfig(testDb(), id, { url: 'http://localhost:8080/hook' }, denyPrivate))).message, /127\.0\.0\.1|::1/);
    for (const input of [{ url: 'http://127.0.0.1/', id: '' }, { url: 'http://127.0.0.1/', authentication: { schemes: [] } }, { url: 'http://127.0.0.1/', authentication: { schemes: ['Bearer'], credentials: 'a\r\nX-Evil: 1' } },
      { url: 'http://127.0.0.1/', token: 'tok\u0001' }, { url: 'http://127.0.0.1/', token: 'tok\u{1F4A5}' }, { url: 'http://127.0.0.1/', authentication: { schemes: ['Bearer'], credentials: 'a\u0007b' } }]) {
      assert.equal((await rejection(() => setPushConfig(testDb(), id, input, allowPrivate))).status, 400);
    }
    // A space at either end would not reach the receiver (HTTP drops it from the header): " " was sent as an empty token.
    for (const token of [' ', ' tok', 'tok ']) {
      assert.match((await rejection(() => setPushConfig(testDb(), id, { url: 'http://127.0.0.1/', token }, allowPrivate))).message, /^Push notification token must be .* with no space at either end/, JSON.stringify(token));
    }
    assert.match((await rejection(() => setPushConfig(testDb(), id, { url: 'http://127.0.0.1/', authentication: { schemes: ['Bearer'], credentials: ' a ' } }, allowPrivate))).message, /credentials must be printable ASCII characters, with no space at either end/);
    assert.deepEqual(await listPushConfigs(testDb(), id), []);
    // Private targets pass when the configuration allows them.
    const ok = await setPushConfig(testDb(), id, { url: 'http://127.0.0.1:8080/hook' }, allowPrivate);
    assert.equal(ok.url, 'http://127.0.0.1:8080/hook');
  });

  it('answers 503 (retry) when the lookup of the host failed for now, not 400: the URL may be good', async () => {
    const id = await idleTask();
    // The machine's resolver answers every name here (ENOTFOUND for what does not exist), so a
    // resolver that timed out is played by the lookup itself, as getaddrinfo reports it.
    const lookup = dns.promises.lookup;
    dns.promises.lookup = (async (host: string) => {
      if (host === 'hooks.example.com') throw Object.assign(new Error(`getaddrinfo EAI_AGAIN ${host}`), { code: 'EAI_AGAIN', hostname: host });
      return lookup(host, { all: true });
    }) as unknown as typeof lookup;
    try {
      const r = await rejection(() => setPushConfig(testDb(), id, { url: 'https://hooks.example.com/a2a' }, denyPrivate));
      assert.equal(r.status, 503);
      assert.equal(r.code, 'unavailable');
      assert.equal(r.message, "Push notification URL host 'hooks.example.com' could not be looked up just now (EAI_AGAIN); retry shortly");
      assert.equal((await rejection(() => setPushConfig(testDb(), id, { url: 'http://no-such-host.invalid/hook' }, denyPrivate))).status, 400);
    } finally {
      dns.promises.lookup = lookup;
    }
    assert.deepEqual(await listPushConfigs(testDb(), id), []);
  });

  it('refuses a host that does not exist with PUSH_ALLOW_PRIVATE on too (it allows internal hosts, not missing ones)', async () => {
    const id = await idleTask();
    const set = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url: 'http://no-such-host.invalid/hook' } });
    assert.equal(set.error?.code, -32602, JSON.stringify(set));
    assert.equal(set.error.message, "Push notification URL host 'no-such-host.invalid' cannot be resolved (ENOTFOUND)");
    const sent = await rpc('message/send', { message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text: 'hi' }] }, configuration: { blocking: false, pushNotificationConfig: { url: 'http://no-such-host.invalid/hook' } } });
    assert.equal(sent.error?.code, -32602, JSON.stringify(sent));
    assert.deepEqual(await listPushConfigs(testDb(), id), []);
  });

  it('says an absolute URL that does not parse (a port past 65535, a space in the host) is not a valid URL, not that it is not absolute', async () => {
    const id = await idleTask();
    for (const url of ['http://127.0.0.1:99999/hook', 'http://exa mple.com/hook']) {
      const set = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url } });
      assert.equal(set.error?.code, -32602, JSON.stringify(set));
      assert.equal(set.error.message, `Push notification URL '${url}' is not a valid URL`);
    }
    // One with user info is not quoted (before: it was, password and all).
    for (const [url, kind] of [['http://hook-user:hook-secret-1@exa mple.com/hook', 'a valid'], ['//hook-user:hook-secret-2@example.com/hook', 'an absolute']]) {
      const set = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url } });
      assert.equal(set.error?.message, `Push notification URL is not ${kind} URL (not quoted: it holds an '@', which may follow credentials)`);
      assert.ok(!JSON.stringify(set).includes('hook-secret'), JSON.stringify(set));
    }
    const relative = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url: '/hook' } });
    assert.equal(relative.error?.message, "Push notification URL '/hook' is not an absolute URL");
    // Quoted as every error quotes what a client sent (echoed): control characters escaped, a long one by its start and its length.
    const long = `http://exa mple.com/${'p'.repeat(300)}`;
    for (const [url, shown] of [['http://exa\u0001mple.com/hook', 'http://exa\\u0001mple.com/hook'], [long, `${long.slice(0, 60)}… (${long.length} characters)`]]) {
      const set = await rpc('tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url } });
      assert.equal(set.error?.message, `Push notification URL '${shown}' is not a valid URL`);
    }
    assert.deepEqual(await listPushConfigs(testDb(), id), []);
  });
});

// Sets the add time (ARGV[2]) of every job in a failed set (KEYS[1]) under a queue's key prefix
// (ARGV[1]), at once; returns how many.
const AGE_FAILED_JOBS = `local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do redis.call('HSET', ARGV[1] .. id, 'timestamp', ARGV[2]) end
return #ids`;
// One sample's value in a /metrics answer (its name and labels as written there); NaN when absent.
const metric = (text: string, series: string) => Number(text.split('\n').find((l) => l.startsWith(`${series} `))?.slice(series.length + 1));

describe('push notifications to a config stored with an internal address, the worker allowing none', () => {
  const stack = useStack({ PUSH_ALLOW_PRIVATE: 'false', PUSH_ATTEMPTS: '4', PUSH_BACKOFF_MS: '100' });

  // Stored while PUSH_ALLOW_PRIVATE was on (or by an older release): written as an internal address,
  // no retry can pass, and each update was posted PUSH_ATTEMPTS times with backoff before it was given up.
  it('gives up each update at once, posting nothing, and says why', async () => {
    const rx = await startReceiver();
    try {
      const created = await stack.client.post('/api/task/v1', { message: textMessage('driven by the test', 'agent') });
      const id = created.body.task.id as string;
      await setPushConfig(testDb(), id, { url: rx.url }, { ...loadConfig(stack.env), PUSH_ALLOW_PRIVATE: true });
      for (const status of ['working', 'completed']) assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status })).status, 200);
      const lines = (what: string) => stack.workers[0].logs.filter((l) => l.includes(what) && l.includes(id)).map((l) => JSON.parse(l));
      await waitFor(async () => lines('push notification given up').length === 2, 'both updates given up');
      assert.deepEqual(lines('push notification post failed'), [], 'retried');
      assert.match(lines('push notification given up')[0].reason, /webhook address 127\.0\.0\.1 is internal and PUSH_ALLOW_PRIVATE is off/);
      assert.equal(rx.all.length, 0);
    } finally {
      await rx.close();
    }
  });
});

describe('push notifications whose queue jobs were lost or failed', function () {
  this.timeout(60_000);
  // A job retries for at most PUSH_ATTEMPTS x PUSH_TIMEOUT_MS plus backoff: 1 s here.
  const stack = useStack({ PUSH_ALLOW_PRIVATE: 'true', PUSH_ATTEMPTS: '1', PUSH_TIMEOUT_MS: '1000', JOB_RECOVERY_MS: '1000' });
  const workerLogged = (line: string) => stack.workers.some((w) => w.logs.some((l) => l.includes(line)));
  // A task run to completed with a push config while the delivery queue is paused: its three jobs wait.
  const sendWhilePaused = async (queue: Queue, url: string, text: string, token: string): Promise<string> => {
    await queue.pause();
    const sent = await stack.client.post('/api/a2a/v1', {
      jsonrpc: '2.0', id: 1, method: 'message/send',
      params: { message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text }] }, configuration: { blocking: true, pushNotificationConfig: { url, token } } },
    });
    assert.equal(sent.body.result.status.state, 'completed');
    await waitFor(async () => (await queue.getJobCounts('wait')).wait >= 3, 'the three delivery jobs', 10_000, 50);
    return sent.body.result.id;
  };
  const allArrive = async (rx: Awaited<ReturnType<typeof startReceiver>>, id: string, token: string) => {
    await waitFor(async () => rx.all.some((r) => r.body.status.state === 'completed'), 'the completed notification', 20_000, 100);
    assert.deepEqual(rx.all.filter((r) => r.body.id === id).map((r) => r.body.status.state), ['submitted', 'working', 'completed']);
    assert.ok(rx.all.every((r) => r.token === token));
  };

  it('are enqueued again by the workers, and every update still arrives, in order', async () => {
    const rx = await startReceiver();
    try {
      await withQueue(stack.env, 'push-notifications', async (queue) => {
        // Nothing is delivered while the queue is paused; then every job of it is lost.
        const id = await sendWhilePaused(queue, rx.url, 'lost jobs', 'tok-lost');
        await waitFor(async () => Number((await testDb()('outbox').count({ n: '*' }))[0].n) === 0, 'the outbox relayed', 10_000, 50);
        await queue.obliterate({ force: true });
        await queue.resume();
        await allArrive(rx, id, 'tok-lost');
        // Logged as the job is added: the line may reach us after the delivery that job made.
        await waitFor(async () => workerLogged('push delivery had no queue job: enqueued again'), 'the recovery log line', 5_000);
      });
    } finally {
      await rx.close();
    }
  });

  it('reads only configs with updates undelivered: many ended tasks whose updates were all delivered cost the pass nothing', async function () {
    this.timeout(120_000);
    // Configs of ended tasks are kept for ever by default (TASK_RETENTION_DAYS=0): 20,000 here, each
    // task's one status update delivered.
    const db = testDb();
    const seeded = 20_000;
    await db.raw(`
      with c as (insert into contexts (id, created_at) select gen_random_uuid(), now() - interval '10 days' from generate_series(1, ?) returning id, created_at),
           t as (insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at, message_bytes, artifact_bytes)
                 select gen_random_uuid(), c.id, 'completed', now() - interval '9 days', '{"seeded": "push-recovery"}', c.created_at, c.created_at, 0, 0 from c
                 returning id, status_timestamp)
      insert into timeline_items (id, task_id, event_payload, created_at, weight)
      select gen_random_uuid(), t.id, '{"type": "task-status-update", "status": "completed"}', t.status_timestamp, 100 from t`, [seeded]);
    await db.raw(`
      insert into push_configs (task_id, id, url, delivered_seq, created_at, updated_at)
      select t.id, t.id::text, 'https://hooks.example.com/a2a', i.seq, t.created_at, t.created_at
        from tasks t join timeline_items i on i.task_id = t.id where t.metadata @> '{"seeded": "push-recovery"}'`);
    await db.raw('analyze push_configs, timeline_items');
    const rx = await startReceiver();
    try {
      // A delivery whose jobs were lost among them is still found.
      await withQueue(stack.env, 'push-notifications', async (queue) => {
        const id = await sendWhilePaused(queue, rx.url, 'lost among many', 'tok-many');
        await waitFor(async () => Number((await testDb()('outbox').count({ n: '*' }))[0].n) === 0, 'the outbox relayed', 10_000, 50);
        await queue.obliterate({ force: true });
        await queue.resume();
        await allArrive(rx, id, 'tok-many');
      });
      // The rows one pass reads, as Postgres counts them for its connection (what it has not yet
      // added to pg_stat_user_tables; nothing is added during a transaction): before, all 20,000
      // configs (and a timeline probe for each), however few were stalled.
      const read = await db.transaction(async (trx) => {
        const counts = async () => {
          const { rows } = await trx.raw(`select relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) as n from pg_stat_xact_user_tables
                                           where relname in ('push_configs', 'timeline_items')`);
          return Object.fromEntries((rows as { relname: string; n: string }[]).map((r) => [r.relname, Number(r.n)]));
        };
        const before = await counts();
        await listStalledDeliveries(trx, 0, 500);
        const after = await counts();
        return { push_configs: after.push_configs - before.push_configs, timeline_items: after.timeline_items - before.timeline_items };
      });
      assert.ok(read.push_configs <= 100 && read.timeline_items <= 100, `rows read by the pass: ${JSON.stringify(read)}`);
    } finally {
      await rx.close();
      await db.raw(`with t as (delete from tasks where metadata @> '{"seeded": "push-recovery"}' returning context_id)
                    delete from contexts where id in (select context_id from t)`);
    }
  });

  it('adds again, as a new job, a recovery job that failed for good, and every update arrives once the fault is gone', async () => {
    const rx = await startReceiver();
    try {
      await withQueue(stack.env, 'push-notifications', async (queue) => {
        const id = await sendWhilePaused(queue, rx.url, 'a fault of ours', 'tok-fault');
        // The token cannot be decrypted: every delivery fails on our side, before posting, on its only attempt.
        const sealed = await spoilSecrets(id);
        await queue.resume();
        await waitFor(async () => workerLogged('push delivery had no queue job: enqueued again') && (await queue.getJobCounts('failed')).failed >= 4,
          'the three jobs and the recovery job failed', 20_000, 100);
        // All four added three hours ago, as far as BullMQ knows (a fixture: waiting that long is not a
        // test), set while all are failed at once: the passes keep taking the recovery job.
        const added = Date.now() - 3 * 3600_000;
        const redis = new Redis(stack.env.REDIS_URL);
        try {
          await waitFor(async () => Number(await redis.eval(AGE_FAILED_JOBS, 1, queue.keys.failed, queue.toKey(''), added)) >= 4, 'the four jobs failed at once', 10_000, 10);
        } finally {
          redis.disconnect();
        }
        // Passes meanwhile leave the failed recovery job alone no longer: each adds it again, and it fails again.
        await waitFor(async () => workerLogged('push delivery job had failed for good'), 'the recovery job added again', 10_000, 100);
        assert.equal(rx.all.length, 0, 'nothing is posted while the token cannot be decrypted');
        await testDb()('push_configs').where({ task_id: id }).update({ encrypted_secrets: sealed });
        await allArrive(rx, id, 'tok-fault');
        // The job that delivered was added anew, not the failed one retried with its first add time,
        // and no run of it waited three hours in the enqueue lag (workers add theirs once a second).
        const delivered = await queue.getCompleted();
        assert.ok(delivered.length > 0 && delivered.every((j) => j.timestamp > added + 3600_000), JSON.stringify(delivered.map((j) => [j.id, j.timestamp])));
        const text = await waitFor(async () => {
          const t = (await stack.client.get('/metrics')).text;
          return metric(t, 'taskbridge_job_duration_seconds_count{queue="push-notifications",outcome="completed"}') >= 1 && t;
        }, 'the delivery in /metrics');
        assert.equal(metric(text, 'taskbridge_job_enqueue_lag_seconds_bucket{queue="push-notifications",le="600"}'),
          metric(text, 'taskbridge_job_enqueue_lag_seconds_count{queue="push-notifications"}'), text);
      });
    } finally {
      await rx.close();
    }
  });
});

describe('push delivery runs whose reads outlast their lease', function () {
  this.timeout(150_000);
  // A run's lease lasts PUSH_TIMEOUT_MS + 10 s: 11 s here.
  const stack = useStack({ PUSH_ALLOW_PRIVATE: 'true', PUSH_TIMEOUT_MS: '1000' });

  it('posts nothing once another run took the lease: the webhook gets each update once, in order', async () => {
    const rx = await startReceiver();
    const db = testDb();
    const lock = await db.transaction();
    try {
      await withQueue(stack.env, 'push-notifications', async (queue) => {
        await queue.pause();
        const created = await stack.client.post('/api/task/v1', { message: textMessage('driven by the test', 'agent') });
        assert.equal(created.status, 201);
        const id: string = created.body.task.id;
        await setPushConfig(db, id, { id: 'slow-reads', url: rx.url }, loadConfig(stack.env));
        for (const status of ['working', 'input-required', 'working']) {
          const r = await stack.client.put(`/api/task/v1/${id}`, { status });
          assert.equal(r.status, 200, r.text);
        }
        await waitFor(async () => (await queue.getJobCounts('wait')).wait >= 3, 'the three delivery jobs', 10_000, 50);
        // The reads a run makes once it holds the lease wait on the task table until the lease has
        // run out and another run has taken the config.
        await lock.raw('lock table tasks in access exclusive mode');
        await queue.resume();
        const config = () => db('push_configs').where({ task_id: id, id: 'slow-reads' }).first();
        const first = await waitFor(async () => (await config())?.lease_id, 'the first run leasing the config', 10_000);
        await waitFor(async () => (await db.raw(`select lease_until < now() as out from push_configs where task_id = ? and id = 'slow-reads'`, [id])).rows[0].out,
          "the first run's lease running out", 20_000, 100);
        await queue.add('deliver', { task_id: id, config_id: 'slow-reads', timeline_seq: (await config()).status_seq });
        await waitFor(async () => {
          const leased = (await config())?.lease_id;
          return leased && leased !== first;
        }, 'a second run leasing the config', 10_000);
        await lock.commit();
        await waitFor(async () => (await queue.getJobs(['completed'], 0, -1)).filter((j) => j.data.task_id === id).length === 4, 'every delivery job completed', 90_000, 100);
        assert.deepEqual(rx.all.filter((r) => r.body.id === id).map((r) => r.body.status.state), ['working', 'input-required', 'working']);
      });
    } finally {
      if (!lock.isCompleted()) await lock.rollback();
      await rx.close();
    }
  });
});

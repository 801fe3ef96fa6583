// The task API (SPEC.md section 3) through HTTP, against a stack without workers so tasks stay
// where the test puts them.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertError, resetDb, testDb, textMessage, useStack, waitFor, withQueue, type Response } from './helpers/stack.ts';
import { COLUMNS as MESSAGE_COLUMNS, listMessages } from '../db/messages.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const ISO_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const TASK_KEYS = ['context_id', 'created_at', 'id', 'metadata', 'status', 'status_message_id', 'status_timestamp', 'updated_at'];
const MESSAGE_KEYS = ['created_at', 'id', 'metadata', 'parts', 'reference_task_ids', 'role', 'task_id'];
const TIMELINE_KEYS = ['created_at', 'event_payload', 'id', 'task_id'];

const keys = (o: object) => Object.keys(o).sort();

function assertTask(t: any, expect: Partial<Record<string, unknown>> = {}) {
  assert.deepEqual(keys(t), TASK_KEYS);
  assert.match(t.id, UUID);
  assert.match(t.context_id, UUID);
  for (const k of ['status_timestamp', 'created_at', 'updated_at']) assert.match(t[k], ISO_MS, k);
  assert.equal(typeof t.metadata, 'object');
  for (const [k, v] of Object.entries(expect)) assert.deepEqual(t[k], v, k);
}

function assertMessage(m: any, expect: Partial<Record<string, unknown>> = {}) {
  assert.deepEqual(keys(m), MESSAGE_KEYS);
  assert.match(m.id, UUID);
  assert.match(m.task_id, UUID);
  assert.match(m.created_at, ISO_MS);
  assert.ok(Array.isArray(m.parts) && Array.isArray(m.reference_task_ids));
  for (const [k, v] of Object.entries(expect)) assert.deepEqual(m[k], v, k);
}

function assertTimelineItem(i: any, taskId: string) {
  assert.deepEqual(keys(i), TIMELINE_KEYS);
  assert.match(i.id, UUID);
  assert.equal(i.task_id, taskId);
  assert.match(i.created_at, ISO_MS);
}


const noToken = (r: Response) => assert.ok(!('next_page_token' in r.body), `next_page_token must be absent: ${r.text}`);

describe('task API', () => {
  const stack = useStack({}, { workers: 0 });
  const create = async (body: Record<string, unknown> = { message: textMessage('hi') }) => {
    const r = await stack.client.post('/api/task/v1', body);
    assert.equal(r.status, 201, r.text);
    return r.body as { task: any; message: any };
  };
  const put = (id: string, body: unknown) => stack.client.put(`/api/task/v1/${id}`, body);
  const counts = async () => {
    const db = testDb();
    const [[t], [m], [i]] = await Promise.all(['tasks', 'messages', 'timeline_items'].map((table) => db(table).count({ n: '*' })));
    return [t.n, m.n, i.n];
  };

  describe('POST /api/task/v1 (create)', () => {
    it('refuses (400) a body holding more than 100,000 JSON values, storing nothing: parsed, each costs tens of bytes in every reader', async () => {
      const before = await counts();
      const values = (n: number) => ({ message: { role: 'user', parts: [{ type: 'data-part', data: { zeros: new Array(n).fill(0) } }] } });
      const r = await stack.client.post('/api/task/v1', values(100_000));
      assertError(r, 400, 'invalid_request');
      assert.equal(r.body.message, 'Invalid body: body holds more than 100000 JSON values');
      assert.deepEqual(await counts(), before);
      // The body, its message, role, parts, the part, its type, data and list: 8 values besides the zeros.
      assert.equal((await stack.client.post('/api/task/v1', values(100_000 - 8))).status, 201);
    });

    it('answers 201 {task, message} shaped as the seed, task submitted, with a new context', async () => {
      const r = await stack.client.post('/api/task/v1', { message: { ...textMessage('hello'), metadata: { a: 1 } }, metadata: { origin: 'test', nested: { x: [1] } } });
      assert.equal(r.status, 201);
      assert.deepEqual(keys(r.body), ['message', 'task']);
      const { task, message } = r.body;
      assertTask(task, { status: 'submitted', status_message_id: null, metadata: { origin: 'test', nested: { x: [1] } } });
      assert.equal(task.status_timestamp, task.created_at);
      assertMessage(message, { task_id: task.id, role: 'user', parts: [{ type: 'text-part', text: 'hello' }], reference_task_ids: [], metadata: { a: 1 } });
    });

    it('uses a given context_id, and stores text, data and file parts as sent', async () => {
      const contextId = randomUUID();
      const ref = (await create()).task.id;
      const parts = [
        { type: 'text-part', text: 'see data', metadata: { lang: 'en' } },
        { type: 'data-part', data: { amount: 12.5, items: ['a', 'b'], deep: { ok: true } } },
        { type: 'file-part', file: { name: 'a.txt', mime_type: 'text/plain', bytes: Buffer.from('hello').toString('base64') } },
        { type: 'file-part', file: { uri: 'https://example.com/b.pdf' } },
      ];
      const { task, message } = await create({ context_id: contextId, message: { role: 'user', parts, reference_task_ids: [ref] } });
      assert.equal(task.context_id, contextId);
      assertMessage(message, { parts, reference_task_ids: [ref], metadata: {} });
      const second = await create({ context_id: contextId, message: textMessage('again') });
      assert.equal(second.task.context_id, contextId);
      const got = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.deepEqual(got.body.messages[0].parts, parts);
      assert.ok(!('client_message_id' in got.body.messages[0]), 'no client_message_id unless the sender gave one');
    });

    it("keeps the sender's client_message_id on the message, its reads and its timeline item", async () => {
      const { task, message } = await create({ message: { ...textMessage('mine'), client_message_id: 'sender-1' } });
      assert.equal(message.client_message_id, 'sender-1');
      assert.match(message.id, /^[0-9a-f-]{36}$/);
      const more = await stack.client.post(`/api/task/v1/${task.id}/message`, { ...textMessage('again'), role: 'agent', client_message_id: 'sender-1' });
      assert.equal(more.status, 201, more.text);
      assert.equal(more.body.message.client_message_id, 'sender-1');
      const got = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.deepEqual(got.body.messages.map((m: { client_message_id: string }) => m.client_message_id), ['sender-1', 'sender-1']);
      const timeline = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
      const carried = timeline.body.items.filter((i: any) => i.event_payload.type === 'message').map((i: any) => i.event_payload.message.client_message_id);
      assert.deepEqual(carried, ['sender-1', 'sender-1']);
    });

    it('keeps the extensions a message names on the message, its reads and its timeline item, however it is written', async () => {
      const ext = ['https://ext.example.com/citations/v1', 'urn:example:trace'];
      const { task, message } = await create({ message: { ...textMessage('with extensions'), extensions: ext } });
      assert.deepEqual(message.extensions, ext);
      const more = await stack.client.post(`/api/task/v1/${task.id}/message`, { ...textMessage('more'), role: 'agent', extensions: [ext[1]] });
      assert.equal(more.status, 201, more.text);
      const plain = await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage('none', 'agent'));
      assert.equal(plain.status, 201, plain.text);
      const status = await put(task.id, { status: 'canceled', message: { ...textMessage('stopped'), role: 'agent', extensions: [ext[0]] } });
      assert.equal(status.status, 200, status.text);
      const expected = [ext, [ext[1]], undefined, [ext[0]]];
      const got = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.deepEqual(got.body.messages.map((m: { extensions?: string[] }) => m.extensions), expected);
      assert.ok(!('extensions' in got.body.messages[2]), 'no extensions member unless the sender named some');
      const timeline = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
      assert.deepEqual(timeline.body.items.filter((i: any) => i.event_payload.type === 'message').map((i: any) => i.event_payload.message.extensions), expected);
      for (const bad of [[''], [1], 'https://x.example', Array.from({ length: 101 }, (_, i) => `urn:x:${i}`)]) {
        assertError(await stack.client.post('/api/task/v1', { message: { ...textMessage('x'), extensions: bad } }), 400, 'invalid_request');
      }
    });

    it('keeps the output modes a message accepts on the message, its reads and its timeline item, and refuses bad ones changing nothing', async () => {
      const modes = ['application/json', 'text/*; q=0.5', 'text'];
      const { task, message } = await create({ message: { ...textMessage('json please'), accepted_output_modes: modes } });
      assert.deepEqual(message.accepted_output_modes, modes);
      const follow = await stack.client.post(`/api/task/v1/${task.id}/message`, { ...textMessage('any'), accepted_output_modes: [] });
      assert.equal(follow.status, 201, follow.text);
      assert.ok(!('accepted_output_modes' in follow.body.message), 'an empty list names no modes');
      // A status message too (written by the status-change statement).
      const status = await put(task.id, { status: 'canceled', message: { ...textMessage('stopped', 'agent'), accepted_output_modes: ['text/markdown'] } });
      assert.equal(status.status, 200, status.text);
      const expected = [modes, undefined, ['text/markdown']];
      const got = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.deepEqual(got.body.messages.map((m: { accepted_output_modes?: string[] }) => m.accepted_output_modes), expected);
      assert.deepEqual(got.body.status_message.accepted_output_modes, ['text/markdown']);
      const timeline = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
      assert.deepEqual(timeline.body.items.filter((i: any) => i.event_payload.type === 'message').map((i: any) => i.event_payload.message.accepted_output_modes), expected);
      const before = await testDb()('messages').count({ n: '*' });
      for (const bad of [[''], [1], 'application/json', ['a\u0001b'], ['x'.repeat(256)], Array.from({ length: 33 }, (_, i) => `type/sub${i}`)]) {
        const r = await stack.client.post('/api/task/v1', { message: { ...textMessage('x'), accepted_output_modes: bad } });
        assertError(r, 400, 'invalid_request');
        assert.match(r.body.message, /accepted_output_modes/, r.text);
      }
      assert.deepEqual(await testDb()('messages').count({ n: '*' }), before);
    });

    it('keeps concurrent creations apart (they are written together): own message, own timeline, a shared new context once', async () => {
      const shared = randomUUID();
      const bodies = Array.from({ length: 60 }, (_, i) => ({ ...(i % 3 === 0 ? { context_id: shared } : {}), message: textMessage(`concurrent ${i}`), metadata: { i } }));
      const created = await Promise.all(bodies.map((b) => create(b)));
      assert.equal(new Set(created.map((c) => c.task.id)).size, 60);
      await Promise.all(created.map(async ({ task, message }, i) => {
        assert.deepEqual(task.metadata, { i });
        assert.equal(task.context_id === shared, i % 3 === 0);
        assertMessage(message, { task_id: task.id, parts: [{ type: 'text-part', text: `concurrent ${i}` }] });
        const got = await stack.client.get(`/api/task/v1/${task.id}`);
        assert.deepEqual(got.body.messages, [message]);
        const timeline = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
        assert.deepEqual(timeline.body.items.map((x: any) => x.event_payload), [{ type: 'message', message }, { type: 'task-status-update', status: 'submitted' }]);
      }));
      const [{ n }] = await testDb()('contexts').where({ id: shared }).count({ n: '*' });
      assert.equal(n, 1);
      const ofShared = await stack.client.get(`/api/task/v1/context/${shared}/task?page_size=100`);
      assert.equal(ofShared.status, 200, ofShared.text);
      assert.equal(ofShared.body.items.length, 20);
    });

    const bad: [string, unknown, string][] = [
      ['no message', {}, 'body.message'],
      ['an unknown top-level member', { message: textMessage('x'), priority: 1 }, 'body.priority'],
      ['an unknown member in the message', { message: { ...textMessage('x'), sender: 'me' } }, 'body.message.sender'],
      ['an unknown member in a part', { message: { role: 'user', parts: [{ type: 'text-part', text: 'x', lang: 'en' }] } }, 'body.message.parts.0.lang'],
      ['a part of an unknown type', { message: { role: 'user', parts: [{ type: 'image-part', url: 'x' }] } }, 'body.message.parts.0.type'],
      ['a part without a type', { message: { role: 'user', parts: [{ text: 'x' }] } }, 'body.message.parts.0.type'],
      ['a text part without text', { message: { role: 'user', parts: [{ type: 'text-part' }] } }, 'body.message.parts.0.text'],
      ['a data part whose data is not an object', { message: { role: 'user', parts: [{ type: 'data-part', data: 'x' }] } }, 'body.message.parts.0.data'],
      ['a file part with bad base64', { message: { role: 'user', parts: [{ type: 'file-part', file: { bytes: 'not base64!' } }] } }, 'body.message.parts.0.file.bytes'],
      ['a file part with unpadded base64', { message: { role: 'user', parts: [{ type: 'file-part', file: { bytes: 'aGk' } }] } }, 'body.message.parts.0.file.bytes'],
      ['a file part with a lone base64 character', { message: { role: 'user', parts: [{ type: 'file-part', file: { bytes: 'a=' } }] } }, 'body.message.parts.0.file.bytes'],
      ['a file part with an empty file', { message: { role: 'user', parts: [{ type: 'file-part', file: {} }] } }, 'body.message.parts.0.file'],
      ['no parts', { message: { role: 'user', parts: [] } }, 'body.message.parts'],
      ['an unknown role', { message: { role: 'system', parts: [{ type: 'text-part', text: 'x' }] } }, 'body.message.role'],
      ['a missing role', { message: { parts: [{ type: 'text-part', text: 'x' }] } }, 'body.message.role'],
      ['a non-UUID context_id', { context_id: 'ctx-1', message: textMessage('x') }, 'body.context_id'],
      ['an empty client_message_id', { message: { ...textMessage('x'), client_message_id: '' } }, 'body.message.client_message_id'],
      ['a client_message_id over 256 characters', { message: { ...textMessage('x'), client_message_id: 'x'.repeat(257) } }, 'body.message.client_message_id'],
      ['a non-UUID reference_task_id', { message: { ...textMessage('x'), reference_task_ids: ['t1'] } }, 'body.message.reference_task_ids.0'],
      ['metadata that is not an object', { message: textMessage('x'), metadata: [1] }, 'body.metadata'],
      ['a body that is an array', [textMessage('x')], 'body'],
      ['a urn:uuid context_id', { context_id: 'urn:uuid:00000000-0000-4000-8000-000000000000', message: textMessage('x') }, 'body.context_id'],
      ['a file part with only a name', { message: { role: 'user', parts: [{ type: 'file-part', file: { name: 'a.txt' } }] } }, 'body.message.parts.0.file'],
      ['a file part with both bytes and uri', { message: { role: 'user', parts: [{ type: 'file-part', file: { bytes: 'aGk=', uri: 'https://example.com/a' } }] } }, 'body.message.parts.0.file'],
    ];
    for (const [what, body, path] of bad) {
      it(`answers 400 naming ${path} for ${what}, and stores nothing`, async () => {
        const before = await counts();
        const r = await stack.client.post('/api/task/v1', body);
        assertError(r, 400, 'invalid_request');
        assert.ok(r.body.data.errors.some((e: { path: string }) => e.path === path), `expected an error at ${path}: ${r.text}`);
        assert.deepEqual(await counts(), before);
      });
    }

    it('words a file part that needs exactly one of bytes or uri as that choice, not as one of them being required', async () => {
      const filePart = (file: unknown) => ({ message: { role: 'user', parts: [{ type: 'file-part', file }] } });
      const choice = { path: 'body.message.parts.0.file', message: 'must have exactly one of bytes or uri' };
      for (const file of [{}, { name: 'a.txt' }, { bytes: 'aGk=', uri: 'https://example.com/a' }]) {
        const before = await counts();
        const r = await stack.client.post('/api/task/v1', filePart(file));
        assertError(r, 400, 'invalid_request');
        assert.deepEqual(r.body, { message: `Invalid body: ${choice.path} ${choice.message}`, data: { code: 'invalid_request', errors: [choice] } }, JSON.stringify(file));
        assert.deepEqual(await counts(), before);
      }
    });

    it('answers ids in the lower case later reads use', async () => {
      const ctx = randomUUID().toUpperCase();
      const ref = (await create()).task.id.toUpperCase();
      const { task, message } = await create({ context_id: ctx, message: { ...textMessage('x'), reference_task_ids: [ref] } });
      assert.equal(task.context_id, ctx.toLowerCase());
      assert.deepEqual(message.reference_task_ids, [ref.toLowerCase()]);
      assert.deepEqual((await stack.client.get(`/api/task/v1/${task.id}`)).body.messages[0], message);
    });

    it('answers 400 for urn:uuid ids in paths and queries', async () => {
      const urn = 'urn:uuid:00000000-0000-4000-8000-000000000000';
      for (const url of [`/api/task/v1/${urn}`, `/api/task/v1/${urn}/timeline`, `/api/task/v1/context/${urn}/task`, `/api/task/v1?context_id=${urn}`, `/api/secret/v1/${urn}`, `/api/encryption/v1/job/${urn}`]) {
        assertError(await stack.client.get(url), 400, 'invalid_request');
      }
    });

    it('answers 400 for a missing body', async () => {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': 'application/json' } });
      assertError(r, 400, 'invalid_request');
    });

    describe('a retried create (a first message with the same client_message_id, role and content)', () => {
      const opening = (extra: Record<string, unknown> = {}) => ({
        role: 'user', client_message_id: `open-${randomUUID()}`, parts: [{ type: 'data-part', data: { a: 1, b: [2, 3] } }],
        metadata: { k: 'v' }, extensions: ['https://example.com/ext'], reference_task_ids: [], ...extra,
      });
      const post = (body: unknown) => stack.client.post('/api/task/v1', body);
      // The agent runs queued for a task (no worker runs here).
      const runsOf = async (taskId: string) => (await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['wait'])))
        .filter((j) => j.data.task_id === taskId);

      it('answers 200 with the task it created and its first message, storing nothing and queuing no second run', async () => {
        const message = opening();
        const first = await post({ message, metadata: { origin: 'retry' } });
        assert.equal(first.status, 201, first.text);
        await waitFor(async () => (await runsOf(first.body.task.id)).length === 1, 'the first run queued');
        await put(first.body.task.id, { status: 'working' });
        const before = await counts();
        // The same content written otherwise (key order) is the same message.
        const retry = await post({ message: { ...message, parts: [{ data: { b: [2, 3], a: 1 }, type: 'data-part' }] }, metadata: { origin: 'retry' } });
        assert.equal(retry.status, 200, retry.text);
        assert.deepEqual(retry.body.message, first.body.message);
        // The task as it stands now.
        assert.equal(retry.body.task.id, first.body.task.id);
        assert.equal(retry.body.task.status, 'working');
        assert.deepEqual(await counts(), before);
        await sleep(100);
        assert.equal((await runsOf(first.body.task.id)).length, 1);
        // Its context named, as the task has it (in upper case too): the same retry.
        const named = await post({ message, metadata: { origin: 'retry' }, context_id: first.body.task.context_id.toUpperCase() });
        assert.equal(named.status, 200, named.text);
        assert.equal(named.body.task.id, first.body.task.id);
      });

      it('sent several times at once creates one task', async () => {
        const message = opening();
        const before = await counts();
        const all = await Promise.all(Array.from({ length: 6 }, () => post({ message })));
        assert.deepEqual(all.map((r) => r.status).sort(), [200, 200, 200, 200, 200, 201]);
        assert.equal(new Set(all.map((r) => r.body.task.id)).size, 1);
        assert.equal(new Set(all.map((r) => r.body.message.id)).size, 1);
        const [t, m, i] = await counts();
        assert.deepEqual([Number(t), Number(m), Number(i)], [Number(before[0]) + 1, Number(before[1]) + 1, Number(before[2]) + 2]);
        await waitFor(async () => (await runsOf(all[0].body.task.id)).length === 1, 'the run queued');
        await sleep(100);
        assert.equal((await runsOf(all[0].body.task.id)).length, 1);
      });

      it('is recognised with task metadata that reads back otherwise from storage (-0 is stored as 0, members reordered)', async () => {
        const message = opening();
        // As a Python or Go client writes it: JSON.stringify would already have made -0 a 0.
        const text = `{"message":${JSON.stringify(message)},"metadata":{"lon":-0,"at":{"z":1,"a":[-0.0,2]}}}`;
        const send = () => stack.client.request('POST', '/api/task/v1', undefined, { raw: text, headers: { 'content-type': 'application/json' } });
        const first = await send();
        assert.equal(first.status, 201, first.text);
        const before = await counts();
        const again = await Promise.all([send(), send()]);
        assert.deepEqual(again.map((r) => [r.status, r.body.task.id]), [[200, first.body.task.id], [200, first.body.task.id]]);
        assert.deepEqual(await counts(), before);
      });

      it('with other content, task metadata or context, or without client_message_id, creates a task of its own', async () => {
        const message = opening();
        const first = await create({ message });
        const { task: other } = await create();
        const variants = [
          { message: { ...message, parts: [{ type: 'data-part', data: { a: 1, b: [3, 2] } }] } }, { message: { ...message, role: 'agent' } },
          { message: { ...message, metadata: {} } }, { message: { ...message, extensions: undefined } },
          { message: { ...message, reference_task_ids: [other.id] } }, { message: { ...message, client_message_id: undefined } },
          { message, metadata: { other: true } }, { message, context_id: other.context_id }, { message, context_id: randomUUID() },
        ];
        const ids = new Set([first.task.id, other.id]);
        for (const body of variants) {
          const r = await post(body);
          assert.equal(r.status, 201, `${JSON.stringify(body)}: ${r.text}`);
          ids.add(r.body.task.id);
        }
        assert.equal(ids.size, variants.length + 2);
        // The first task's own retry still finds it.
        const retry = await post({ message });
        assert.equal(retry.status, 200, retry.text);
        assert.equal(retry.body.task.id, first.task.id);
      });

      it('is told from a later message of that task that reuses its sender id: a new task with that content is a task of its own', async () => {
        const message = opening();
        const first = await create({ message });
        // A follow-up reusing the sender id with other content is a new message of the task (not a retry).
        const followUp = { ...message, parts: [{ type: 'text-part', text: 'a follow-up' }] };
        assert.equal((await stack.client.post(`/api/task/v1/${first.task.id}/message`, followUp)).status, 201);
        // A new task sent with the follow-up's content did not open that task: it is created.
        const r = await post({ message: followUp });
        assert.equal(r.status, 201, r.text);
        assert.notEqual(r.body.task.id, first.task.id);
        assert.deepEqual(r.body.message.parts, followUp.parts);
        // The first task's own retry still finds it, with the message that opened it.
        const retry = await post({ message });
        assert.equal(retry.status, 200, retry.text);
        assert.equal(retry.body.task.id, first.task.id);
        assert.deepEqual(retry.body.message, first.message);
      });

      it('of a task that has ended since answers 200 with the ended task; one deleted since is created again', async () => {
        const message = opening();
        const { task } = await create({ message });
        await put(task.id, { status: 'canceled' });
        const retry = await post({ message });
        assert.equal(retry.status, 200, retry.text);
        assert.equal(retry.body.task.status, 'canceled');
        await testDb()('tasks').where({ id: task.id }).delete();
        const again = await post({ message });
        assert.equal(again.status, 201, again.text);
        assert.notEqual(again.body.task.id, task.id);
      });
    });
  });

  describe('GET /api/task/v1/{task_id}', () => {
    it('returns {task, messages} oldest first, without status_message or token when there is none', async () => {
      const { task, message } = await create({ message: textMessage('first') });
      const second = await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage('second'));
      const r = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.equal(r.status, 200);
      assert.deepEqual(keys(r.body), ['messages', 'task']);
      assertTask(r.body.task, { id: task.id, status: 'submitted' });
      assert.deepEqual(r.body.messages, [message, second.body.message]);
    });

    it('carries status_message after a status change with a message', async () => {
      const { task } = await create();
      const r = await put(task.id, { status: 'working', message: textMessage('on it', 'agent') });
      const got = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.deepEqual(keys(got.body), ['messages', 'status_message', 'task']);
      assertMessage(got.body.status_message, { role: 'agent', parts: [{ type: 'text-part', text: 'on it' }] });
      assert.equal(got.body.task.status_message_id, got.body.status_message.id);
      assert.deepEqual(got.body.task, r.body);
    });

    it('returns the first 100 messages and messages_next_page_token, which GET .../message continues', async () => {
      const { task, message } = await create({ message: textMessage('m0') });
      for (let i = 1; i <= 101; i++) assert.equal((await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(`m${i}`))).status, 201);
      const r = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.equal(r.body.messages.length, 100);
      assert.equal(r.body.messages[0].id, message.id);
      assert.equal(typeof r.body.messages_next_page_token, 'string');
      const rest = await stack.client.get(`/api/task/v1/${task.id}/message?next_page_token=${r.body.messages_next_page_token}`);
      assert.equal(rest.status, 200);
      assert.deepEqual(rest.body.items.map((m: any) => m.parts[0].text), ['m100', 'm101']);
      noToken(rest);
      // Sent back to GET /{id} itself, the token would answer the first 100 again, and a client
      // following it would loop: refused, naming it, as the lists refuse what they do not take.
      const again = await stack.client.get(`/api/task/v1/${task.id}?next_page_token=${r.body.messages_next_page_token}`);
      assertError(again, 400, 'invalid_request');
      assert.deepEqual(again.body.data.errors, [{ path: 'query.next_page_token', message: 'is not an allowed member' }]);
    });

    it('has no messages_next_page_token with exactly 100 messages', async () => {
      const { task } = await create({ message: textMessage('m0') });
      for (let i = 1; i < 100; i++) assert.equal((await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(`m${i}`))).status, 201);
      const r = await stack.client.get(`/api/task/v1/${task.id}`);
      assert.equal(r.body.messages.length, 100);
      assert.deepEqual(keys(r.body), ['messages', 'task']);
    });

    it('answers 404 with resource and id for an unknown task, 400 for a non-UUID id', async () => {
      const id = randomUUID();
      const r = await stack.client.get(`/api/task/v1/${id}`);
      assertError(r, 404, 'not_found');
      assert.equal(r.body.data.resource, 'task');
      assert.equal(r.body.data.id, id);
      const bad = await stack.client.get('/api/task/v1/not-a-uuid');
      assertError(bad, 400, 'invalid_request');
      assert.equal(bad.body.data.errors[0].path, 'path.task_id');
    });
  });

  describe('PUT /api/task/v1/{task_id} (status)', () => {
    it('changes the status, answers the Task, and appends one task-status-update', async () => {
      const { task } = await create();
      const r = await put(task.id, { status: 'working' });
      assert.equal(r.status, 200);
      assertTask(r.body, { id: task.id, status: 'working', status_message_id: null, created_at: task.created_at });
      assert.ok(r.body.status_timestamp >= task.status_timestamp);
      assert.equal(r.body.updated_at, r.body.status_timestamp);
      const tl = await stack.client.get(`/api/task/v1/${task.id}/timeline`);
      assertTimelineItem(tl.body.items[0], task.id);
      assert.deepEqual(tl.body.items[0].event_payload, { type: 'task-status-update', status: 'working' });
    });

    it('never moves updated_at back (content another process, its clock ahead, stamped later stays the latest change)', async () => {
      const { task } = await create();
      const ahead = new Date(Date.now() + 3_600_000);
      await testDb()('tasks').where({ id: task.id }).update({ updated_at: ahead });
      const r = await put(task.id, { status: 'working' });
      assert.equal(r.status, 200);
      assert.equal(r.body.updated_at, ahead.toISOString());
      assert.ok(r.body.status_timestamp < r.body.updated_at, `${r.body.status_timestamp} before ${r.body.updated_at}`);
      assert.equal((await stack.client.get(`/api/task/v1/${task.id}`)).body.task.updated_at, ahead.toISOString());
    });

    it('stores a status message first and links it as status_message_id', async () => {
      const { task } = await create();
      await put(task.id, { status: 'working' });
      const r = await put(task.id, { status: 'input-required', message: textMessage('which colour?', 'agent') });
      assert.equal(r.status, 200);
      assert.match(r.body.status_message_id, UUID);
      const tl = await stack.client.get(`/api/task/v1/${task.id}/timeline`);
      const [statusItem, messageItem] = tl.body.items;
      assert.deepEqual(statusItem.event_payload, { type: 'task-status-update', status: 'input-required', status_message_id: r.body.status_message_id });
      assert.equal(messageItem.event_payload.type, 'message');
      assert.equal(messageItem.event_payload.message.id, r.body.status_message_id);
    });

    it('allows every transition the spec lists', async () => {
      const paths = [
        ['working', 'working', 'input-required', 'working', 'auth-required', 'working', 'completed'],
        ['working', 'failed'], ['working', 'canceled'], ['canceled'], ['rejected'], ['failed'],
        ['working', 'input-required', 'canceled'], ['working', 'auth-required', 'failed'],
      ];
      for (const steps of paths) {
        const { task } = await create();
        for (const [i, status] of steps.entries()) {
          // working -> working is a progress update, with its message
          const progress = steps[i - 1] === 'working' && status === 'working' ? { message: textMessage('halfway', 'agent') } : {};
          const r = await put(task.id, { status, ...progress });
          assert.equal(r.status, 200, `${steps.join('>')} at ${status}: ${r.text}`);
          assert.equal(r.body.status, status);
        }
      }
    });

    const illegal: [string[], string][] = [
      [[], 'completed'], [[], 'submitted'], [[], 'input-required'], [[], 'unknown'],
      [['working'], 'submitted'], [['working'], 'rejected'],
      [['working', 'input-required'], 'completed'], [['working', 'input-required'], 'input-required'],
      [['working', 'completed'], 'working'], [['canceled'], 'canceled'], [['rejected'], 'working'],
    ];
    for (const [steps, to] of illegal) {
      const from = steps.at(-1) ?? 'submitted';
      it(`answers 409 with data {from: ${from}, to: ${to}} and changes nothing`, async () => {
        const { task } = await create();
        for (const s of steps) assert.equal((await put(task.id, { status: s })).status, 200);
        const before = await stack.client.get(`/api/task/v1/${task.id}`);
        const beforeCounts = await counts();
        const r = await put(task.id, { status: to, message: textMessage('nope', 'agent') });
        assertError(r, 409, 'conflict');
        assert.equal(r.body.data.from, from);
        assert.equal(r.body.data.to, to);
        assert.deepEqual((await stack.client.get(`/api/task/v1/${task.id}`)).body, before.body);
        assert.deepEqual(await counts(), beforeCounts);
      });
    }

    it('answers 409 to working -> working without a progress message, and changes nothing', async () => {
      const { task } = await create();
      assert.equal((await put(task.id, { status: 'working', message: textMessage('started', 'agent') })).status, 200);
      const before = await stack.client.get(`/api/task/v1/${task.id}`);
      const beforeCounts = await counts();
      const r = await put(task.id, { status: 'working' });
      assertError(r, 409, 'conflict');
      assert.equal(r.body.message, `Status 'working' of a working task is a progress update: it needs its progress message ('message')`);
      assert.deepEqual(r.body.data, { code: 'conflict', from: 'working', to: 'working' });
      assert.deepEqual((await stack.client.get(`/api/task/v1/${task.id}`)).body, before.body);
      assert.deepEqual(await counts(), beforeCounts);
      const progress = await put(task.id, { status: 'working', message: textMessage('halfway', 'agent') });
      assert.equal(progress.status, 200);
      assert.notEqual(progress.body.status_message_id, before.body.task.status_message_id);
    });

    it('answers 404 for an unknown task, 400 for a bad status, unknown member or non-UUID id', async () => {
      assertError(await put(randomUUID(), { status: 'working' }), 404, 'not_found');
      const { task } = await create();
      const badStatus = await put(task.id, { status: 'done' });
      assertError(badStatus, 400, 'invalid_request');
      assert.equal(badStatus.body.data.errors[0].path, 'body.status');
      assertError(await put(task.id, { status: 'working', force: true }), 400, 'invalid_request');
      assertError(await put(task.id, {}), 400, 'invalid_request');
      assertError(await put(task.id, { status: 'working', message: { role: 'agent', parts: [{ type: 'bogus' }] } }), 400, 'invalid_request');
      assertError(await put('123', { status: 'working' }), 400, 'invalid_request');
      assert.equal((await stack.client.get(`/api/task/v1/${task.id}`)).body.task.status, 'submitted');
    });
  });

  describe('POST /api/task/v1/{task_id}/message', () => {
    it('answers 201 {message, timeline_item} for user and agent messages', async () => {
      const { task } = await create();
      for (const role of ['user', 'agent'] as const) {
        const r = await stack.client.post(`/api/task/v1/${task.id}/message`, { role, parts: [{ type: 'data-part', data: { role } }], metadata: { k: role } });
        assert.equal(r.status, 201);
        assert.deepEqual(keys(r.body), ['message', 'timeline_item']);
        assertMessage(r.body.message, { task_id: task.id, role, parts: [{ type: 'data-part', data: { role } }], metadata: { k: role }, reference_task_ids: [] });
        assertTimelineItem(r.body.timeline_item, task.id);
        assert.deepEqual(r.body.timeline_item.event_payload, { type: 'message', message: r.body.message });
      }
      // Messages do not change the status.
      assert.equal((await stack.client.get(`/api/task/v1/${task.id}`)).body.task.status, 'submitted');
    });

    it("moves the task's updated_at to the message's created_at; the status and its timestamp stay", async () => {
      const { task } = await create();
      await sleep(5);
      const r = await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage('more'));
      assert.equal(r.status, 201);
      const after = (await stack.client.get(`/api/task/v1/${task.id}`)).body.task;
      assert.equal(after.updated_at, r.body.message.created_at);
      assert.ok(after.updated_at > task.updated_at, `${after.updated_at} after ${task.updated_at}`);
      assert.equal(after.status_timestamp, task.status_timestamp);
      const listed = (await stack.client.get(`/api/task/v1?context_id=${task.context_id}&page_size=10`)).body.items;
      assert.equal(listed.find((t: { id: string }) => t.id === task.id).updated_at, after.updated_at);
    });

    it('answers 409 for a task in a terminal state, and stores nothing', async () => {
      for (const steps of [['working', 'completed'], ['canceled'], ['rejected'], ['failed']]) {
        const { task } = await create();
        for (const s of steps) await put(task.id, { status: s });
        const before = await counts();
        const r = await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage('late'));
        assertError(r, 409, 'conflict');
        assert.deepEqual(await counts(), before);
      }
    });

    describe('a retried message (same client_message_id, role and content as one the task holds)', () => {
      const answer = (extra: Record<string, unknown> = {}) => ({
        role: 'user', client_message_id: 'answer-1', parts: [{ type: 'data-part', data: { a: 1, b: [2, 3] } }],
        metadata: { k: 'v' }, extensions: ['https://example.com/ext'], reference_task_ids: [], ...extra,
      });
      const send = (taskId: string, body: unknown) => stack.client.post(`/api/task/v1/${taskId}/message`, body);
      // The agent runs owed for a task: its jobs, once the outbox has handed them to the queue.
      const runsOf = async (taskId: string) => {
        await waitFor(async () => !(await testDb()('outbox').whereRaw(`payload->>'task_id' = ?`, [taskId]).first()), 'outbox relayed');
        const jobs = await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['wait']));
        return jobs.filter((j) => j.data.task_id === taskId).map((j) => j.id).sort();
      };
      const inputRequired = async () => {
        const { task } = await create();
        await put(task.id, { status: 'working' });
        await put(task.id, { status: 'input-required' });
        return task;
      };

      it('to a task waiting for input is stored once and owes one run: 200 with the original message and timeline item', async () => {
        const task = await inputRequired();
        const first = await send(task.id, answer());
        assert.equal(first.status, 201, first.text);
        const before = await counts();
        const runs = await runsOf(task.id);
        assert.equal(runs.length, 2, 'the first message and the answer');
        // The same content written otherwise (key order) is the same message.
        const retry = await send(task.id, answer({ parts: [{ data: { b: [2, 3], a: 1 }, type: 'data-part' }], metadata: { k: 'v' } }));
        assert.equal(retry.status, 200, retry.text);
        assert.deepEqual(retry.body, first.body);
        assert.deepEqual(await counts(), before);
        assert.deepEqual(await runsOf(task.id), runs);
        assert.equal((await stack.client.get(`/api/task/v1/${task.id}`)).body.task.status, 'input-required');
      });

      it('to a task that has ended since answers 200 with the original, not 409; another message still gets 409', async () => {
        const task = await inputRequired();
        const first = await send(task.id, answer());
        await put(task.id, { status: 'working' });
        await put(task.id, { status: 'completed' });
        const before = await counts();
        const retry = await send(task.id, answer());
        assert.equal(retry.status, 200, retry.text);
        assert.deepEqual(retry.body, first.body);
        assertError(await send(task.id, answer({ client_message_id: 'answer-2' })), 409, 'conflict');
        assert.deepEqual(await counts(), before);
      });

      it('sent several times at once is stored once', async () => {
        const task = await inputRequired();
        const before = await counts();
        const all = await Promise.all(Array.from({ length: 6 }, () => send(task.id, answer())));
        assert.deepEqual(all.map((r) => r.status).sort(), [200, 200, 200, 200, 200, 201]);
        assert.equal(new Set(all.map((r) => r.body.message.id)).size, 1);
        const [t, m, i] = await counts();
        assert.deepEqual([t, Number(m), Number(i)], [before[0], Number(before[1]) + 1, Number(before[2]) + 1]);
        assert.equal((await runsOf(task.id)).length, 2);
      });

      it('with other content (parts, role, metadata, extensions, references) or no client_message_id is a new message', async () => {
        const task = await inputRequired();
        const { task: other } = await create();
        const first = await send(task.id, answer());
        const variants = [
          answer({ parts: [{ type: 'data-part', data: { a: 1, b: [3, 2] } }] }), answer({ role: 'agent' }), answer({ metadata: {} }),
          answer({ extensions: undefined }), answer({ reference_task_ids: [other.id] }), answer({ client_message_id: undefined }),
        ];
        const ids = [first.body.message.id];
        for (const body of variants) {
          const r = await send(task.id, body);
          assert.equal(r.status, 201, JSON.stringify(body));
          ids.push(r.body.message.id);
        }
        assert.equal(new Set(ids).size, variants.length + 1);
        const listed = (await stack.client.get(`/api/task/v1/${task.id}/message?page_size=100`)).body.items;
        assert.equal(listed.length, variants.length + 2);
      });
    });

    it('answers 404 for an unknown task and 400 for bad bodies or ids', async () => {
      assertError(await stack.client.post(`/api/task/v1/${randomUUID()}/message`, textMessage('x')), 404, 'not_found');
      const { task } = await create();
      const before = await counts();
      for (const body of [{}, { role: 'user' }, { role: 'user', parts: [{ type: 'text-part', text: 'x' }], extra: 1 }, { role: 'robot', parts: [{ type: 'text-part', text: 'x' }] }, { role: 'user', parts: [{ type: 'video-part' }] }]) {
        assertError(await stack.client.post(`/api/task/v1/${task.id}/message`, body), 400, 'invalid_request');
      }
      assertError(await stack.client.post('/api/task/v1/nope/message', textMessage('x')), 400, 'invalid_request');
      assert.deepEqual(await counts(), before);
    });
  });

  describe('GET /api/task/v1/{task_id}/timeline', () => {
    it('lists status, message and artifact items newest first, or oldest first with order=asc', async () => {
      const { task, message } = await create();
      await put(task.id, { status: 'working' });
      const desc = await stack.client.get(`/api/task/v1/${task.id}/timeline`);
      assert.equal(desc.status, 200);
      assert.deepEqual(keys(desc.body), ['items']);
      for (const i of desc.body.items) assertTimelineItem(i, task.id);
      const payloads = desc.body.items.map((i: any) => i.event_payload);
      assert.deepEqual(payloads, [
        { type: 'task-status-update', status: 'working' },
        { type: 'task-status-update', status: 'submitted' },
        { type: 'message', message },
      ]);
      const asc = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
      assert.deepEqual(asc.body.items, [...desc.body.items].reverse());
    });

    it('answers 404 for an unknown task, 400 for a bad order or id', async () => {
      assertError(await stack.client.get(`/api/task/v1/${randomUUID()}/timeline`), 404, 'not_found');
      const { task } = await create();
      assertError(await stack.client.get(`/api/task/v1/${task.id}/timeline?order=sideways`), 400, 'invalid_request');
      assertError(await stack.client.get('/api/task/v1/x/timeline'), 400, 'invalid_request');
    });
  });

  describe('GET /api/task/v1/{task_id}/message', () => {
    it('lists messages oldest first; 404 for an unknown task', async () => {
      const { task, message } = await create();
      const m2 = await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage('two', 'agent'));
      const r = await stack.client.get(`/api/task/v1/${task.id}/message`);
      assert.equal(r.status, 200);
      assert.deepEqual(r.body, { items: [message, m2.body.message] });
      assertError(await stack.client.get(`/api/task/v1/${randomUUID()}/message`), 404, 'not_found');
    });
  });

  describe('lists and pagination', () => {
    before(resetDb);

    it('ends a page of tasks with large metadata at 8 MiB of it, with a token to the rest: every task once', async () => {
      const contextId = randomUUID();
      const made = new Set<string>();
      for (let i = 0; i < 12; i++) {
        const r = await stack.client.post('/api/task/v1', { context_id: contextId, message: textMessage(`t${i}`), metadata: { blob: 'm'.repeat(900_000), i } });
        assert.equal(r.status, 201, r.text);
        made.add(r.body.task.id);
      }
      for (const list of [`/api/task/v1?context_id=${contextId}&page_size=1000`, `/api/task/v1/context/${contextId}/task?page_size=1000`]) {
        const seen: string[] = [];
        for (let token: string | undefined; ;) {
          const r = await stack.client.get(`${list}${token ? `&next_page_token=${token}` : ''}`);
          assert.equal(r.status, 200, r.text);
          assert.ok(r.body.items.length < made.size && r.body.items.length >= 1, `${r.body.items.length} tasks on one page`);
          const bytes = r.body.items.map((t: { metadata: unknown }) => Buffer.byteLength(JSON.stringify(t.metadata)));
          assert.ok(bytes.slice(0, -1).reduce((a: number, b: number) => a + b, 0) < 8 * 1024 * 1024, `${bytes}`);
          // Cut at the budget, not well before it: with one task more it would be past 8 MiB.
          if (r.body.next_page_token) assert.ok(bytes.reduce((a: number, b: number) => a + b, 0) + 900_100 > 8 * 1024 * 1024, `${bytes}`);
          seen.push(...r.body.items.map((t: { id: string }) => t.id));
          token = r.body.next_page_token;
          if (!token) break;
        }
        assert.deepEqual(new Set(seen), made, list);
        assert.equal(seen.length, made.size, `${list}: a task listed twice`);
      }
    });

    it('counts large string metadata at its weight as parsed: ten tasks of 200 kB each fit one page', async () => {
      const contextId = randomUUID();
      const made: string[] = [];
      for (let i = 0; i < 10; i++) {
        const r = await stack.client.post('/api/task/v1', { context_id: contextId, message: textMessage(`t${i}`), metadata: { blob: 'm'.repeat(200_000), i } });
        assert.equal(r.status, 201, r.text);
        made.unshift(r.body.task.id);
      }
      // Before, each counted at 12 times its text (2.4 MB), and a page ended after four of them.
      for (const list of [`/api/task/v1?context_id=${contextId}&page_size=50`, `/api/task/v1/context/${contextId}/task?page_size=50`]) {
        const r = await stack.client.get(list);
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.body.items.map((t: { id: string }) => t.id), made, list);
        assert.equal(r.body.next_page_token, undefined, list);
      }
      // Tasks from before migration 0042 have no stored weight: still bounded, at the most their text can weigh.
      await testDb()('tasks').whereIn('id', made).update({ metadata_weight: null });
      const legacy = await stack.client.get(`/api/task/v1?context_id=${contextId}&page_size=50`);
      assert.deepEqual(legacy.body.items.map((t: { id: string }) => t.id), made.slice(0, 4));
      assert.equal(typeof legacy.body.next_page_token, 'string');
    });

    it('list-contexts requires page_size', async () => {
      const r = await stack.client.get('/api/task/v1/context');
      assertError(r, 400, 'invalid_request');
      assert.equal(r.body.data.errors[0].path, 'query.page_size');
    });

    const lists = ['/api/task/v1/context', '/api/task/v1', `/api/task/v1/context/${randomUUID()}/task`];
    for (const list of lists) {
      for (const size of ['0', '1001', '1.5', 'ten', '-1', '', '0x10', '1e2', '%201']) {
        it(`${list} answers 400 for page_size=${size}`, async () => {
          const r = await stack.client.get(`${list}?page_size=${size}`);
          assertError(r, 400, 'invalid_request');
          assert.equal(r.body.data.errors[0].path, 'query.page_size');
        });
      }
      it(`${list} answers 400 for page tokens it did not issue`, async () => {
        const foreign = [
          'garbage!', 'bm90IGpzb24', Buffer.from('[1]').toString('base64url'), Buffer.from('{"a":1}').toString('base64url'),
          Buffer.from('["2026-01-01T00:00:00.000Z","not-a-uuid"]').toString('base64url'),
          Buffer.from('["yesterday","00000000-0000-4000-8000-000000000000"]').toString('base64url'),
          // Forged timestamps Date.parse accepts but Postgres does not.
          ...['1', '2026', '2026-02-30T00:00:00.000Z', '+275760-09-13T00:00:00.000Z', '0000-01-01T00:00:00.000Z', 'Tue, 01 Jan 2030 00:00:00 GMT']
            .map((t) => Buffer.from(JSON.stringify([t, '00000000-0000-4000-8000-000000000000'])).toString('base64url')),
        ];
        for (const token of foreign) {
          const r = await stack.client.get(`${list}?page_size=5&next_page_token=${encodeURIComponent(token)}`);
          assertError(r, 400, 'invalid_request');
          // Named as every other refused query parameter is (an over-long token among them).
          assert.deepEqual(r.body.data.errors, [{ path: 'query.next_page_token', message: 'is not a token returned by this list' }], r.text);
          assert.equal(r.body.message, 'Invalid query: query.next_page_token is not a token returned by this list');
        }
        const long = await stack.client.get(`${list}?page_size=5&next_page_token=${'A'.repeat(2049)}`);
        assertError(long, 400, 'invalid_request');
        assert.equal(long.body.data.errors[0].path, 'query.next_page_token');
      });
    }

    it('message and timeline lists answer 400 for tokens of another list and bad page sizes', async () => {
      const { task } = await create();
      const token = Buffer.from('["2026-01-01T00:00:00.000Z","00000000-0000-4000-8000-000000000000"]').toString('base64url');
      for (const what of ['message', 'timeline']) {
        assertError(await stack.client.get(`/api/task/v1/${task.id}/${what}?next_page_token=${token}`), 400, 'invalid_request');
        assertError(await stack.client.get(`/api/task/v1/${task.id}/${what}?page_size=0`), 400, 'invalid_request');
        assertError(await stack.client.get(`/api/task/v1/${task.id}/${what}?page_size=1001`), 400, 'invalid_request');
      }
    });

    it('a page token works only on the list, filters and order that issued it', async () => {
      const contextId = randomUUID();
      const tasks = [];
      for (let i = 0; i < 3; i++) tasks.push((await create({ context_id: contextId, message: textMessage(`t${i}`) })).task);
      const [a, b] = tasks;
      assert.equal((await stack.client.post(`/api/task/v1/${a.id}/message`, { role: 'user', parts: [{ type: 'text-part', text: 'more' }] })).status, 201);
      const tokenOf = async (url: string) => {
        const r = await stack.client.get(url);
        assert.equal(r.status, 200, r.text);
        assert.equal(typeof r.body.next_page_token, 'string', url);
        return r.body.next_page_token as string;
      };
      const refused = async (url: string) => {
        const r = await stack.client.get(url);
        assertError(r, 400, 'invalid_request');
        assert.equal(r.body.data.errors[0].path, 'query.next_page_token', url);
      };

      const tasksToken = await tokenOf('/api/task/v1?page_size=1');
      assert.equal((await stack.client.get(`/api/task/v1?page_size=1&next_page_token=${tasksToken}`)).status, 200);
      // Before, these lists took it as a position: same keyset shape, (created_at, id).
      await refused(`/api/task/v1/context?page_size=1&next_page_token=${tasksToken}`);
      await refused(`/api/task/v1/context/${contextId}/task?page_size=1&next_page_token=${tasksToken}`);
      await refused(`/api/task/v1?page_size=1&status=submitted&next_page_token=${tasksToken}`);

      const ascToken = await tokenOf(`/api/task/v1/${a.id}/timeline?order=asc&page_size=1`);
      assert.equal((await stack.client.get(`/api/task/v1/${a.id}/timeline?order=asc&page_size=1&next_page_token=${ascToken}`)).status, 200);
      await refused(`/api/task/v1/${a.id}/timeline?order=desc&page_size=1&next_page_token=${ascToken}`);
      await refused(`/api/task/v1/${b.id}/timeline?order=asc&page_size=1&next_page_token=${ascToken}`);

      const messagesToken = await tokenOf(`/api/task/v1/${a.id}/message?page_size=1`);
      const next = await stack.client.get(`/api/task/v1/${a.id}/message?page_size=1&next_page_token=${messagesToken}`);
      assert.deepEqual(next.body.items.map((m: any) => m.parts[0].text), ['more']);
      await refused(`/api/task/v1/${b.id}/message?page_size=1&next_page_token=${messagesToken}`);
      // The same keyset shape, (seq), as the timeline in ascending order.
      await refused(`/api/task/v1/${a.id}/timeline?order=asc&page_size=1&next_page_token=${messagesToken}`);
      const contextToken = await tokenOf(`/api/task/v1?context_id=${contextId}&page_size=1`);
      await refused(`/api/task/v1?context_id=${randomUUID()}&page_size=1&next_page_token=${contextToken}`);
    });

    it('a page token holds across a release that selects more columns of the list (a rolling deploy)', async () => {
      const { task } = await create();
      for (const text of ['two', 'three']) assert.equal((await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(text))).status, 201);
      const first = await stack.client.get(`/api/task/v1/${task.id}/message?page_size=1`);
      assert.equal(typeof first.body.next_page_token, 'string', first.text);
      // The next release's process, here this one with a column more in the list's select, as
      // releases have added them; the API process that issued the token runs the current columns.
      MESSAGE_COLUMNS.push('weight');
      try {
        const next = await listMessages(testDb(), task.id, 1, first.body.next_page_token);
        assert.deepEqual(next.items.map((m: any) => m.parts[0].text), ['two']);
      } finally {
        MESSAGE_COLUMNS.pop();
      }
    });

    it('a page token holds on its list whatever the letter case of the UUIDs in its path or filters', async () => {
      const contextId = randomUUID();
      const { task } = await create({ context_id: contextId, message: textMessage('m0') });
      await create({ context_id: contextId, message: textMessage('other') });
      for (let i = 1; i <= 101; i++) assert.equal((await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(`m${i}`))).status, 201);
      const up = (s: string) => s.replace(task.id, task.id.toUpperCase()).replace(contextId, contextId.toUpperCase());
      // Before, the token of a list asked for with upper-case ids was refused by the same list in lower case.
      const got = await stack.client.get(up(`/api/task/v1/${task.id}`));
      assert.equal(got.body.task.id, task.id);
      for (const id of [task.id, task.id.toUpperCase()]) {
        const rest = await stack.client.get(`/api/task/v1/${id}/message?next_page_token=${got.body.messages_next_page_token}`);
        assert.equal(rest.status, 200, rest.text);
        assert.deepEqual(rest.body.items.map((m: any) => m.parts[0].text), ['m100', 'm101']);
      }
      for (const list of [`/api/task/v1/${task.id}/message?page_size=1`, `/api/task/v1/${task.id}/timeline?page_size=1`, `/api/task/v1?context_id=${contextId}&page_size=1`, `/api/task/v1/context/${contextId}/task?page_size=1`]) {
        for (const [from, to] of [[up(list), list], [list, up(list)]]) {
          const first = await stack.client.get(from);
          assert.equal(typeof first.body.next_page_token, 'string', from);
          const next = await stack.client.get(`${to}&next_page_token=${first.body.next_page_token}`);
          assert.equal(next.status, 200, `${to}: ${next.text}`);
          assert.deepEqual(next.body, (await stack.client.get(`${list}&next_page_token=${first.body.next_page_token}`)).body, to);
        }
      }
    });

    // Pages through a list, running `between` after each page; checks each row comes once,
    // in order, and that the last page has no next_page_token.
    async function pageThrough(url: string, size: number, idOf: (item: any) => string, between: () => Promise<void>) {
      const seen: any[] = [];
      let token: string | undefined;
      let pages = 0;
      for (;;) {
        const sep = url.includes('?') ? '&' : '?';
        const r = await stack.client.get(`${url}${sep}page_size=${size}${token ? `&next_page_token=${token}` : ''}`);
        assert.equal(r.status, 200, r.text);
        assert.ok(r.body.items.length <= size);
        seen.push(...r.body.items);
        pages++;
        if (!('next_page_token' in r.body)) break;
        assert.equal(typeof r.body.next_page_token, 'string');
        assert.equal(r.body.items.length, size);
        token = r.body.next_page_token;
        await between();
      }
      const ids = seen.map(idOf);
      assert.equal(new Set(ids).size, ids.length, 'no row twice');
      return { seen, ids, pages };
    }

    it('list-contexts returns each context once with its first task\'s created_at, across pages with inserts between', async () => {
      await resetDb();
      const shared = await create();
      const sharedCtx = shared.task.context_id;
      await create({ context_id: sharedCtx, message: textMessage('second in context') });
      await create({ context_id: sharedCtx, message: textMessage('third in context') });
      const originals = [sharedCtx];
      for (let i = 0; i < 7; i++) originals.push((await create()).task.context_id);
      const { seen, ids, pages } = await pageThrough('/api/task/v1/context', 3, (c) => c.context_id, async () => {
        await create();
        await create({ context_id: sharedCtx, message: textMessage('more') });
      });
      assert.ok(pages >= 3);
      for (const c of seen) assert.deepEqual(keys(c), ['context_id', 'created_at']);
      for (const id of originals) assert.ok(ids.includes(id), `context ${id} skipped`);
      assert.equal(seen.find((c) => c.context_id === sharedCtx).created_at, shared.task.created_at);
      const order = seen.map((c) => [c.created_at, c.context_id].join(' '));
      assert.deepEqual(order, [...order].sort().reverse(), 'newest first');
    });

    it('list-tasks pages newest first across 3+ pages with inserts between, without duplicates or skips', async () => {
      const originals: string[] = [];
      for (let i = 0; i < 8; i++) originals.push((await create()).task.id);
      const before = (await stack.client.get('/api/task/v1?page_size=1000')).body.items.map((t: any) => t.id);
      const { seen, ids, pages } = await pageThrough('/api/task/v1', 4, (t) => t.id, async () => { await create(); });
      assert.ok(pages >= 3);
      for (const t of seen) assertTask(t);
      for (const id of before) assert.ok(ids.includes(id), `task ${id} skipped`);
      const order = seen.map((t) => [t.created_at, t.id].join(' '));
      assert.deepEqual(order, [...order].sort().reverse(), 'newest first');
    });

    it('list-tasks filters by status and context_id, defaults page_size to 50, and rejects bad filters', async () => {
      const ctx = randomUUID();
      const a = await create({ context_id: ctx, message: textMessage('a') });
      const b = await create({ context_id: ctx, message: textMessage('b') });
      await put(a.task.id, { status: 'canceled' });
      const byCtx = await stack.client.get(`/api/task/v1?context_id=${ctx}`);
      assert.deepEqual(byCtx.body.items.map((t: any) => t.id), [b.task.id, a.task.id]);
      noToken(byCtx);
      const canceled = await stack.client.get(`/api/task/v1?status=canceled&context_id=${ctx}`);
      assert.deepEqual(canceled.body.items.map((t: any) => t.id), [a.task.id]);
      const allCanceled = await stack.client.get('/api/task/v1?status=canceled');
      assert.ok(allCanceled.body.items.every((t: any) => t.status === 'canceled'));
      assert.ok(allCanceled.body.items.length >= 1);
      assertError(await stack.client.get('/api/task/v1?status=done'), 400, 'invalid_request');
      assertError(await stack.client.get('/api/task/v1?context_id=nope'), 400, 'invalid_request');

      let total = (await stack.client.get('/api/task/v1?page_size=1000')).body.items.length;
      for (; total <= 50; total++) await create();
      const page = await stack.client.get('/api/task/v1');
      assert.equal(page.body.items.length, 50);
      assert.equal(typeof page.body.next_page_token, 'string');
    });

    it('tasks of a context: pages with inserts between; an exactly full last page has no token; unknown context is empty', async () => {
      const ctx = randomUUID();
      for (let i = 0; i < 9; i++) await create({ context_id: ctx, message: textMessage(`t${i}`) });
      const before = (await stack.client.get(`/api/task/v1/context/${ctx}/task?page_size=1000`)).body.items.map((t: any) => t.id);
      assert.equal(before.length, 9);
      const { ids, pages } = await pageThrough(`/api/task/v1/context/${ctx}/task`, 3, (t) => t.id, async () => { await create({ context_id: ctx, message: textMessage('new') }); });
      assert.ok(pages >= 3);
      for (const id of before) assert.ok(ids.includes(id));

      const exact = randomUUID();
      for (let i = 0; i < 3; i++) await create({ context_id: exact, message: textMessage(`e${i}`) });
      const full = await stack.client.get(`/api/task/v1/context/${exact}/task?page_size=3`);
      assert.equal(full.body.items.length, 3);
      noToken(full);

      const empty = await stack.client.get(`/api/task/v1/context/${randomUUID()}/task`);
      assert.equal(empty.status, 200);
      assert.deepEqual(empty.body, { items: [] });
      assertError(await stack.client.get('/api/task/v1/context/nope/task'), 400, 'invalid_request');
    });

    it('messages page oldest first across 3+ pages; messages added between pages come at the end', async () => {
      const { task } = await create({ message: textMessage('0') });
      for (let i = 1; i < 8; i++) await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(String(i)));
      let n = 8;
      const { seen, pages } = await pageThrough(`/api/task/v1/${task.id}/message`, 3, (m) => m.id, async () => {
        await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(String(n++)));
      });
      assert.ok(pages >= 3);
      for (const m of seen) assertMessage(m, { task_id: task.id });
      assert.deepEqual(seen.map((m) => m.parts[0].text), Array.from({ length: n }, (_, i) => String(i)));
    });

    it('the timeline pages both ways across 3+ pages with items added between pages', async () => {
      const { task } = await create({ message: textMessage('0') });
      for (let i = 1; i < 8; i++) await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage(String(i)));
      const before = (await stack.client.get(`/api/task/v1/${task.id}/timeline?page_size=1000`)).body.items.map((i: any) => i.id);
      const add = async () => { await stack.client.post(`/api/task/v1/${task.id}/message`, textMessage('more')); };
      const desc = await pageThrough(`/api/task/v1/${task.id}/timeline`, 3, (i) => i.id, add);
      assert.ok(desc.pages >= 3);
      assert.deepEqual(desc.ids, before, 'newest first: later items belong before the first page');
      const beforeAsc = (await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc&page_size=1000`)).body.items.map((i: any) => i.id);
      const asc = await pageThrough(`/api/task/v1/${task.id}/timeline?order=asc`, 3, (i) => i.id, add);
      assert.ok(asc.pages >= 3);
      assert.deepEqual(asc.ids.slice(0, beforeAsc.length), beforeAsc);
      const all = (await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc&page_size=1000`)).body.items.map((i: any) => i.id);
      assert.deepEqual(asc.ids, all, 'oldest first: items added between pages come at the end');
    });
  });
});

describe('the bytes of messages a task may hold (TASK_MESSAGES_MAX_BYTES)', () => {
  const stack = useStack({ TASK_MESSAGES_MAX_BYTES: '4096' }, { workers: 0 });

  it('refuses (413; A2A -32602) a message or status message that would take a task over, storing nothing; the task still reads', async () => {
    const c = stack.client;
    const text = (n: number) => textMessage('x'.repeat(n), 'agent');
    const id = (await c.post('/api/task/v1', { message: text(1000) })).body.task.id;
    assert.equal((await c.post(`/api/task/v1/${id}/message`, text(1500))).status, 201);
    const counts = async () => [(await c.get(`/api/task/v1/${id}/message?page_size=100`)).body.items.length, (await c.get(`/api/task/v1/${id}/timeline?page_size=100`)).body.items.length];
    const before = await counts();

    const over = await c.post(`/api/task/v1/${id}/message`, text(1700));
    assertError(over, 413, 'payload_too_large');
    assert.match(over.body.message, /^Task '.+' holds \d+ bytes of messages; this message \(\d+ bytes\) would take it over the 4096 a task may hold \(TASK_MESSAGES_MAX_BYTES\)$/);
    assertError(await c.put(`/api/task/v1/${id}`, { status: 'working', message: text(1700) }), 413, 'payload_too_large');
    const rpc = await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 7, method: 'message/send',
      params: { message: { kind: 'message', messageId: randomUUID(), taskId: id, role: 'user', parts: [{ kind: 'text', text: 'y'.repeat(1700) }] }, configuration: { blocking: false } } });
    assert.equal(rpc.body.error.code, -32602, rpc.text);
    assert.match(rpc.body.error.message, /TASK_MESSAGES_MAX_BYTES/);
    assert.deepEqual(await counts(), before, 'nothing stored');
    assert.equal((await c.get(`/api/task/v1/${id}`)).body.task.status, 'submitted');

    // What fits is still taken; a status change without a message is not held back.
    assert.equal((await c.post(`/api/task/v1/${id}/message`, text(200))).status, 201);
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'working' })).status, 200);
  });

  it('answers 409, not 413, for a status change the task cannot make, however large its message (as a message to an ended task is)', async () => {
    const c = stack.client;
    const big = textMessage('x'.repeat(5000), 'agent');
    const id = (await c.post('/api/task/v1', { message: textMessage('hi') })).body.task.id;
    const illegal = await c.put(`/api/task/v1/${id}`, { status: 'completed', message: big });
    assertError(illegal, 409, 'conflict');
    assert.deepEqual(illegal.body.data, { code: 'conflict', from: 'submitted', to: 'completed' });
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'canceled' })).status, 200);
    assertError(await c.put(`/api/task/v1/${id}`, { status: 'failed', message: big }), 409, 'conflict');
    assertError(await c.post(`/api/task/v1/${id}/message`, big), 409, 'conflict');
  });

  it('refuses (413; A2A -32602) a new task whose first message is more than a task may hold, creating nothing', async () => {
    const c = stack.client;
    const tasksNow = async () => Number((await testDb()('tasks').count({ n: '*' }))[0].n);
    const before = await tasksNow();
    const big = textMessage('x'.repeat(4096));
    const refused = await c.post('/api/task/v1', { message: big });
    assertError(refused, 413, 'payload_too_large');
    assert.equal(refused.body.message, `This message (${Buffer.byteLength(JSON.stringify(big.parts))} bytes) is more than the 4096 bytes of messages a task may hold (TASK_MESSAGES_MAX_BYTES)`);
    for (const configuration of [{ blocking: false }, { blocking: false, pushNotificationConfig: { url: 'https://example.com/hook' } }]) {
      const rpc = await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 8, method: 'message/send',
        params: { message: { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text: 'y'.repeat(4096) }] }, configuration } });
      assert.equal(rpc.body.error?.code, -32602, rpc.text);
      assert.match(rpc.body.error.message, /TASK_MESSAGES_MAX_BYTES/);
    }
    assert.equal(await tasksNow(), before, 'nothing stored');
    assert.equal((await c.post('/api/task/v1', { message: textMessage('x'.repeat(4096 - 32)) })).status, 201, 'what fits is taken');
  });

  it('counts the first message, follow-ups and status messages to the byte: what fits exactly is taken, one byte more is not', async () => {
    const c = stack.client;
    const text = (n: number) => textMessage('x'.repeat(n), 'agent');
    const bytes = (n: number) => Buffer.byteLength(JSON.stringify(text(n).parts));
    const id = (await c.post('/api/task/v1', { message: text(1000) })).body.task.id;
    assert.equal((await c.post(`/api/task/v1/${id}/message`, text(1500))).status, 201);
    assert.equal((await c.put(`/api/task/v1/${id}`, { status: 'working', message: text(500) })).status, 200);
    const held = bytes(1000) + bytes(1500) + bytes(500);
    const room = 4096 - held - bytes(0);
    const over = await c.post(`/api/task/v1/${id}/message`, text(room + 1));
    assertError(over, 413, 'payload_too_large');
    assert.match(over.body.message, new RegExp(`^Task '${id}' holds ${held} bytes of messages; this message \\(${bytes(room + 1)} bytes\\)`));
    assert.equal((await c.post(`/api/task/v1/${id}/message`, text(room))).status, 201);
    assert.match((await c.post(`/api/task/v1/${id}/message`, text(0))).body.message, /holds 4096 bytes of messages/);
  });

  it("counts a message's metadata, extensions and accepted output modes with its parts: small parts with a large metadata object do not slip past", async () => {
    const c = stack.client;
    const annotated = (n: number) => ({ ...textMessage('hi', 'agent'), metadata: { note: 'm'.repeat(n) } });
    const bytes = (m: { parts: unknown; metadata: unknown }) => Buffer.byteLength(JSON.stringify(m.parts)) + Buffer.byteLength(JSON.stringify(m.metadata));
    assertError(await c.post('/api/task/v1', { message: annotated(4096) }), 413, 'payload_too_large');
    const first = annotated(2000);
    const id = (await c.post('/api/task/v1', { message: first })).body.task.id;
    const over = await c.post(`/api/task/v1/${id}/message`, annotated(2500));
    assertError(over, 413, 'payload_too_large');
    assert.match(over.body.message, new RegExp(`^Task '${id}' holds ${bytes(first)} bytes of messages; this message \\(${bytes(annotated(2500))} bytes\\)`));
    // A2A: a message's extensions count too.
    const extensions = Array.from({ length: 40 }, (_, i) => `https://example.com/extensions/${'e'.repeat(40)}/${i}`);
    const rpc = await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 7, method: 'message/send',
      params: { message: { kind: 'message', messageId: randomUUID(), taskId: id, role: 'user', parts: [{ kind: 'text', text: 'hi' }], extensions }, configuration: { blocking: false } } });
    assert.equal(rpc.body.error?.code, -32602, rpc.text);
    assert.match(rpc.body.error.message, /TASK_MESSAGES_MAX_BYTES/);
    // And the output modes it accepts, stored with it.
    const acceptedOutputModes = Array.from({ length: 10 }, (_, i) => `application/x-${'m'.repeat(200)}-${i}`);
    const modes = await c.post('/api/a2a/v1', { jsonrpc: '2.0', id: 8, method: 'message/send',
      params: { message: { kind: 'message', messageId: randomUUID(), taskId: id, role: 'user', parts: [{ kind: 'text', text: 'hi' }] }, configuration: { blocking: false, acceptedOutputModes } } });
    assert.equal(modes.body.error?.code, -32602, modes.text);
    assert.match(modes.body.error.message, /TASK_MESSAGES_MAX_BYTES/);
    assert.equal((await c.post(`/api/task/v1/${id}/message`, annotated(1000))).status, 201, 'what fits is taken');
  });

  it('counts a task from before the count was kept from its messages, once', async () => {
    const c = stack.client;
    const text = (n: number) => textMessage('x'.repeat(n), 'agent');
    const id = (await c.post('/api/task/v1', { message: text(1000) })).body.task.id;
    assert.equal((await c.post(`/api/task/v1/${id}/message`, text(1000))).status, 201);
    // As a task of an earlier release holds it: messages, and no count.
    assert.equal(await testDb()('tasks').where({ id }).update({ message_bytes: null }), 1);
    // An empty extensions array counts nothing, as the count kept since does not count it.
    assert.equal(await testDb()('messages').where({ task_id: id }).update({ extensions: testDb().raw("'{}'::text[]") }), 2);
    // Output modes count as the JSON array they are, as for a new message (none stored before the
    // count, but the recount and the count must agree should one be).
    const modes = ['text/plain', 'application/json'];
    assert.equal(await testDb()('messages').where({ task_id: id, seq: testDb()('messages').where({ task_id: id }).min('seq') }).update({ accepted_output_modes: modes }), 1);
    const stored = Number((await testDb()('messages').where({ task_id: id }).select(testDb().raw('sum(octet_length(parts::text))::int as n')))[0].n)
      + Buffer.byteLength(JSON.stringify(modes));
    const over = await c.post(`/api/task/v1/${id}/message`, text(4096 - stored));
    assert.match(over.body.message, new RegExp(`^Task '${id}' holds ${stored} bytes of messages`));
    assert.equal((await c.post(`/api/task/v1/${id}/message`, text(100))).status, 201);
    const [row] = await testDb()('tasks').where({ id }).select('message_bytes');
    assert.equal(Number(row.message_bytes), stored + Buffer.byteLength(JSON.stringify(text(100).parts)));
  });
});

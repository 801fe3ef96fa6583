// The service driven by the real A2A clients: @a2a-js/sdk 0.3.x natively and the 1.x client in
// its v0.3 compatibility mode (legacyCompat). Card discovery, blocking and non-blocking send,
// get with historyLength, cancel (and not-cancelable after), streams, resubscribe, push config CRUD.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { Message, Task, TaskStatusUpdateEvent } from '@a2a-js/sdk';
import * as v03 from '@a2a-js/sdk/client';
import * as v1 from 'a2a-sdk-v1/client';
import * as v1errors from 'a2a-sdk-v1/errors';
import { Role, TaskState, type Part as V1Part } from 'a2a-sdk-v1';
import { freePort } from '../scripts/local-services.ts';
import { ADMIN_KEY, resetDb, startStack, testDb, waitFor, type Stack } from './helpers/stack.ts';

// Both clients take a fetch implementation: this one adds our bearer key.
const authFetch: typeof fetch = (input, init) => {
  const headers = new Headers(init?.headers);
  headers.set('authorization', `Bearer ${ADMIN_KEY}`);
  return fetch(input, { ...init, headers });
};

const userMessage = (text: string, extra: Partial<Message> = {}): Message => ({ kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }], ...extra });
const textOf = (m?: Message) => (m?.parts ?? []).map((p) => (p.kind === 'text' ? p.text : '')).join('');

describe('A2A with the real SDK clients', () => {
  let stack: Stack;
  let baseUrl: string;

  before(async () => {
    await resetDb();
    // The card's url must be where the API listens, so the port is chosen before the start.
    const port = await freePort();
    baseUrl = `http://127.0.0.1:${port}`;
    // A skill with A2A's security requirements, which the 1.x client reads (AGENT_SKILLS_JSON, domain/a2a/skills.ts).
    const skills = [{ id: 'echo', name: 'Echo', description: 'Echoes', tags: ['echo'], security: [{ bearer: [] }] }];
    stack = await startStack({ PORT: String(port), PUBLIC_URL: baseUrl, PUSH_ALLOW_PRIVATE: 'true', AGENT_SKILLS_JSON: JSON.stringify(skills) });
  });
  after(async () => stack?.stop());

  describe('@a2a-js/sdk 0.3.x client', () => {
    let client: v03.Client;

    before(async () => {
      const factory = new v03.ClientFactory(v03.ClientFactoryOptions.createFrom(v03.ClientFactoryOptions.default, {
        transports: [new v03.JsonRpcTransportFactory({ fetchImpl: authFetch })],
        cardResolver: new v03.DefaultAgentCardResolver({ fetchImpl: authFetch }),
      }));
      client = await factory.createFromUrl(baseUrl);
    });

    it('discovers the card at /.well-known/agent-card.json', async () => {
      const card = await client.getAgentCard();
      assert.equal(card.url, `${baseUrl}/api/a2a/v1`);
      assert.equal(card.protocolVersion, '0.3.0');
      assert.equal(card.capabilities.streaming, true);
      const legacy = await v03.A2AClient.fromCardUrl(`${baseUrl}/api/a2a/v1/.well-known/agent.json`, { fetchImpl: authFetch });
      const task = await legacy.getTask({ id: randomUUID() });
      assert.equal((task as { error?: { code: number } }).error?.code, -32001);
    });

    it('sends blocking (completed) and non-blocking (submitted), and gets with historyLength', async () => {
      const done = await client.sendMessage({ message: userMessage('sdk hello') }) as Task;
      assert.equal(done.kind, 'task');
      assert.equal(done.status.state, 'completed');
      assert.equal(textOf(done.status.message), 'Echo: sdk hello');

      const quick = await client.sendMessage({ message: userMessage('sdk quick'), configuration: { blocking: false } }) as Task;
      assert.equal(quick.status.state, 'submitted');

      const got = await client.getTask({ id: done.id, historyLength: 1 });
      assert.equal(got.history?.length, 1);
      assert.equal(got.history?.[0].role, 'agent');
      assert.equal((await client.getTask({ id: done.id })).history?.length, 2);
    });

    it("keeps the sender's messageId, whatever the string; the agent's messages get ids of their own", async () => {
      const sent = userMessage('[input] ids', { messageId: 'client-msg-1' });
      const first = await client.sendMessage({ message: sent }) as Task;
      assert.equal(first.history?.[0].messageId, 'client-msg-1');
      const follow = userMessage('second', { messageId: 'client-msg-1', taskId: first.id, contextId: first.contextId });
      const events = [];
      for await (const e of client.sendMessageStream({ message: follow })) events.push(e);
      const done = await client.getTask({ id: first.id });
      const ids = done.history!.map((m) => [m.role, m.messageId]);
      assert.deepEqual(ids.filter(([role]) => role === 'user'), [['user', 'client-msg-1'], ['user', 'client-msg-1']], 'a reused id is kept too');
      const agentIds = ids.filter(([role]) => role === 'agent').map(([, id]) => id);
      assert.equal(agentIds.length, 2);
      for (const id of agentIds) assert.match(id!, /^[0-9a-f-]{36}$/);
      assert.equal(done.status.message?.messageId, agentIds[1]);
      const streamed = events[0] as Task;
      assert.deepEqual(streamed.history?.filter((m) => m.role === 'user').map((m) => m.messageId), ['client-msg-1', 'client-msg-1']);
    });

    it('continues an input-required task with a follow-up', async () => {
      const first = await client.sendMessage({ message: userMessage('[input] multi') }) as Task;
      assert.equal(first.status.state, 'input-required');
      const second = await client.sendMessage({ message: userMessage('turn two', { taskId: first.id, contextId: first.contextId }) }) as Task;
      assert.equal(second.id, first.id);
      assert.equal(second.status.state, 'completed');
      assert.equal(textOf(second.status.message), 'Echo (turn 2): turn two');
    });

    it('hands the output modes the client accepts to the agent: the demo agent answers a client that takes JSON but not text with data', async () => {
      const json = await client.sendMessage({ message: userMessage('json please'), configuration: { acceptedOutputModes: ['application/json'] } }) as Task;
      assert.equal(json.status.state, 'completed');
      assert.deepEqual(json.status.message?.parts, [{ kind: 'data', data: { echo: 'Echo: json please' } }]);
      // Kept with the message for its agent, not added to the A2A message.
      assert.deepEqual(Object.keys(json.history![0]).sort(), ['contextId', 'kind', 'messageId', 'parts', 'role', 'taskId']);
      const [row] = await testDb()('messages').where({ task_id: json.id, role: 'user' }).select('accepted_output_modes');
      assert.deepEqual(row.accepted_output_modes, ['application/json']);
      for (const modes of [['text', 'application/json'], ['TEXT/*'], ['*/*'], ['image/png'], []]) {
        const t = await client.sendMessage({ message: userMessage('text please'), configuration: { acceptedOutputModes: modes } }) as Task;
        assert.equal(textOf(t.status.message), 'Echo: text please', JSON.stringify(modes));
      }
      const events = [];
      for await (const e of client.sendMessageStream({ message: userMessage('streamed json'), configuration: { acceptedOutputModes: ['application/json; charset=utf-8'] } })) events.push(e);
      const final = events.at(-1) as TaskStatusUpdateEvent;
      assert.deepEqual(final.status.message?.parts, [{ kind: 'data', data: { echo: 'Echo: streamed json' } }]);
    });

    describe('a retried send (same messageId, role and content as a message the task holds)', () => {
      const userTexts = async (taskId: string) => (await testDb()('messages').where({ task_id: taskId, role: 'user' }).orderBy('seq').select('parts'))
        .map((m: { parts: { text: string }[] }) => m.parts[0].text);
      const waiting = async (text: string) => {
        const first = await client.sendMessage({ message: userMessage(`[input] ${text}`) }) as Task;
        assert.equal(first.status.state, 'input-required');
        return first;
      };

      it('while the answer is still to run is stored once, runs the agent once, and answers the task as it ends', async () => {
        const first = await waiting('retry pending');
        const answer = userMessage('the answer', { taskId: first.id });
        const sent = await client.sendMessage({ message: answer, configuration: { blocking: false } }) as Task;
        assert.equal(sent.id, first.id);
        const retried = await client.sendMessage({ message: answer }) as Task;
        assert.equal(retried.id, first.id);
        assert.equal(retried.status.state, 'completed');
        assert.equal(textOf(retried.status.message), 'Echo (turn 2): the answer');
        assert.deepEqual(await userTexts(first.id), ['[input] retry pending', 'the answer']);
        const runs = await testDb()('timeline_items').where({ task_id: first.id }).whereRaw(`event_payload->>'status' = 'working'`).count({ n: '*' });
        assert.equal(Number(runs[0].n), 2, 'one run for the first message, one for the answer');
      });

      it('after the task asked for input again and a later message started another run answers at once with the task as it stands', async () => {
        // Before, a blocking retry waited for the later message's run to end (or A2A_BLOCKING_TIMEOUT_MS):
        // the task was not settled now, so the original's turn was taken to be still to come.
        const first = await waiting('retry moved on');
        const answer = userMessage('[input] once more', { taskId: first.id });
        assert.equal(((await client.sendMessage({ message: answer })) as Task).status.state, 'input-required');
        const later = await client.sendMessage({ message: userMessage('[sleep 8000] later', { taskId: first.id }), configuration: { blocking: false } }) as Task;
        assert.equal(later.id, first.id);
        await waitFor(async () => (await client.getTask({ id: first.id })).status.state === 'working', 'the later run to start');
        const retried = await client.sendMessage({ message: answer }) as Task;
        assert.equal(retried.status.state, 'working');
        assert.deepEqual(await userTexts(first.id), ['[input] retry moved on', '[input] once more', '[sleep 8000] later']);
        await client.cancelTask({ id: first.id });
      });

      it('after the task ended returns the ended task (blocking or not), not -32600, storing nothing', async () => {
        const first = await waiting('retry ended');
        const answer = userMessage('last word', { taskId: first.id, contextId: first.contextId });
        const done = await client.sendMessage({ message: answer }) as Task;
        assert.equal(done.status.state, 'completed');
        const items = await testDb()('timeline_items').where({ task_id: first.id }).count({ n: '*' });
        for (const configuration of [{}, { blocking: false }]) {
          const retried = await client.sendMessage({ message: answer, configuration }) as Task;
          assert.equal(retried.status.state, 'completed');
          assert.deepEqual(retried.status, done.status);
          assert.deepEqual(retried.history, done.history);
        }
        assert.deepEqual(await testDb()('timeline_items').where({ task_id: first.id }).count({ n: '*' }), items);
        await assert.rejects(client.sendMessage({ message: userMessage('last word', { taskId: first.id }) }), /is completed.*-32600/);
      });

      it('of a new task (no taskId) returns the task the first send created, blocking, not, or streamed, and runs the agent once', async () => {
        const opening = userMessage('open once');
        const sent = await client.sendMessage({ message: opening, configuration: { blocking: false } }) as Task;
        const done = await client.sendMessage({ message: opening }) as Task;
        assert.equal(done.id, sent.id);
        assert.equal(done.contextId, sent.contextId);
        assert.equal(done.status.state, 'completed');
        assert.equal(textOf(done.status.message), 'Echo: open once');
        const again = await client.sendMessage({ message: { ...opening, contextId: sent.contextId }, configuration: { blocking: false } }) as Task;
        assert.equal(again.id, sent.id);
        assert.deepEqual(again.status, done.status);
        const events = [];
        for await (const e of client.sendMessageStream({ message: opening })) events.push(e);
        assert.equal((events[0] as Task).kind, 'task');
        assert.equal((events[0] as Task).id, sent.id);
        const final = events.at(-1) as TaskStatusUpdateEvent;
        assert.equal(final.final, true);
        assert.equal(final.taskId, sent.id);
        assert.equal(final.status.state, 'completed');
        const opened = await testDb()('messages').where({ client_message_id: opening.messageId }).count({ n: '*' });
        assert.equal(Number(opened[0].n), 1, 'one task, one opening message');
        assert.deepEqual(await userTexts(sent.id), ['open once']);
        const runs = await testDb()('timeline_items').where({ task_id: sent.id }).whereRaw(`event_payload->>'status' = 'working'`).count({ n: '*' });
        assert.equal(Number(runs[0].n), 1);
      });

      it('of a new task sent twice at once creates one task; the same messageId with other text is a task of its own', async () => {
        const opening = userMessage('opened twice');
        const both = await Promise.all([client.sendMessage({ message: opening }), client.sendMessage({ message: opening })]) as Task[];
        assert.equal(both[0].id, both[1].id);
        for (const t of both) assert.equal(t.status.state, 'completed');
        const other = await client.sendMessage({ message: { ...opening, parts: [{ kind: 'text', text: 'something else' }] } }) as Task;
        assert.notEqual(other.id, both[0].id);
        assert.equal(textOf(other.status.message), 'Echo: something else');
      });

      it('sent twice at once is stored once', async () => {
        const first = await waiting('retry race');
        const answer = userMessage('raced', { taskId: first.id });
        const both = await Promise.all([client.sendMessage({ message: answer }), client.sendMessage({ message: answer })]) as Task[];
        for (const t of both) assert.equal(t.status.state, 'completed');
        assert.deepEqual(await userTexts(first.id), ['[input] retry race', 'raced']);
      });
    });

    it('cancels a running task; a second cancel is TaskNotCancelable', async () => {
      const task = await client.sendMessage({ message: userMessage('[sleep 60000] long'), configuration: { blocking: false } }) as Task;
      const canceled = await client.cancelTask({ id: task.id });
      assert.equal(canceled.status.state, 'canceled');
      await assert.rejects(client.cancelTask({ id: task.id }), v03.TaskNotCancelableError);
      await assert.rejects(client.getTask({ id: randomUUID() }), v03.TaskNotFoundError);
    });

    it('streams to the end and resubscribes', async () => {
      const events = [];
      for await (const e of client.sendMessageStream({ message: userMessage('[sleep 300] [artifact] sdk stream') })) events.push(e);
      assert.equal(events[0].kind, 'task');
      const last = events.at(-1) as TaskStatusUpdateEvent;
      assert.equal(last.kind, 'status-update');
      assert.equal(last.final, true);
      assert.equal(last.status.state, 'completed');
      assert.ok(events.some((e) => e.kind === 'artifact-update'));

      const running = await client.sendMessage({ message: userMessage('[sleep 800] resub'), configuration: { blocking: false } }) as Task;
      const again = [];
      for await (const e of client.resubscribeTask({ id: running.id })) again.push(e);
      assert.equal(again[0].kind, 'task');
      assert.equal((again.at(-1) as TaskStatusUpdateEvent).status.state, 'completed');
    });

    it('reads a stream refused for its task (unknown, terminal) as the JSON-RPC error, not a broken transport', async () => {
      const drain = async (events: AsyncIterable<unknown>) => { for await (const _ of events) { /* until the error */ } };
      await assert.rejects(drain(client.resubscribeTask({ id: randomUUID() })), /Task not found: .*\(Code: -32001\)/);
      const done = await client.sendMessage({ message: userMessage('finished') }) as Task;
      assert.equal(done.status.state, 'completed');
      await assert.rejects(drain(client.sendMessageStream({ message: userMessage('too late', { taskId: done.id }) })), (err: Error) => {
        assert.match(err.message, /is completed.*\(Code: -32600\)/, String(err));
        return true;
      });
    });

    it('push notification configs: set, get, list, delete, inline with message/send (token never returned)', async () => {
      const task = await client.sendMessage({ message: userMessage('[input] push') }) as Task;
      const set = await client.setTaskPushNotificationConfig({ taskId: task.id, pushNotificationConfig: { id: 'hook-1', url: 'http://127.0.0.1:9/hook', token: 'secret-token' } });
      assert.equal(set.pushNotificationConfig.id, 'hook-1');
      assert.equal(set.pushNotificationConfig.token, undefined);
      const got = await client.getTaskPushNotificationConfig({ id: task.id, pushNotificationConfigId: 'hook-1' } as never);
      assert.equal(got.pushNotificationConfig.url, 'http://127.0.0.1:9/hook');
      assert.equal(got.pushNotificationConfig.token, undefined);
      const list = await client.listTaskPushNotificationConfig({ id: task.id });
      assert.deepEqual(list.map((c) => c.pushNotificationConfig.id), ['hook-1']);
      await client.deleteTaskPushNotificationConfig({ id: task.id, pushNotificationConfigId: 'hook-1' });
      assert.deepEqual(await client.listTaskPushNotificationConfig({ id: task.id }), []);

      const inline = await client.sendMessage({ message: userMessage('[input] inline push'), configuration: { pushNotificationConfig: { id: 'inline', url: 'http://127.0.0.1:9/inline', token: 'inline-token' } } }) as Task;
      const configs = await client.listTaskPushNotificationConfig({ id: inline.id });
      assert.deepEqual(configs.map((c) => [c.pushNotificationConfig.id, c.pushNotificationConfig.url, c.pushNotificationConfig.token]), [['inline', 'http://127.0.0.1:9/inline', undefined]]);
    });
  });

  describe('@a2a-js/sdk 1.x client in v0.3 compatibility mode', () => {
    let client: v1.Client;
    const text = (value: string): V1Part => ({ content: { $case: 'text', value }, metadata: undefined, filename: '', mediaType: '' });
    const v1Message = (value: string, ids: { taskId?: string; contextId?: string } = {}) => ({
      messageId: randomUUID(), role: Role.ROLE_USER, parts: [text(value)], contextId: ids.contextId ?? '', taskId: ids.taskId ?? '',
      metadata: undefined, extensions: [], referenceTaskIds: [],
    });
    const send = (value: string, opts: { taskId?: string; contextId?: string; returnImmediately?: boolean; acceptedOutputModes?: string[] } = {}) => client.sendMessage({
      tenant: '', metadata: undefined, message: v1Message(value, opts),
      configuration: { acceptedOutputModes: opts.acceptedOutputModes ?? [], taskPushNotificationConfig: undefined, returnImmediately: opts.returnImmediately ?? false },
    });
    const asTask = (r: unknown) => r as { id: string; contextId: string; status?: { state: TaskState; message?: { parts: V1Part[] } }; history: unknown[] };
    const v1Text = (parts?: V1Part[]) => (parts ?? []).map((p) => (p.content?.$case === 'text' ? p.content.value : '')).join('');

    before(async () => {
      const factory = new v1.ClientFactory({
        transports: [new v1.JsonRpcTransportFactory({ fetchImpl: authFetch, legacyCompat: { enabled: true } })],
        cardResolver: new v1.DefaultAgentCardResolver({ fetchImpl: authFetch, legacyCompat: { enabled: true } }),
      });
      client = await factory.createFromUrl(baseUrl);
    });

    it('discovers the v0.3 card and picks the compat transport', async () => {
      const card = await client.getAgentCard();
      assert.equal(card.name, 'taskbridge');
      assert.match(client.protocolVersion, /^0\.3/);
      assert.deepEqual(card.skills.map((k) => [k.id, k.securityRequirements]), [['echo', [{ schemes: { bearer: { list: [] } } }]]]);
    });

    it('sends blocking and non-blocking, gets with historyLength', async () => {
      const done = asTask(await send('v1 hello'));
      assert.equal(done.status?.state, TaskState.TASK_STATE_COMPLETED);
      assert.equal(v1Text(done.status?.message?.parts), 'Echo: v1 hello');
      const quick = asTask(await send('v1 quick', { returnImmediately: true }));
      assert.equal(quick.status?.state, TaskState.TASK_STATE_SUBMITTED);
      const got = await client.getTask({ tenant: '', id: done.id, historyLength: 1 });
      assert.equal(got.history.length, 1);
    });

    it('sends the output modes it accepts: JSON only gets the demo agent\'s echo as data', async () => {
      const done = asTask(await send('v1 json', { acceptedOutputModes: ['application/json'] }));
      assert.equal(done.status?.state, TaskState.TASK_STATE_COMPLETED);
      const parts = done.status?.message?.parts ?? [];
      assert.deepEqual(parts.map((p) => p.content), [{ $case: 'data', value: { echo: 'Echo: v1 json' } }]);
    });

    it('continues an input-required task', async () => {
      const first = asTask(await send('[input] v1 multi'));
      assert.equal(first.status?.state, TaskState.TASK_STATE_INPUT_REQUIRED);
      const second = asTask(await send('v1 turn two', { taskId: first.id, contextId: first.contextId }));
      assert.equal(second.id, first.id);
      assert.equal(second.status?.state, TaskState.TASK_STATE_COMPLETED);
    });

    it('cancels; a second cancel is TaskNotCancelable, an unknown id TaskNotFound', async () => {
      const task = asTask(await send('[sleep 60000] v1 long', { returnImmediately: true }));
      const canceled = await client.cancelTask({ tenant: '', id: task.id, metadata: undefined });
      assert.equal(canceled.status?.state, TaskState.TASK_STATE_CANCELED);
      await assert.rejects(client.cancelTask({ tenant: '', id: task.id, metadata: undefined }), v1errors.TaskNotCancelableError);
      await assert.rejects(client.getTask({ tenant: '', id: randomUUID() }), v1errors.TaskNotFoundError);
    });

    it('streams to the end and resubscribes', async () => {
      const kinds: string[] = [];
      for await (const e of client.sendMessageStream({
        tenant: '', metadata: undefined, message: v1Message('[sleep 300] [artifact] v1 stream'),
        configuration: { acceptedOutputModes: [], taskPushNotificationConfig: undefined, returnImmediately: false },
      })) kinds.push(e.payload?.$case ?? 'none');
      assert.equal(kinds[0], 'task');
      assert.equal(kinds.at(-1), 'statusUpdate');
      assert.ok(kinds.includes('artifactUpdate'));

      const running = asTask(await send('[sleep 800] v1 resub', { returnImmediately: true }));
      let last: unknown;
      for await (const e of client.resubscribeTask({ tenant: '', id: running.id })) last = e.payload;
      assert.equal((last as { $case: string; value: { status: { state: TaskState } } }).value.status.state, TaskState.TASK_STATE_COMPLETED);
    });

    it('reads a stream refused for an unknown task as the JSON-RPC error', async () => {
      await assert.rejects((async () => { for await (const _ of client.resubscribeTask({ tenant: '', id: randomUUID() })) { /* until the error */ } })(), /Task not found: .*\(Code: -32001\)/);
    });

    it('push notification configs: create, get, list, delete', async () => {
      const task = asTask(await send('[input] v1 push'));
      const created = await client.createTaskPushNotificationConfig({ tenant: '', id: 'v1-hook', taskId: task.id, url: 'http://127.0.0.1:9/v1', token: 'v1-secret', authentication: undefined });
      assert.equal(created.id, 'v1-hook');
      assert.equal(created.token, '');
      const got = await client.getTaskPushNotificationConfig({ tenant: '', taskId: task.id, id: 'v1-hook' });
      assert.equal(got.url, 'http://127.0.0.1:9/v1');
      const list = await client.listTaskPushNotificationConfig({ tenant: '', taskId: task.id, pageSize: 10, pageToken: '' });
      assert.deepEqual(list.configs.map((c) => c.id), ['v1-hook']);
      await client.deleteTaskPushNotificationConfig({ tenant: '', taskId: task.id, id: 'v1-hook' });
      assert.equal((await client.listTaskPushNotificationConfig({ tenant: '', taskId: task.id, pageSize: 10, pageToken: '' })).configs.length, 0);
    });
  });
});

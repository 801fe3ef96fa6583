// The A2A v0.3 JSON-RPC endpoint over raw HTTP: the compatibility kit's mandatory checks
// (error cases with ids echoed, card fields, continuing a task, unknown task ids) and junk params.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { ADMIN_KEY, startStack, testDb, useStack, waitFor } from './helpers/stack.ts';

const A2A = '/api/a2a/v1';
const userMessage = (text: string, extra: Record<string, unknown> = {}) => ({ kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }], ...extra });

describe('A2A JSON-RPC endpoint', () => {
  const stack = useStack({ PUBLIC_URL: 'https://agents.example.com', AGENT_NAME: 'test-agent', AGENT_SKILLS_JSON: JSON.stringify([{ id: 'echo', name: 'Echo', description: 'Echoes', tags: ['echo'] }]) });
  let nextId = 1;
  const raw = async (payload: string, headers: Record<string, string> = {}) => {
    const res = await fetch(stack.api.url + A2A, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', ...headers }, body: payload });
    const text = await res.text();
    // A stream refused for its task is one SSE event holding the error.
    const json = res.headers.get('content-type')?.startsWith('text/event-stream') ? text.split('\n').find((l) => l.startsWith('data: '))?.slice(6) ?? '' : text;
    return { status: res.status, body: JSON.parse(json), headers: res.headers };
  };
  const rpc = async (method: string, params?: unknown, id: unknown = nextId++) => raw(JSON.stringify({ jsonrpc: '2.0', id, method, ...(params === undefined ? {} : { params }) }));

  describe('envelope errors (HTTP 200, id echoed)', () => {
    it('bad JSON is -32700 with id null', async () => {
      const r = await raw('{"jsonrpc": "2.0", "id": 1, "method": ');
      assert.equal(r.status, 200);
      assert.equal(r.body.jsonrpc, '2.0');
      assert.equal(r.body.id, null);
      assert.equal(r.body.error.code, -32700);
    });

    it('an empty body is -32700', async () => {
      const r = await raw('');
      assert.equal(r.status, 200);
      assert.equal(r.body.error.code, -32700);
    });

    it('missing or wrong jsonrpc is -32600 with the id echoed', async () => {
      let r = await raw(JSON.stringify({ id: 'abc', method: 'tasks/get', params: { id: randomUUID() } }));
      assert.equal(r.status, 200);
      assert.deepEqual([r.body.id, r.body.error.code], ['abc', -32600]);
      r = await raw(JSON.stringify({ jsonrpc: '1.0', id: 7, method: 'tasks/get', params: { id: randomUUID() } }));
      assert.deepEqual([r.body.id, r.body.error.code], [7, -32600]);
    });

    it('a non-object request, a batch, a bad id type, a missing method are -32600', async () => {
      for (const payload of ['"hello"', '42', '[]', JSON.stringify([{ jsonrpc: '2.0', id: 1, method: 'tasks/get' }]), JSON.stringify({ jsonrpc: '2.0', id: { x: 1 }, method: 'tasks/get' }), JSON.stringify({ jsonrpc: '2.0', id: 3 }), JSON.stringify({ jsonrpc: '2.0', id: 4, method: 5 })]) {
        const r = await raw(payload);
        assert.equal(r.status, 200, payload);
        assert.equal(r.body.error.code, -32600, payload);
      }
      const r = await raw(JSON.stringify({ jsonrpc: '2.0', id: 3 }));
      assert.equal(r.body.id, 3);
    });

    it('a number id that cannot be echoed exactly (past 2^53, or past the double range) is -32600 with id null', async () => {
      for (const id of ['9007199254740993', '12345678901234567890', '-9007199254740993', '1e400']) {
        const r = await raw(`{"jsonrpc":"2.0","id":${id},"method":"tasks/get","params":{"id":"${randomUUID()}"}}`);
        assert.equal(r.status, 200);
        assert.strictEqual(r.body.id, null, id);
        assert.equal(r.body.error.code, -32600, id);
        assert.match(r.body.error.message, /^Invalid request: id (must be a string, a number of at most 2\^53 - 1|is a number too large)/);
      }
      const largest = await raw(`{"jsonrpc":"2.0","id":9007199254740991,"method":"tasks/explode"}`);
      assert.strictEqual(largest.body.id, Number.MAX_SAFE_INTEGER);
      assert.equal(largest.body.error.code, -32601);
    });

    it('a number id that JSON reads as another number (1e-400 as 0, digits past a double) is -32600 with id null, and runs nothing', async () => {
      const messageId = randomUUID();
      for (const [id, readAs] of [['1e-400', '0'], ['123456789.123456789', '123456789.12345679'], ['1.00000000000000001', '1'], ['-1e-400', '0']]) {
        const send = JSON.stringify({ jsonrpc: '2.0', id: '<id>', method: 'message/send', params: { message: { ...userMessage('never sent'), messageId } } }).replace('"<id>"', id);
        for (const payload of [send, `{"jsonrpc":"2.0","id":${id},"method":"tasks/explode"}`]) {
          const r = await raw(payload);
          assert.equal(r.status, 200);
          assert.strictEqual(r.body.id, null, payload);
          assert.equal(r.body.error.code, -32600, payload);
          assert.equal(r.body.error.message, `Invalid request: id ${id} would be echoed as ${readAs}, another number (JSON numbers are read as doubles): send it as a string or an integer`);
        }
      }
      assert.equal(await testDb()('messages').where({ client_message_id: messageId }).first(), undefined, 'no message stored');
      // Numbers written back as the number sent are echoed, in JSON's shortest spelling; the id a
      // member of params names is not the request's.
      for (const [id, echoed] of [['1e3', 1000], ['1.5', 1.5], ['0.1', 0.1], ['-0', 0], ['2.50e-3', 0.0025], ['7', 7]] as const) {
        const r = await raw(`{"params":{"id":1e-400,"x":{"id":1e-400}},"jsonrpc":"2.0","id":${id},"method":"tasks/explode"}`);
        assert.deepEqual([r.body.id, r.body.error.code], [echoed, -32601], id);
      }
      // JSON.parse keeps the last of two ids: so does the check.
      const last = await raw('{"jsonrpc":"2.0","id":1e-400,"\\u0069d":5,"method":"tasks/explode"}');
      assert.deepEqual([last.body.id, last.body.error.code], [5, -32601]);
      // A long literal is read in one pass (a regular expression over its zeros took minutes).
      const long = await raw(`{"jsonrpc":"2.0","id":1.${'0'.repeat(500_000)}1,"method":"tasks/explode"}`);
      assert.deepEqual([long.body.id, long.body.error.code], [null, -32600]);
      assert.match(long.body.error.message, /^Invalid request: id 1\.0+… \(500003 characters\) would be echoed as 1, another number/);
      // Beside a value in params that cannot be stored (-32602, the id echoed), it is refused first.
      const both = await raw(`{"jsonrpc":"2.0","id":1e-400,"method":"message/send","params":{"message":${JSON.stringify(userMessage('\u0000'))}}}`);
      assert.deepEqual([both.body.id, both.body.error.code], [null, -32600], JSON.stringify(both.body));
      assert.match(both.body.error.message, /^Invalid request: id 1e-400 would be echoed as 0/);
    });

    it('a member beside jsonrpc, id, method and params is -32600 naming it, with the id echoed, and runs nothing', async () => {
      const message = userMessage('never sent');
      for (const [extra, named] of [['"foo":1', 'foo'], ['"result":{}', 'result'], ['"__proto__":{"x":1}', '__proto__'], ['"Params":{}', 'Params']]) {
        const r = await raw(`{"jsonrpc":"2.0","id":"x-1",${extra},"method":"message/send","params":${JSON.stringify({ message })}}`);
        assert.equal(r.status, 200);
        assert.deepEqual([r.body.id, r.body.error.code], ['x-1', -32600], extra);
        assert.equal(r.body.error.message, `Invalid request: unknown member '${named}' (a request has jsonrpc, id, method and params)`);
        // A streaming method is refused the same way, not answered with a stream.
        const stream = await raw(`{"jsonrpc":"2.0","id":"x-2",${extra},"method":"message/stream","params":${JSON.stringify({ message })}}`);
        assert.equal(stream.headers.get('content-type')?.split(';')[0], 'application/json', extra);
        assert.deepEqual([stream.body.id, stream.body.error.code], ['x-2', -32600], extra);
      }
      assert.equal(await testDb()('messages').where({ client_message_id: message.messageId }).first(), undefined, 'no message stored');
    });

    it('unknown methods are -32601, with string, number and null ids echoed', async () => {
      for (const id of ['req-1', 42, null, 0, '']) {
        const r = await rpc('tasks/explode', {}, id);
        assert.equal(r.status, 200);
        assert.equal(r.body.error.code, -32601);
        assert.strictEqual(r.body.id, id);
      }
      const proto = await rpc('__proto__', {});
      assert.equal(proto.body.error.code, -32601);
    });

    it('a query string on the endpoint URL (a tracing or cache-busting parameter) changes nothing: JSON-RPC answers, HTTP 200', async () => {
      const unknown = randomUUID();
      const res = await fetch(`${stack.api.url}${A2A}?trace=1&v=0.3`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 'q-1', method: 'tasks/get', params: { id: unknown } }) });
      assert.equal(res.status, 200);
      const body = await res.json() as { id: unknown; error?: { code: number } };
      assert.deepEqual([body.id, body.error?.code], ['q-1', -32001]);
      const sent = await fetch(`${stack.api.url}${A2A}?x`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'message/send', params: { message: userMessage('hello'), configuration: { blocking: false } } }) });
      assert.equal(sent.status, 200);
      const task = ((await sent.json()) as { result: { kind: string; id: string } }).result;
      assert.equal(task.kind, 'task');
      assert.ok(await testDb()('tasks').where({ id: task.id }).first());
    });

    it('an unknown method is named as MCP names it: in full when short, a long one by its start and length, control characters escaped', async () => {
      for (const [method, message] of [
        ['tasks/explode', 'Method not found: tasks/explode'],
        ['m'.repeat(5000), `Method not found: ${'m'.repeat(60)}… (5000 characters)`],
        // Not cut inside a surrogate pair.
        [`a${'\u{1F600}'.repeat(3000)}`, `Method not found: a${'\u{1F600}'.repeat(29)}… (6001 characters)`],
        ['tasks/get\nX-Forged: 1\u0007', 'Method not found: tasks/get\\nX-Forged: 1\\u0007'],
      ]) {
        const r = await rpc(method, {});
        assert.deepEqual([r.status, r.body.error], [200, { code: -32601, message }], method.slice(0, 60));
      }
    });

    it('a request without an id is told an unknown method (-32601) or bad params (-32602) first, else -32600, and runs nothing', async () => {
      const tasks = async () => Number((await testDb()('tasks').count({ n: '*' }))[0].n);
      const before = await tasks();
      const cases: [Record<string, unknown>, number, RegExp][] = [
        [{ method: 'message/ssend', params: {} }, -32601, /^Method not found: message\/ssend$/],
        [{ method: 'message/send', params: { '': 'not_a_dict' } }, -32602, /^Invalid params: params\.message is required$/],
        [{ method: 'message/stream', params: 'not_a_dict' }, -32602, /^Invalid params: params must be object$/],
        [{ params: {} }, -32600, /method must be a string/],
        [{ method: 'message/send', params: { message: userMessage('a notification') } }, -32600, /notifications are not supported/],
        [{ method: 'message/stream', params: { message: userMessage('a notification') } }, -32600, /notifications are not supported/],
      ];
      for (const [request, code, message] of cases) {
        const r = await raw(JSON.stringify({ jsonrpc: '2.0', ...request }));
        assert.equal(r.status, 200, JSON.stringify(request));
        assert.equal(r.headers.get('content-type')?.startsWith('application/json'), true, JSON.stringify(request));
        assert.deepEqual([r.body.jsonrpc, r.body.id, r.body.error.code], ['2.0', null, code], JSON.stringify(request));
        assert.match(r.body.error.message, message);
      }
      assert.equal(await tasks(), before);
    });

    it('bad params are -32602 naming the field', async () => {
      const cases: [string, unknown, RegExp][] = [
        ['message/send', undefined, /^Invalid params: params is required$/],
        ['message/send', [], /params/],
        ['message/send', {}, /params\.message is required/],
        ['message/send', { message: { ...userMessage('x'), parts: [] } }, /params\.message\.parts/],
        ['message/send', { message: { ...userMessage('x'), parts: [{ kind: 'video', url: 'x' }] } }, /kind must be one of text, data, file/],
        ['message/send', { message: { ...userMessage('x'), parts: [{ kind: 'text' }] } }, /params\.message\.parts\[0\]\.text is required/],
        ...[{ name: 'a' }, { bytes: 'aGk=', uri: 'https://example.com/a' }].map((file): [string, unknown, RegExp] =>
          ['message/send', { message: { ...userMessage('x'), parts: [{ kind: 'file', file }] } }, /^Invalid params: params\.message\.parts\[0\]\.file must have exactly one of bytes or uri$/]),
        ['message/send', { message: { ...userMessage('x'), parts: [{ kind: 'data', data: 'nope' }] } }, /params\.message\.parts\[0\]\.data/],
        ['message/send', { message: userMessage('x', { extensions: [''] }) }, /params\.message\.extensions\[0\]/],
        ['message/send', { message: userMessage('x', { extensions: 'urn:x' }) }, /params\.message\.extensions/],
        ...['a=', 'aGk', 'aGk-_w==', 'aG=k'].map((bytes): [string, unknown, RegExp] =>
          ['message/send', { message: { ...userMessage('x'), parts: [{ kind: 'file', file: { bytes } }] } }, /params\.message\.parts\[0\]\.file\.bytes must be base64/]),
        ['message/send', { message: userMessage('x', { role: 'agent' }) }, /params\.message\.role/],
        ['message/send', { message: userMessage('x', { contextId: 'not-a-uuid' }) }, /params\.message\.contextId/],
        // ajv's uuid format takes the URN form, which Postgres refuses: it was -32603 internal error.
        ['message/send', { message: userMessage('x', { contextId: `urn:uuid:${randomUUID()}` }), configuration: { blocking: false } }, /^Invalid params: params\.message\.contextId must be a UUID$/],
        ['message/send', { message: userMessage('x', { referenceTaskIds: [`urn:uuid:${randomUUID()}`] }) }, /^Invalid params: params\.message\.referenceTaskIds\[0\] must be a UUID$/],
        ['message/stream', { message: userMessage('x', { contextId: `urn:uuid:${randomUUID()}` }) }, /^Invalid params: params\.message\.contextId must be a UUID$/],
        ['message/send', { message: userMessage('x'), configuration: { historyLength: -1 } }, /historyLength/],
        ['message/send', { message: userMessage('x'), configuration: { blocking: 'yes' } }, /blocking/],
        ['message/send', { message: userMessage('x'), configuration: { acceptedOutputModes: 'application/json' } }, /^Invalid params: params\.configuration\.acceptedOutputModes must be array$/],
        ['message/send', { message: userMessage('x'), configuration: { acceptedOutputModes: ['text/plain', ''] } }, /params\.configuration\.acceptedOutputModes\[1\]/],
        ['message/send', { message: userMessage('x'), configuration: { acceptedOutputModes: ['a\nb'] } }, /params\.configuration\.acceptedOutputModes\[0\] must not contain control characters/],
        ['message/send', { message: userMessage('x', { taskId: 't'.repeat(257) }) }, /params\.message\.taskId/],
        ['tasks/get', { id: 5 }, /params\.id/],
        ['tasks/get', { id: randomUUID(), historyLength: 'all' }, /historyLength/],
        ['tasks/cancel', null, /params/],
        // Its params may be left out, null or an object: said once, not as each branch of a union and ajv's anyOf.
        ['agent/getAuthenticatedExtendedCard', [], /^Invalid params: params must be object or null$/],
        ['tasks/pushNotificationConfig/set', { taskId: randomUUID() }, /pushNotificationConfig is required/],
        // A misspelt token or credentials was dropped in silence: the webhook got posts without them.
        ['message/send', { message: userMessage('x'), configuration: { blocking: false, pushNotificationConfig: { url: 'https://example.com/hook', tokn: 'secret-1' } } }, /^Invalid params: params\.configuration\.pushNotificationConfig\.tokn is not an allowed member$/],
        ['tasks/pushNotificationConfig/set', { taskId: randomUUID(), pushNotificationConfig: { url: 'https://example.com/hook', authentcation: { schemes: ['Bearer'], credentials: 'c' } } }, /^Invalid params: params\.pushNotificationConfig\.authentcation is not an allowed member$/],
        ['tasks/pushNotificationConfig/set', { taskId: randomUUID(), pushNotificationConfig: { url: 'https://example.com/hook', authentication: { schemes: ['Bearer'], credential: 'c' } } }, /^Invalid params: params\.pushNotificationConfig\.authentication\.credential is not an allowed member$/],
        // A webhook host no resolver takes (over 255 characters) is the caller's to mend: it was -32603 "retry shortly".
        ['message/send', { message: userMessage('x'), configuration: { blocking: false, pushNotificationConfig: { url: `https://x.${'a'.repeat(300)}.com/hook` } } }, /^Push notification URL host 'x\.a+\.com' cannot be resolved \(EINVAL\)$/],
      ];
      const tasks = async () => Number((await testDb()('tasks').count({ n: '*' }))[0].n);
      const before = await tasks();
      for (const [method, params, pattern] of cases) {
        const id = `bad-${nextId++}`;
        const r = await rpc(method, params, id);
        assert.equal(r.status, 200);
        assert.equal(r.body.id, id);
        assert.equal(r.body.error?.code, -32602, `${method} ${JSON.stringify(params)}: ${JSON.stringify(r.body)}`);
        assert.match(r.body.error.message, pattern);
      }
      assert.deepEqual((await rpc('agent/getAuthenticatedExtendedCard', 5)).body.error.data, { errors: [{ path: 'params', message: 'must be object or null' }] });
      // A part without a kind is one error (it was two: the kind required, and the part's kind not one of the three).
      const kindless = await rpc('message/send', { message: { ...userMessage('x'), parts: [{ text: 'x' }] } });
      assert.deepEqual(kindless.body.error.data, { errors: [{ path: 'params.message.parts[0].kind', message: 'is required' }] });
      const unknownKind = await rpc('message/send', { message: { ...userMessage('x'), parts: [{ kind: 'video', text: 'x' }] } });
      assert.deepEqual(unknownKind.body.error.data, { errors: [{ path: 'params.message.parts[0].kind', message: 'must be one of text, data, file' }] });
      assert.equal(await tasks(), before, 'no refused message made a task');
    });

    it('junk params never crash the handler', async () => {
      const junk: unknown[] = [null, 0, 'x', true, [], [1, 2], { id: null }, { id: {} }, { id: 'x'.repeat(10000) }, { message: null }, { message: { parts: 'x' } },
        { message: { kind: 'message', messageId: 1, role: 'user', parts: [{}] } }, { taskId: [], pushNotificationConfig: { url: 5 } }, { id: '../../etc/passwd' }, { id: "'; drop table tasks; --" }];
      for (const method of ['message/send', 'message/stream', 'tasks/get', 'tasks/cancel', 'tasks/resubscribe', 'tasks/pushNotificationConfig/set', 'tasks/pushNotificationConfig/get', 'tasks/pushNotificationConfig/list', 'tasks/pushNotificationConfig/delete', 'agent/getAuthenticatedExtendedCard']) {
        for (const params of junk) {
          const r = await rpc(method, params, 'j');
          assert.equal(r.status, 200, `${method} ${JSON.stringify(params)}`);
          assert.equal(r.body.id, 'j');
          assert.ok(r.body.error || r.body.result !== undefined);
          if (r.body.error) assert.ok([-32602, -32001].includes(r.body.error.code), `${method} ${JSON.stringify(params)} -> ${JSON.stringify(r.body.error)}`);
        }
      }
      assert.equal((await stack.client.get('/_internal/v1/health')).status, 200);
      assert.ok(!stack.api.logs.some((l) => /"level":50/.test(l)), 'no error logged');
    });

    it('params that cannot be stored (deep nesting, NUL, lone surrogates) are -32602 with the id echoed, not internal errors; for message/stream, as its one SSE event', async () => {
      const deep = '['.repeat(5000) + ']'.repeat(5000);
      const send = (part: string, method = 'message/send') => raw(`{"jsonrpc":"2.0","id":"s","method":"${method}","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[${part}]},"configuration":{"blocking":false}}}`);
      for (const method of ['message/send', 'message/stream']) {
        for (const [part, pattern] of [
          // List items named as a params check names them (parts[0]; before: parts.0).
          [`{"kind":"data","data":{"x":${deep}}}`, /^Invalid params: params\.message\.parts\[0\]\.data\.x\[0\]\[0\].* nests deeper than 64 levels/],
          ['{"kind":"text","text":"a\\u0000b"}', /^Invalid params: params\.message\.parts\[0\]\.text contains a NUL character/],
          ['{"kind":"data","data":{"k\\u0000":1}}', /NUL character/],
          ['{"kind":"text","text":"\\ud800"}', /unpaired surrogate/],
        ] as const) {
          const r = await send(part, method);
          assert.equal(r.status, 200);
          // 0.3 clients read a streaming call's answer only as an event stream (the SDK throws on JSON).
          assert.equal(r.headers.get('content-type')?.split(';')[0], method === 'message/stream' ? 'text/event-stream' : 'application/json', `${method} ${part.slice(0, 80)}`);
          assert.deepEqual([r.body.id, r.body.error?.code], ['s', -32602], `${method} ${part.slice(0, 80)}`);
          assert.match(r.body.error.message, pattern);
          // The field in data too, as for every other -32602 (before: no data).
          const [field] = r.body.error.data.errors;
          assert.ok(r.body.error.message.startsWith(`Invalid params: ${field.path} ${field.message}`), JSON.stringify(r.body.error));
        }
      }
      // 100,000 values and the request's own: parsed, each holds tens of bytes in every reader.
      const tasksBefore = Number((await testDb()('tasks').count({ n: '*' }))[0].n);
      // Counted over the whole request, so refused as the request (for a streaming call too, as JSON).
      for (const method of ['message/send', 'message/stream']) {
        const dense = await send(`{"kind":"data","data":{"zeros":[${new Array(100_000).fill(0).join(',')}]}}`, method);
        assert.deepEqual([dense.status, dense.headers.get('content-type')?.split(';')[0], dense.body.id, dense.body.error?.code], [200, 'application/json', 's', -32600], method);
        assert.equal(dense.body.error.message, 'Invalid request: the request holds more than 100000 JSON values');
      }
      assert.equal(Number((await testDb()('tasks').count({ n: '*' }))[0].n), tasksBefore);
      const ok = await send('{"kind":"text","text":"emoji \\ud83d\\ude00 ok"}');
      assert.equal(ok.body.result.history[0].parts[0].text, 'emoji \u{1F600} ok');
    });

    it('needs a bearer key with the a2a scope (HTTP 401 without one)', async () => {
      const r = await fetch(stack.api.url + A2A, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tasks/get', params: { id: randomUUID() } }) });
      assert.equal(r.status, 401);
    });

    // What the README lists as HTTP errors rather than JSON-RPC ones: the request is not read as JSON-RPC.
    it('answers HTTP 403 to a key without the a2a scope and 415 to a body that is not JSON, creating no task', async () => {
      const count = async () => Number((await testDb()('tasks').count({ n: '*' }))[0].n);
      const before = await count();
      const send = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'message/send', params: { message: userMessage('hi') } });
      const reader = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read', 'task:write'] });
      const forbidden = await raw(send, { authorization: `Bearer ${reader.body.key}` });
      assert.deepEqual([forbidden.status, forbidden.body.data.code], [403, 'forbidden']);
      const text = await raw(send, { 'content-type': 'text/plain' });
      assert.deepEqual([text.status, text.body.data.code], [415, 'unsupported_media_type']);
      assert.equal(await count(), before);
    });
  });

  describe('agent card', () => {
    it('is served the same at all three paths, without a key, with the required fields', async () => {
      const paths = [`${A2A}/.well-known/agent.json`, `${A2A}/.well-known/agent-card.json`, '/.well-known/agent-card.json'];
      const cards = await Promise.all(paths.map((p) => stack.client.as(undefined).get(p)));
      for (const c of cards) assert.deepEqual([c.status, c.headers.get('access-control-allow-origin')], [200, '*']);
      assert.deepEqual(cards[1].body, cards[0].body);
      assert.deepEqual(cards[2].body, cards[0].body);
      const card = cards[0].body;
      assert.equal(card.protocolVersion, '0.3.0');
      assert.equal(card.name, 'test-agent');
      assert.equal(typeof card.description, 'string');
      assert.match(card.version, /^\d+\.\d+\.\d+/);
      assert.equal(card.url, 'https://agents.example.com/api/a2a/v1');
      assert.equal(card.preferredTransport, 'JSONRPC');
      assert.deepEqual(card.skills, [{ id: 'echo', name: 'Echo', description: 'Echoes', tags: ['echo'] }]);
      assert.equal(card.capabilities.streaming, true);
      assert.equal(typeof card.capabilities.pushNotifications, 'boolean');
      assert.deepEqual(card.securitySchemes.bearer, { ...card.securitySchemes.bearer, type: 'http', scheme: 'bearer' });
      assert.deepEqual(card.security, [{ bearer: [] }]);
      assert.equal(card.supportsAuthenticatedExtendedCard, true);
      assert.ok(Array.isArray(card.defaultInputModes) && Array.isArray(card.defaultOutputModes));
    });

    it('the extended card needs a key, over HTTP and JSON-RPC', async () => {
      assert.equal((await stack.client.as(undefined).get(`${A2A}/agent/authenticatedExtendedCard`)).status, 401);
      const http = await stack.client.get(`${A2A}/agent/authenticatedExtendedCard`);
      assert.equal(http.status, 200);
      assert.equal(http.body.name, 'test-agent');
      const r = await rpc('agent/getAuthenticatedExtendedCard');
      assert.deepEqual(r.body.result, http.body);
      // What takes a key is not opened to other origins, as the public card is.
      assert.deepEqual([http.headers.get('access-control-allow-origin'), r.headers.get('access-control-allow-origin')], [null, null]);
    });
  });

  describe('tasks', () => {
    it('unknown task ids are -32001 for get, cancel, resubscribe, continuation and push configs', async () => {
      for (const id of [randomUUID(), 'no-such-task']) {
        for (const [method, params] of [
          ['tasks/get', { id }], ['tasks/cancel', { id }], ['tasks/resubscribe', { id }],
          ['message/send', { message: userMessage('hi', { taskId: id }) }],
          ['message/stream', { message: userMessage('hi', { taskId: id }) }],
          ['tasks/pushNotificationConfig/list', { id }],
          // the task is looked up before the URL's host (this one resolves nowhere)
          ['tasks/pushNotificationConfig/set', { taskId: id, pushNotificationConfig: { url: 'https://no-such-host.invalid/hook' } }],
        ] as const) {
          const r = await rpc(method, params, 'u');
          assert.equal(r.status, 200);
          assert.match(r.headers.get('content-type') ?? '', method === 'tasks/resubscribe' || method === 'message/stream' ? /^text\/event-stream/ : /application\/json/);
          assert.equal(r.body.id, 'u');
          assert.equal(r.body.error?.code, -32001, `${method} ${id}: ${JSON.stringify(r.body)}`);
        }
      }
    });

    it('message/send blocks until the task completes and returns it in A2A shape', async () => {
      const r = await rpc('message/send', { message: userMessage('hello a2a') });
      const task = r.body.result;
      assert.equal(task.kind, 'task');
      assert.equal(task.status.state, 'completed');
      assert.match(task.status.timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.equal(task.status.message.role, 'agent');
      assert.deepEqual(task.status.message.parts, [{ kind: 'text', text: 'Echo: hello a2a' }]);
      assert.deepEqual(task.history.map((m: any) => [m.kind, m.role, m.taskId, m.contextId]), [['message', 'user', task.id, task.contextId], ['message', 'agent', task.id, task.contextId]]);
    });

    it('maps every part kind, metadata, referenceTaskIds and extensions one to one', async () => {
      const ref = randomUUID();
      const parts = [
        { kind: 'text', text: 'all parts', metadata: { lang: 'en' } },
        { kind: 'data', data: { n: 1, nested: { ok: true } } },
        { kind: 'file', file: { name: 'a.txt', mimeType: 'text/plain', bytes: Buffer.from('hello').toString('base64') } },
        { kind: 'file', file: { uri: 'https://files.example.com/b.pdf', mimeType: 'application/pdf' } },
      ];
      const extensions = ['https://ext.example.com/citations/v1'];
      const sent = (await rpc('message/send', { message: userMessage('', { parts, referenceTaskIds: [ref], extensions, metadata: { source: 'test' } }), configuration: { blocking: false } })).body.result;
      assert.deepEqual(sent.history[0].extensions, extensions);
      const got = (await rpc('tasks/get', { id: sent.id })).body.result;
      const first = got.history[0];
      assert.deepEqual(first.parts, parts);
      assert.deepEqual(first.referenceTaskIds, [ref]);
      assert.deepEqual(first.extensions, extensions);
      assert.deepEqual(first.metadata, { source: 'test' });
      assert.deepEqual([first.kind, first.role, first.taskId, first.contextId], ['message', 'user', sent.id, sent.contextId]);
      const rest = await stack.client.get(`/api/task/v1/${sent.id}`);
      assert.deepEqual(rest.body.messages[0].parts.map((p: any) => p.type), ['text-part', 'data-part', 'file-part', 'file-part']);
      assert.deepEqual(rest.body.messages[0].parts[2].file, { name: 'a.txt', mime_type: 'text/plain', bytes: 'aGVsbG8=' });
    });

    it('message/send with blocking false returns the submitted task at once; historyLength is honoured', async () => {
      const contextId = randomUUID();
      const r = await rpc('message/send', { message: userMessage('quick', { contextId }), configuration: { blocking: false, historyLength: 0 } });
      const task = r.body.result;
      assert.equal(task.status.state, 'submitted');
      assert.equal(task.contextId, contextId);
      assert.deepEqual(task.history, []);
      const done = await rpc('message/send', { message: userMessage('[artifact] art', { contextId }) });
      assert.equal(done.body.result.status.state, 'completed');
      assert.equal(done.body.result.contextId, contextId);
      assert.equal(done.body.result.artifacts.length, 1);
      assert.deepEqual(done.body.result.artifacts[0].parts, [{ kind: 'text', text: '[artifact] art' }]);
      const one = await rpc('tasks/get', { id: done.body.result.id, historyLength: 1 });
      assert.equal(one.body.result.history.length, 1);
      assert.equal(one.body.result.history[0].role, 'agent');
      assert.equal(one.body.result.artifacts.length, 1);
      const all = await rpc('tasks/get', { id: done.body.result.id });
      assert.equal(all.body.result.history.length, 2);
      // Any count is taken (the view is capped at 1,000 messages); a negative one is not.
      assert.equal((await rpc('tasks/get', { id: done.body.result.id, historyLength: 1_000_000 })).body.result.history.length, 2);
      assert.equal((await rpc('tasks/get', { id: done.body.result.id, historyLength: -1 })).body.error.code, -32602);
    });

    it('continuing a task: [input] returns input-required, the follow-up completes the same task', async () => {
      const first = (await rpc('message/send', { message: userMessage('[input] start') })).body.result;
      assert.equal(first.status.state, 'input-required');
      const second = (await rpc('message/send', { message: userMessage('more', { taskId: first.id, contextId: first.contextId }) })).body.result;
      assert.equal(second.id, first.id);
      assert.equal(second.status.state, 'completed');
      assert.deepEqual(second.status.message.parts, [{ kind: 'text', text: 'Echo (turn 2): more' }]);
      assert.equal(second.history.filter((m: any) => m.role === 'user').length, 2);
      const again = await rpc('message/send', { message: userMessage('too late', { taskId: first.id }) });
      assert.equal(again.body.error.code, -32600);
      const otherContext = randomUUID();
      const wrongContext = await rpc('message/send', { message: userMessage('x', { taskId: first.id, contextId: otherContext }) });
      assert.deepEqual(wrongContext.body.error, {
        code: -32602, message: `Invalid params: params.message.contextId '${otherContext}' is not the context of task ${first.id}`, data: { taskId: first.id, contextId: first.contextId },
      });
    });

    it('a message to a task that is working is refused (-32600) and stored nowhere, by send and stream alike; the task ends answering its own', async () => {
      const task = (await rpc('message/send', { message: userMessage('[sleep 1500] first'), configuration: { blocking: false } })).body.result;
      await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.state === 'working', 'the run to start');
      const pattern = new RegExp(`^Task '${task.id}' is working: its agent is working on an earlier message: follow it \\(tasks/resubscribe, tasks/get\\) and send when it asks for input$`);
      for (const method of ['message/send', 'message/stream']) {
        const r = await rpc(method, { message: userMessage('sent while it works', { taskId: task.id }) });
        assert.equal(r.body.error?.code, -32600, JSON.stringify(r.body));
        assert.match(r.body.error.message, pattern);
        assert.deepEqual(r.body.error.data, { taskId: task.id, state: 'working' });
      }
      const done = (await rpc('message/send', { message: userMessage('[sleep 1500] first', { messageId: task.history[0].messageId, taskId: task.id }) })).body.result;
      assert.equal(done.status.state, 'completed', 'a retried send of the message the run answers is its original, not refused');
      assert.deepEqual(done.history.map((m: any) => `${m.role}: ${m.parts[0].text}`), ['user: [sleep 1500] first', 'agent: Working for 1500 ms', 'agent: Echo: [sleep 1500] first']);
    });

    it('a task a client drives (opened by an agent message, set working by PUT) takes A2A messages while working: no run of ours has it', async () => {
      const id = (await stack.client.post('/api/task/v1', { message: { role: 'agent', parts: [{ type: 'text-part', text: 'driven elsewhere' }] } })).body.task.id;
      assert.equal((await stack.client.put(`/api/task/v1/${id}`, { status: 'working' })).status, 200);
      const r = await rpc('message/send', { message: userMessage('for the driver', { taskId: id }), configuration: { blocking: false } });
      assert.equal(r.body.result?.status.state, 'working', JSON.stringify(r.body));
      assert.deepEqual((await rpc('tasks/get', { id })).body.result.history.map((m: any) => m.parts[0].text), ['driven elsewhere', 'for the driver']);
    });

    it('two answers sent at once to a task waiting for input: one is taken and answered, the other refused (-32600) and stored nowhere', async () => {
      const first = (await rpc('message/send', { message: userMessage('[input] ask') })).body.result;
      assert.equal(first.status.state, 'input-required');
      const answers = await Promise.all(['answer A', 'answer B'].map((text) => rpc('message/send', { message: userMessage(text, { taskId: first.id }) })));
      const taken = answers.filter((a) => a.body.result);
      const refused = answers.filter((a) => a.body.error);
      assert.equal(taken.length, 1, JSON.stringify(answers.map((a) => a.body)));
      assert.equal(refused[0].body.error.code, -32600);
      // Refused under the task's lock, either while the run is owed (still input-required) or once it began.
      assert.match(refused[0].body.error.message, new RegExp(`^Task '?${first.id}'? is (input-required: an earlier message already answered it and its run has not begun|working: its agent is working on an earlier message|completed)`));
      const answer = taken[0].body.result;
      const text = answer.history.filter((m: any) => m.role === 'user').at(-1).parts[0].text;
      assert.equal(answer.status.state, 'completed');
      assert.deepEqual(answer.status.message.parts, [{ kind: 'text', text: `Echo (turn 2): ${text}` }]);
      const all = (await rpc('tasks/get', { id: first.id })).body.result;
      assert.deepEqual(all.history.filter((m: any) => m.role === 'user').map((m: any) => m.parts[0].text), ['[input] ask', text]);
    });

    it('a blocking send answers with the task as it stands after the bounded wait', async () => {
      const short = await startStack({ A2A_BLOCKING_TIMEOUT_MS: '300' }, { workers: 0 });
      try {
        const res = await short.client.post(A2A, { jsonrpc: '2.0', id: 1, method: 'message/send', params: { message: userMessage('nobody runs this') } });
        assert.equal(res.body.result.status.state, 'submitted');
      } finally {
        await short.stop();
      }
    });

    it('an inline push config that is refused refuses the whole send: no task is created', async () => {
      const count = async () => (await stack.client.get('/api/task/v1?page_size=1000')).body.items.length;
      const before = await count();
      const r = await rpc('message/send', { message: userMessage('with push'), configuration: { blocking: false, pushNotificationConfig: { url: 'http://127.0.0.1:9/hook', token: 'tok-123' } } });
      assert.equal(r.body.error?.code, -32602, JSON.stringify(r.body));
      assert.doesNotMatch(JSON.stringify(r.body), /tok-123/);
      assert.equal(await count(), before);
    });

    it('tasks/cancel cancels a working task; canceling again is -32002', async () => {
      const task = (await rpc('message/send', { message: userMessage('[sleep 60000] slow'), configuration: { blocking: false } })).body.result;
      const canceled = await rpc('tasks/cancel', { id: task.id });
      assert.equal(canceled.body.result.status.state, 'canceled');
      const again = await rpc('tasks/cancel', { id: task.id });
      assert.equal(again.body.error.code, -32002);
      assert.equal(again.body.id, nextId - 1);
      const got = await rpc('tasks/get', { id: task.id });
      assert.equal(got.body.result.status.state, 'canceled');
    });
  });
});

describe('A2A JSON-RPC with streaming and push notifications switched off', () => {
  const stack = useStack({ A2A_STREAMING: 'false', A2A_PUSH_NOTIFICATIONS: 'false', A2A_STREAMS_PER_KEY: '1' });
  let nextId = 1;
  const rpc = async (method: string, params: unknown): Promise<any> => {
    const res = await fetch(stack.api.url + A2A, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: `c${nextId}`, method, params }) });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /application\/json/);
    const body: any = await res.json();
    assert.equal(body.id, `c${nextId++}`);
    return body;
  };

  it('the card says so', async () => {
    const card: any = await (await fetch(`${stack.api.url}/.well-known/agent-card.json`)).json();
    assert.deepEqual(card.capabilities, { streaming: false, pushNotifications: false, stateTransitionHistory: false });
  });

  it('message/stream and tasks/resubscribe are -32004 (JSON, not SSE), and the stream request creates no task', async () => {
    const r = await rpc('message/stream', { message: userMessage('hi') });
    assert.equal(r.error.code, -32004, JSON.stringify(r));
    assert.match(r.error.message, /message\/stream/);
    const sent = await rpc('message/send', { message: userMessage('hi'), configuration: { blocking: false } });
    assert.equal(sent.result.kind, 'task');
    const again = await rpc('tasks/resubscribe', { id: sent.result.id });
    assert.equal(again.error.code, -32004);
    // Params that do not fit change nothing: streaming is off whatever they hold.
    const bad = await rpc('message/stream', { message: { kind: 'message' } });
    assert.equal(bad.error.code, -32004, JSON.stringify(bad));
    // Nor do they take stream places (A2A_STREAMS_PER_KEY is 1 here): calls at once are all -32004, none 429.
    const together = await Promise.all(Array.from({ length: 6 }, (_, i) => stack.client.post(A2A, { jsonrpc: '2.0', id: i, method: 'message/stream', params: { message: userMessage('at once') } })));
    assert.deepEqual(together.map((t) => [t.status, t.body.error?.code]), Array(6).fill([200, -32004]));
    const [{ n }] = await testDb()('tasks').count({ n: '*' });
    assert.equal(n, 1);
  });

  it('push config methods and an inline push config are -32003, storing nothing', async () => {
    const sent = await rpc('message/send', { message: userMessage('hi'), configuration: { blocking: false } });
    const taskId = sent.result.id;
    const config = { url: 'https://hooks.example.com/a2a', token: 'tok-123' };
    for (const [method, params] of [
      ['tasks/pushNotificationConfig/set', { taskId, pushNotificationConfig: config }],
      ['tasks/pushNotificationConfig/get', { id: taskId }],
      ['tasks/pushNotificationConfig/list', { id: taskId }],
      ['tasks/pushNotificationConfig/delete', { id: taskId, pushNotificationConfigId: 'x' }],
      ['message/send', { message: userMessage('with push'), configuration: { blocking: false, pushNotificationConfig: config } }],
    ] as const) {
      const r = await rpc(method, params);
      assert.equal(r.error?.code, -32003, `${method}: ${JSON.stringify(r)}`);
    }
    const [{ n }] = await testDb()('push_configs').count({ n: '*' });
    assert.equal(n, 0);
    const texts = (await testDb()('messages').select('parts')).map((m) => m.parts[0].text);
    assert.ok(!texts.includes('with push'));
  });
});

describe('A2A JSON-RPC when an upstream fails (KMS)', () => {
  // A KMS endpoint that refuses connections: unwrapping a DEK under a KMS key fails upstream (502 over REST).
  const stack = useStack({ AWS_KMS_ENDPOINT: 'http://127.0.0.1:9', AWS_ACCESS_KEY_ID: 'AKIDLOCALTEST', AWS_SECRET_ACCESS_KEY: 'local-test-secret', PUSH_ALLOW_PRIVATE: 'true' });
  const ARN = 'arn:aws:kms:eu-west-1:111122223333:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';

  it('answers -32603 saying which upstream failed (data.code bad_gateway), not a bare "Internal error"; the token stays out of the answer', async () => {
    const db = testDb();
    // The push configs' alias `default` moved to a DEK under a KMS key: sealing a token needs KMS.
    await db('envelope_keys').insert({ id: ARN, type: 'aws_kms', arn: ARN, region: 'eu-west-1' });
    await db('deks').insert({ id: 'kms-dek', envelope_key_id: ARN, encrypted_dek: Buffer.from('a wrapped key').toString('base64') });
    await db('dek_aliases').where({ alias: 'default' }).update({ dek_id: 'kms-dek' });
    const task = (await stack.client.post(A2A, { jsonrpc: '2.0', id: 1, method: 'message/send', params: { message: userMessage('[input] hook me') } })).body.result;
    const config = { url: 'http://127.0.0.1:9/hook', token: 'tok-kms-123' };
    for (const [method, params] of [
      ['tasks/pushNotificationConfig/set', { taskId: task.id, pushNotificationConfig: config }],
      ['message/send', { message: userMessage('with push'), configuration: { blocking: false, pushNotificationConfig: config } }],
    ] as const) {
      const res = await stack.client.post(A2A, { jsonrpc: '2.0', id: 'up', method, params });
      assert.equal(res.status, 200);
      assert.equal(res.body.id, 'up');
      assert.equal(res.body.error?.code, -32603, `${method}: ${res.text}`);
      assert.match(res.body.error.message, /^AWS KMS Decrypt failed/, `${method}: ${res.text}`);
      assert.deepEqual(res.body.error.data, { code: 'bad_gateway', upstream: 'aws_kms' }, method);
      assert.doesNotMatch(res.text, /tok-kms-123/);
    }
    assert.equal(Number((await db('push_configs').count({ n: '*' }))[0].n), 0);
  });
});

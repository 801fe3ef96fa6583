// A hostile-input sweep of the JSON-RPC endpoints (A2A and MCP) with fast-check: envelopes of every
// wrong shape, and valid-looking params with one field made hostile so that they reach domain code,
// SQL and the worker. Nothing a client sends may be answered with a 500 or -32603, crash a process,
// leave a task stuck, fail an agent job or, when refused, change a row. The seed is fixed
// (FUZZ_SEED overrides it) so a failure replays.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { SCOPES } from '../domain/api-keys.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';
import { resetDb, startStack, tableRowCounts, testDb, waitFor, type Stack } from './helpers/stack.ts';
import { FUZZ_SEED, truncate } from './helpers/fuzz.ts';

const A2A = '/api/a2a/v1';
const MCP = '/api/bridge/v1/mcp';
const STRIPE_KEY = `sk_test_${randomUUID().replace(/-/g, '')}`;
const REFUND = 'stripe__stripe_process_refund__stripe-main';
// JSON has numbers no JS value writes: these strings are replaced by them in the request text.
const RAW_NUMBERS: Record<string, string> = { '"<1e400>"': '1e400', '"<2^64>"': '18446744073709551616', '"<-0.0e-999>"': '-0.0e-999' };
const ALLOWED_A2A_CODES = new Set([-32700, -32600, -32601, -32602, -32001, -32002, -32003, -32004, -32005, -32006, -32007]);
const BODY_LIMIT = 1024 * 1024; // BODY_LIMIT_BYTES' default: larger bodies are HTTP 413
const SETTLED = new Set(['completed', 'canceled', 'failed', 'rejected', 'input-required', 'auth-required']);

const serialize = (request: unknown) => Object.entries(RAW_NUMBERS).reduce((text, [marker, raw]) => text.replaceAll(marker, raw), JSON.stringify(request));

// --- hostile values -------------------------------------------------------------------------------

const hostileString = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 30 }),
  fc.constantFrom('', '\u0000', 'a\u0000b', '\ud800', '\udfff', 'x\ud83d', '\ufeff', '\u2028\u2029', '%00', "'; drop table tasks;--", '$1', '../../etc/passwd',
    '__proto__', 'constructor', '[input]', '[artifact]', 'urn:uuid:6f1b0c52-1a4b-4c9b-9b7a-2f4f0f9f8c11', 'ÄÖÜ\u{1F600}', '\\u0000', 'null'),
  fc.integer({ min: 300, max: 200_000 }).map((n) => 'x'.repeat(n)),
);
const hostileNumber = fc.oneof(
  fc.constantFrom(-1, 0, 1.5, -0.5, 2 ** 31, 2 ** 53, 2 ** 53 + 2, 1e308, -1e308, 5e-324, ...Object.keys(RAW_NUMBERS).map((k) => JSON.parse(k))),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.integer(),
);
const deepNest = fc.integer({ min: 30, max: 80 }).chain((depth) => fc.constantFrom('array', 'object').map((kind) => {
  let v: unknown = 'bottom';
  for (let i = 0; i < depth; i++) v = kind === 'array' ? [v] : { d: v };
  return v;
}));
const { value: hostileJson } = fc.letrec<{ value: unknown }>((tie) => ({
  value: fc.oneof({ depthSize: 'small', withCrossShrink: true },
    hostileString, hostileNumber, fc.boolean(), fc.constant(null), deepNest,
    fc.array(tie('value'), { maxLength: 3 }),
    fc.dictionary(hostileString, tie('value'), { maxKeys: 3 })),
}));
const hostileDict = fc.dictionary(hostileString, hostileJson, { maxKeys: 4 });
// Hostile yet storable (no NUL, no lone surrogate, nesting within the limit): what gets past the
// first checks into SQL and the agent run.
const storableString = fc.oneof(
  fc.string({ unit: 'grapheme', maxLength: 30 }),
  fc.constantFrom('', '\ufeff', '\u2028', "'; drop table tasks;--", '$1', '\\u0000', '__proto__', 'constructor', '[artifact]', '[input]', '\u{1F600}\u200d\u{1F466}', 'null', '%s%n'),
  fc.integer({ min: 300, max: 200_000 }).map((n) => 'é'.repeat(n)),
);
const { value: storableJson } = fc.letrec<{ value: unknown }>((tie) => ({
  value: fc.oneof({ depthSize: 'small' },
    storableString, fc.constantFrom(1e308, -1e308, 5e-324, 2 ** 53 + 2, -0, 0.1), fc.boolean(), fc.constant(null),
    fc.integer({ min: 30, max: 55 }).map((depth) => { let v: unknown = 1; for (let i = 0; i < depth; i++) v = [v]; return v; }),
    fc.array(tie('value'), { maxLength: 3 }),
    fc.dictionary(storableString, tie('value'), { maxKeys: 3 })),
}));
const storableDict = fc.dictionary(storableString, storableJson, { maxKeys: 4 });
const hostileId = fc.oneof(hostileJson, fc.constantFrom(randomUUID(), randomUUID().toUpperCase(), `{${randomUUID()}}`, randomUUID().replace(/-/g, ''), 't'.repeat(300)));

// --- requests -------------------------------------------------------------------------------------

interface Targets { completed: string; waiting: string; contextId: string; hookUrl: string }
interface Call { endpoint: 'a2a' | 'mcp'; family: 'envelope' | 'params'; method: string; request: unknown; text: string }

const A2A_METHODS = ['message/send', 'message/stream', 'tasks/get', 'tasks/cancel', 'tasks/resubscribe', 'tasks/pushNotificationConfig/set',
  'tasks/pushNotificationConfig/get', 'tasks/pushNotificationConfig/list', 'tasks/pushNotificationConfig/delete', 'agent/getAuthenticatedExtendedCard'];
const STREAMING = new Set(['message/stream', 'tasks/resubscribe']);

const envelopeCall = (endpoint: Call['endpoint'], methods: string[]) => fc.oneof(
  // an object request with one or more envelope members wrong
  fc.record({
    jsonrpc: fc.oneof(fc.constant('2.0'), fc.constant('2.0'), fc.constantFrom('1.0', '2', 2, 2.0, null, '', ' 2.0'), hostileJson),
    id: fc.oneof(fc.string(), fc.integer(), fc.constant(null), hostileJson, fc.constantFrom(...Object.keys(RAW_NUMBERS).map((k) => JSON.parse(k)), 2 ** 53 + 2, 1.25, -0, [], {}, [1], { id: 1 })),
    method: fc.oneof(fc.constantFrom(...methods), fc.constantFrom(...methods), fc.constantFrom('', 'tasks/', 'TASKS/GET', '__proto__', 'toString', 'rpc.discover', 'hasOwnProperty'), hostileJson),
    params: fc.oneof(fc.constantFrom(null, 'params', 0, true, [], [{}], [1, 2]), hostileJson),
  }, { requiredKeys: [] }),
  // not a request object at all: batches (empty, of requests, of junk), scalars, junk
  fc.array(fc.oneof(fc.constantFrom<unknown>({ jsonrpc: '2.0', id: 1, method: methods[0], params: {} }, { jsonrpc: '2.0', method: methods[0] }), hostileJson), { maxLength: 4 }),
  hostileJson,
).map((request): Call => ({ endpoint, family: 'envelope', method: nameOf(request), request, text: serialize(request) }));

const nameOf = (request: unknown) => {
  const method = (request as { method?: unknown } | null)?.method;
  return typeof method === 'string' ? method.slice(0, 60) : `(method ${truncate(JSON.stringify(method) ?? 'absent', 60)})`;
};

const userMessage = (text: string, extra: Record<string, unknown> = {}) => ({ kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }], ...extra });

const storablePart = fc.oneof(
  fc.record({ kind: fc.constant('text'), text: storableString, metadata: storableDict }, { requiredKeys: ['kind', 'text'] }),
  fc.record({ kind: fc.constant('data'), data: storableDict, metadata: storableDict }, { requiredKeys: ['kind', 'data'] }),
  fc.record({ kind: fc.constant('file'), file: fc.record({ name: storableString, mimeType: storableString, bytes: fc.base64String({ maxLength: 400 }) }, { requiredKeys: ['bytes'] }), metadata: storableDict }, { requiredKeys: ['kind', 'file'] }),
  fc.record({ kind: fc.constant('file'), file: fc.record({ name: storableString, mimeType: storableString, uri: fc.constantFrom('https://example.com/a%00b', 'urn:x:y', 'data:,hi', 'mailto:a@b') }, { requiredKeys: ['uri'] }) }),
);

const hostilePart = (t: Targets) => fc.oneof(
  fc.record({ kind: fc.constant('text'), text: hostileString, metadata: hostileDict }, { requiredKeys: ['kind', 'text'] }),
  fc.record({ kind: fc.constant('data'), data: fc.oneof(hostileDict, hostileJson), metadata: hostileDict }, { requiredKeys: ['kind', 'data'] }),
  fc.record({
    kind: fc.constant('file'),
    file: fc.record({
      name: hostileString, mimeType: hostileString,
      bytes: fc.oneof(fc.constantFrom('aGk=', 'aGk', '====', 'a', '*', 'aGk=\n', ''), fc.base64String({ maxLength: 40 }), hostileString),
      uri: fc.oneof(fc.constantFrom(t.hookUrl, 'file:///etc/passwd', 'javascript:alert(1)', 'http://[::1', 'data:,x', 'x'), hostileString),
    }, { requiredKeys: [] }),
    metadata: hostileDict,
  }, { requiredKeys: ['kind', 'file'] }),
  hostileJson,
);

const hostilePush = (t: Targets) => fc.record({
  url: fc.oneof(fc.constantFrom(t.hookUrl, `${t.hookUrl}?q=\u00e9`, 'http://127.0.0.1:1/x', 'https://[::1]/', 'ftp://10.0.0.1/', 'http://0x7f000001/', 'https://user:pw@127.0.0.1/', 'javascript:alert(1)', 'http://'), hostileString),
  id: fc.oneof(fc.uuid(), hostileString, hostileJson),
  token: fc.oneof(fc.constant('tok-secret-123'), hostileString, hostileJson),
  authentication: fc.oneof(fc.record({ schemes: fc.array(hostileString, { maxLength: 3 }), credentials: hostileString }, { requiredKeys: [] }), hostileJson),
}, { requiredKeys: [] });

// A push config the service takes, with hostile token, credentials and id: these reach deliveries.
const headerJunk = fc.oneof(storableString, fc.constantFrom('a\r\nX-Evil: 1', 'a\nb', '\u{1F600}', 'é', ' padded ', '\t', 'a\u0001b', 'a\u007fb'));
const deliveredPush = (t: Targets) => fc.record({
  url: fc.constantFrom(t.hookUrl, `${t.hookUrl}?q=%00&r=\u00e9`, `${t.hookUrl}#frag`),
  id: storableString,
  token: headerJunk,
  authentication: fc.record({ schemes: fc.array(headerJunk, { minLength: 1, maxLength: 2 }), credentials: headerJunk }, { requiredKeys: ['schemes'] }),
}, { requiredKeys: ['url'] });

// Valid params of `method` against the tasks in `t`: the request before one field is made hostile.
function baseParams(method: string, t: Targets): Record<string, unknown> {
  switch (method) {
    case 'message/send': return { message: userMessage('fuzz'), configuration: { blocking: false } };
    case 'message/stream': return { message: userMessage('fuzz') };
    case 'tasks/pushNotificationConfig/set': return { taskId: t.completed, pushNotificationConfig: { url: t.hookUrl } };
    case 'tasks/pushNotificationConfig/get': return { id: t.completed, pushNotificationConfigId: 'x' };
    case 'tasks/pushNotificationConfig/delete': return { id: t.completed, pushNotificationConfigId: 'x' };
    case 'agent/getAuthenticatedExtendedCard': return {};
    default: return { id: t.completed };
  }
}

// The members of each method's params a mutation may replace, with values aimed at each.
function mutations(method: string, t: Targets): fc.Arbitrary<[string[], unknown]>[] {
  const at = (path: (string | number)[], value: fc.Arbitrary<unknown>) => value.map((v): [string[], unknown] => [path.map(String), v]);
  const taskIds = fc.oneof(hostileId, fc.constantFrom(t.completed, t.waiting, t.completed.toUpperCase()));
  switch (method) {
    case 'message/send':
    case 'message/stream':
      return [
        at(['message', 'parts'], fc.oneof(fc.array(hostilePart(t), { minLength: 1, maxLength: 3 }), hostileJson)),
        at(['message', 'parts'], fc.array(storablePart, { minLength: 1, maxLength: 4 })),
        at(['message', 'parts'], fc.array(storablePart, { minLength: 1, maxLength: 4 })),
        at(['message', 'metadata'], storableDict),
        at(['metadata'], storableDict),
        at(['message', 'parts', 0], hostilePart(t)),
        at(['message', 'parts', 0, 'text'], hostileString),
        at(['message', 'parts', 0, 'metadata'], fc.oneof(hostileDict, hostileJson)),
        at(['message', 'metadata'], fc.oneof(hostileDict, hostileJson)),
        at(['message', 'messageId'], hostileId),
        at(['message', 'taskId'], taskIds),
        at(['message', 'contextId'], fc.oneof(hostileId, fc.constantFrom(t.contextId, t.contextId.toUpperCase()))),
        at(['message', 'referenceTaskIds'], fc.oneof(fc.array(taskIds, { maxLength: 3 }), hostileJson)),
        at(['message', 'extensions'], fc.oneof(fc.array(hostileString, { maxLength: 3 }), hostileJson)),
        at(['message', 'role'], fc.oneof(fc.constantFrom('agent', 'system', 'USER'), hostileJson)),
        at(['message', 'kind'], hostileJson),
        at(['configuration', 'historyLength'], fc.oneof(hostileNumber, hostileJson)),
        at(['configuration', 'blocking'], fc.oneof(fc.constant(true), hostileJson)),
        at(['configuration', 'acceptedOutputModes'], fc.oneof(fc.array(hostileString, { maxLength: 3 }), hostileJson)),
        at(['configuration', 'pushNotificationConfig'], fc.oneof(hostilePush(t), hostileJson)),
        at(['configuration', 'pushNotificationConfig'], deliveredPush(t)),
        at(['configuration', 'pushNotificationConfig'], deliveredPush(t)),
        at(['configuration'], hostileJson),
        at(['metadata'], fc.oneof(hostileDict, hostileJson)),
      ];
    case 'tasks/pushNotificationConfig/set':
      return [
        at(['taskId'], taskIds),
        at(['pushNotificationConfig'], fc.oneof(hostilePush(t), hostileJson)),
        at(['pushNotificationConfig'], deliveredPush(t)),
        at(['pushNotificationConfig', 'url'], hostileJson),
        at(['pushNotificationConfig', 'token'], hostileJson),
        at(['pushNotificationConfig', 'authentication'], hostileJson),
      ];
    case 'agent/getAuthenticatedExtendedCard':
      return [at(['metadata'], hostileJson), at(['x'], hostileJson)];
    default:
      return [
        at(['id'], taskIds),
        at(['historyLength'], fc.oneof(hostileNumber, hostileJson)),
        at(['pushNotificationConfigId'], hostileId),
        at(['metadata'], fc.oneof(hostileDict, hostileJson)),
      ];
  }
}

function withMember(base: Record<string, unknown>, path: string[], value: unknown): Record<string, unknown> {
  const copy = structuredClone(base);
  let at: Record<string, unknown> = copy;
  for (const key of path.slice(0, -1)) {
    if (typeof at[key] !== 'object' || at[key] === null) at[key] = {};
    at = at[key] as Record<string, unknown>;
  }
  Object.defineProperty(at, path[path.length - 1], { value, enumerable: true, writable: true, configurable: true });
  return copy;
}

const a2aParamsCall = (t: Targets, methods = A2A_METHODS) => fc.constantFrom(...methods)
  .chain((method) => fc.tuple(fc.constant(method), fc.oneof(...mutations(method, t)), fc.oneof(fc.string({ maxLength: 20 }), fc.integer())))
  .map(([method, [path, value], id]): Call => {
    const request = { jsonrpc: '2.0', id, method, params: withMember(baseParams(method, t), path, value) };
    return { endpoint: 'a2a', family: 'params', method, request, text: serialize(request) };
  });

const MCP_METHODS = ['initialize', 'tools/list', 'tools/call', 'ping', 'resources/list', 'prompts/get', 'notifications/initialized', 'completion/complete', 'logging/setLevel'];
const mcpParamsCall = fc.oneof(
  // valid calls of the refund tool with hostile but storable values: these reach the provider
  fc.record({
    name: fc.constant(REFUND),
    arguments: fc.oneof(
      fc.record({ payment_intent: storableString.map((s) => `pi_${s}`), amount: fc.oneof(fc.integer({ min: 1, max: 2 ** 31 }), fc.constantFrom(2 ** 53 + 2, 1e308, 0.5)) }, { requiredKeys: ['payment_intent'] }),
      fc.record({ charge: storableString.map((s) => `ch_${s}`) })),
  }).map((params) => ({ method: 'tools/call', params })),
  fc.record({
    name: fc.oneof(fc.constantFrom(REFUND, 'stripe.stripe_process_refund.stripe-main', 'stripe__stripe_process_refund__stripe-off'), hostileString, hostileJson),
    arguments: fc.oneof(
      fc.record({ payment_intent: fc.oneof(fc.constantFrom('pi_1', 'pi_refused'), hostileString, hostileJson), amount: fc.oneof(hostileNumber, hostileJson), reason: hostileJson }, { requiredKeys: [] }),
      hostileDict, hostileJson),
    _meta: hostileJson,
  }, { requiredKeys: ['name'] }).map((params) => ({ method: 'tools/call', params })),
  fc.record({
    protocolVersion: fc.oneof(fc.constantFrom('2025-11-25', '2025-03-26', '1999-01-01'), hostileJson),
    capabilities: fc.oneof(hostileDict, hostileJson),
    clientInfo: fc.oneof(fc.record({ name: hostileString, version: hostileString }), hostileJson),
  }, { requiredKeys: [] }).map((params) => ({ method: 'initialize', params })),
  fc.record({ cursor: fc.oneof(hostileString, hostileJson), _meta: hostileJson }, { requiredKeys: [] }).map((params) => ({ method: 'tools/list', params })),
  fc.tuple(fc.constantFrom(...MCP_METHODS), fc.oneof(hostileDict, hostileJson)).map(([method, params]) => ({ method, params })),
).chain((call) => fc.tuple(fc.constant(call), fc.oneof(fc.string({ maxLength: 20 }), fc.integer()))).map(([{ method, params }, id]): Call => {
  const request = { jsonrpc: '2.0', id, method, params };
  return { endpoint: 'mcp', family: 'params', method, request, text: serialize(request) };
});

// --- the rules every answer keeps -----------------------------------------------------------------

interface Answer { status: number; contentType: string; messages: any[]; text: string }

// The id an answer must carry: the request's when it can be read (a string, null or a number JSON
// keeps exactly; MCP's schema takes integers only), else null.
function expectedId(call: Call): unknown {
  const req = call.request;
  if (typeof req !== 'object' || req === null || Array.isArray(req) || !('id' in req)) return null;
  const written = (req as { id: unknown }).id;
  const raw = JSON.stringify(written);
  const id = Object.hasOwn(RAW_NUMBERS, raw) ? JSON.parse(RAW_NUMBERS[raw]) : written;
  if (typeof id === 'string' || id === null) return id;
  if (call.endpoint === 'mcp' && !Number.isInteger(id)) return null;
  if (typeof id === 'number' && Math.abs(id) <= Number.MAX_SAFE_INTEGER) return id === 0 ? 0 : id;
  return null;
}

// The code JSON-RPC and the A2A spec give an A2A envelope error, checked in the order the service
// checks: undefined when the answer may be a result, or when the body holds JSON that cannot be
// stored (refused first, -32602 inside params) and the set of codes is all that is checked.
const UNSTORABLE_TEXT = /\\u0000|\\ud[89a-f]|1e400|\[{30}|(\{"d":){30}/i;
function expectedA2ACode(call: Call): number | undefined {
  if (UNSTORABLE_TEXT.test(call.text)) return undefined;
  const req = JSON.parse(call.text) as Record<string, unknown>; // as the service reads it
  if (typeof req !== 'object' || req === null || Array.isArray(req)) return -32600;
  if (req.jsonrpc !== '2.0') return -32600;
  if ('id' in req && expectedId(call) === null && req.id !== null) return -32600;
  if (typeof req.method !== 'string') return -32600;
  if (!A2A_METHODS.includes(req.method)) return -32601;
  if (req.method === 'agent/getAuthenticatedExtendedCard') return undefined;
  return 'id' in req ? -32602 : undefined; // without an id: -32602, or -32600 when the params fit
}

interface Sweep { calls: number; accepted: Set<string>; refused: number }

function checkAnswer(call: Call, answer: Answer, sweep: Sweep): void {
  const what = `${call.endpoint} ${call.method}\nrequest: ${truncate(call.text)}\nanswer: HTTP ${answer.status} ${truncate(answer.text)}`;
  assert.ok(answer.status < 500, `a 5xx answer to ${what}`);
  if (Buffer.byteLength(call.text) > BODY_LIMIT) {
    assert.equal(answer.status, 413, `a body past the limit is 413: ${what}`);
    sweep.calls++;
    return;
  }
  if (call.endpoint === 'a2a') {
    assert.equal(answer.status, 200, `JSON-RPC answers are HTTP 200: ${what}`);
    assert.ok(answer.messages.length > 0, `no JSON-RPC message in the answer to ${what}`);
  } else {
    // MCP's transport answers a message that is no request with 400 and a notification with 202.
    assert.ok([200, 202, 400].includes(answer.status), `unexpected HTTP status for ${what}`);
    if (answer.status === 202) assert.equal(answer.text, '', `a 202 (notifications only) has no body: ${what}`);
  }
  const id = expectedId(call);
  for (const m of answer.messages) {
    assert.equal(m?.jsonrpc, '2.0', `not a JSON-RPC response: ${what}`);
    assert.notEqual(m.error?.code, -32603, `an internal error for ${what}`);
    if (call.endpoint === 'a2a') {
      assert.deepStrictEqual(m.id, id, `id not echoed exactly: ${what}`);
      const code = call.family === 'envelope' ? expectedA2ACode(call) : undefined;
      if (code !== undefined) assert.equal(m.error?.code, code, `the spec's code for ${what}`);
      if (m.error) assert.ok(ALLOWED_A2A_CODES.has(m.error.code), `a code the spec does not have: ${what}`);
    } else if (!Array.isArray(call.request)) {
      assert.deepStrictEqual(m.id, id, `id not echoed exactly: ${what}`);
    }
    if (m.error) {
      assert.equal(typeof m.error.message, 'string', what);
      assert.ok(!/tok-secret-123|sk_test_/.test(JSON.stringify(m.error)), `a secret in an error: ${what}`);
    }
    const task = m.result?.kind === 'task' ? m.result.id : m.result?.taskId;
    if (typeof task === 'string') sweep.accepted.add(task);
  }
  if (answer.messages.every((m) => m?.error)) sweep.refused++;
  sweep.calls++;
}

// fast-check's report (seed, counterexample) and the assertion that failed, with how to replay.
const replayable = (err: unknown) => {
  const cause = (err as Error).cause as Error | undefined;
  return new Error(`replay with FUZZ_SEED=${FUZZ_SEED}: ${truncate((err as Error).message, 3000)}${cause ? `\n${cause.message}` : ''}`);
};

// --- the test -------------------------------------------------------------------------------------

describe('hostile JSON-RPC input (fast-check sweep of A2A and MCP)', function () {
  this.timeout(180_000);
  let stack: Stack;
  let providers: FakeProviders;
  let key: string;
  let t: Targets;
  const sweep: Sweep = { calls: 0, accepted: new Set(), refused: 0 };

  async function send(call: Call): Promise<Answer> {
    const url = stack.api.url + (call.endpoint === 'a2a' ? A2A : MCP);
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    const res = await fetch(url, { method: 'POST', headers, body: call.text });
    const contentType = res.headers.get('content-type') ?? '';
    if (!contentType.startsWith('text/event-stream')) {
      const text = await res.text();
      let parsed: unknown;
      try { parsed = text ? JSON.parse(text) : undefined; } catch { parsed = { notJson: text }; }
      const messages = parsed === undefined ? [] : Array.isArray(parsed) ? parsed : [parsed];
      return { status: res.status, contentType, messages, text };
    }
    // An SSE answer, read to its end or its first error or final event: every data line is a response.
    const messages: any[] = [];
    let text = '';
    const decoder = new TextDecoder();
    const reader = res.body!.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      const events = text.split('\n\n');
      const complete = events.slice(0, -1).flatMap((e) => e.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)));
      if (complete.length > messages.length) {
        for (const data of complete.slice(messages.length)) {
          try { messages.push(JSON.parse(data)); } catch { messages.push({ notJson: data }); }
        }
        const last = messages[messages.length - 1];
        if (last?.error || last?.result?.final) {
          await reader.cancel();
          break;
        }
      }
    }
    return { status: res.status, contentType, messages, text };
  }

  const property = (arb: fc.Arbitrary<Call>) => fc.asyncProperty(arb, async (call) => checkAnswer(call, await send(call), sweep));
  const run = async (arb: fc.Arbitrary<Call>, numRuns: number) => {
    try {
      await fc.assert(property(arb), { seed: FUZZ_SEED, numRuns, endOnFailure: true });
    } catch (err) {
      throw replayable(err);
    }
  };

  const rpc = async (method: string, params: unknown) => (await send({ endpoint: 'a2a', family: 'params', method, request: null, text: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }) })).messages[0];
  const settled = () => waitFor(async () => {
    const ids = [...sweep.accepted];
    if (!ids.length) return true;
    const rows: { id: string; status: string }[] = await testDb()('tasks').whereIn('id', ids).select('id', 'status');
    // and the outbox relayed: its rows come and go while jobs of settled tasks are handed to Redis
    const outbox = Number((await testDb()('outbox').count({ n: '*' }))[0].n);
    return rows.every((r) => SETTLED.has(r.status)) && outbox === 0;
  }, 'every task the sweep created to settle', 120_000, 200);

  before(async () => {
    await resetDb();
    providers = await startFakeProviders({ stripeKey: STRIPE_KEY });
    // No per-key rate limit: on a fast machine the sweep passes 1,000 requests a second (463 at most
    // on the 2-core development machine), and a 429 would fail it.
    stack = await startStack({ STRIPE_API_BASE_URL: providers.url, BRIDGE_ALLOW_PRIVATE: 'true', PUSH_ALLOW_PRIVATE: 'true', PUBLIC_URL: 'https://agents.example.com', RATE_LIMIT_PER_SECOND: '0' });
    const made = await stack.client.post('/api/auth/v1/api-key', { name: 'fuzz, every scope', scopes: SCOPES });
    assert.equal(made.status, 201, made.text);
    key = made.body.key;
    const c = stack.client;
    const avail = '/api/bridge/v1/available-providers/stripe/available-credentials/api_key';
    const cred = await c.post(`${avail}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
    assert.equal((await c.post(avail, { provider_instance_id: 'stripe-main', display_name: 'main', resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await c.post('/api/bridge/v1/provider/stripe-main/function/stripe_process_refund/enable', {})).status, 201);
    const completed = await rpc('message/send', { message: userMessage('a finished task') });
    assert.equal(completed.result?.status?.state, 'completed', JSON.stringify(completed));
    const waiting = await rpc('message/send', { message: userMessage('[input] a task waiting for input') });
    assert.equal(waiting.result?.status?.state, 'input-required', JSON.stringify(waiting));
    t = { completed: completed.result.id, waiting: waiting.result.id, contextId: completed.result.contextId, hookUrl: `${providers.url}/hook` };
  });
  after(async () => {
    await stack?.stop();
    providers?.close();
  });

  it('A2A: envelopes of every wrong shape are JSON-RPC errors with the id echoed when readable', async () => {
    await run(envelopeCall('a2a', A2A_METHODS), 400);
  });

  it('A2A: params with one hostile member, for every method, are answered without an internal error', async () => {
    await run(a2aParamsCall(t, A2A_METHODS.filter((m) => !STREAMING.has(m))), 1200);
  });

  it('A2A: hostile message/stream and tasks/resubscribe answer SSE events that are each a response to the request', async () => {
    await run(a2aParamsCall(t, [...STREAMING]), 200);
  });

  it('MCP: envelopes and hostile initialize, tools/list, tools/call and unknown methods are never an internal error', async () => {
    await run(envelopeCall('mcp', MCP_METHODS), 300);
    await run(mcpParamsCall, 500);
  });

  it('refused requests change no row of any table', async () => {
    let refused = 0;
    const calls = fc.oneof(envelopeCall('a2a', A2A_METHODS), envelopeCall('mcp', MCP_METHODS), a2aParamsCall(t));
    await fc.assert(fc.asyncProperty(calls, async (call) => {
      await settled();
      const before = await tableRowCounts();
      const answer = await send(call);
      checkAnswer(call, answer, sweep);
      if (!answer.messages.every((m) => m?.error)) return; // accepted: the next round waits for its task
      refused++;
      assert.deepEqual(await tableRowCounts(), before, `rows changed for a refused ${call.endpoint} ${call.method}\nrequest: ${truncate(call.text)}\nanswer: ${truncate(answer.text)}`);
    }), { seed: FUZZ_SEED + 1, numRuns: 100, endOnFailure: true }).catch((err: unknown) => { throw replayable(err); });
    assert.ok(refused > 50, `only ${refused} of 100 requests were refused`);
  });

  it('leaves the API and the worker alive, no task stuck, no error logged, no agent job failed', async () => {
    const pushes = providers.seen.filter((r) => r.url.startsWith('/hook')).length;
    const refunds = providers.seen.filter((r) => r.url === '/v1/refunds').length;
    console.error(`      sweep: ${sweep.calls} requests, ${sweep.refused} refused, ${sweep.accepted.size} tasks accepted, ${pushes} push deliveries, ${refunds} tool calls reached the provider (FUZZ_SEED=${FUZZ_SEED})`);
    await settled();
    assert.equal((await fetch(`${stack.api.url}/_internal/v1/health`)).status, 200);
    const done = await rpc('message/send', { message: userMessage('still there?') });
    assert.equal(done.result?.status?.state, 'completed', JSON.stringify(done));
    const metrics = await fetch(`${stack.api.url}/metrics`, { headers: { authorization: `Bearer ${key}` } });
    const text = await metrics.text();
    const failed = [...text.matchAll(/^taskbridge_queue_jobs\{queue="([^"]+)",state="failed"\} (\d+)$/gm)];
    assert.ok(failed.some(([, queue]) => queue === 'agent-tasks'), 'the metrics carry the agent queue\'s failed count');
    assert.deepEqual(failed.filter(([, , n]) => n !== '0').map(([line]) => line), [], 'no job failed, in any queue (agent runs, push deliveries)');
    // The demo agent fails only on '[fail]', which the sweep never sends: a failed task is the content's fault.
    const failedTasks = await testDb()('tasks').whereIn('id', [...sweep.accepted]).where({ status: 'failed' }).select('id');
    assert.deepEqual(failedTasks, [], 'no task the sweep created failed');
    const errors = [stack.api, ...stack.workers].flatMap((p) => p.logs).filter((l) => /"level":(50|60)/.test(l));
    assert.deepEqual(errors.map((l) => truncate(l, 600)), [], 'no line logged at error or fatal');
    for (const p of [stack.api, ...stack.workers]) assert.equal(p.child.exitCode, null, 'the process is still running');
  });
});

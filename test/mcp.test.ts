import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ErrorCode, LATEST_PROTOCOL_VERSION, McpError } from '@modelcontextprotocol/sdk/types.js';
import { ADMIN_KEY, resetDb, startStack, testDb, useStack, useStarted, waitFor, type Client as HttpClient, type Stack } from './helpers/stack.ts';
import { TOOLS_PAGE } from '../domain/bridge/mcp.ts';
import { startFakeProviders, type FakeProviders } from './helpers/fake-providers.ts';

const B = '/api/bridge/v1';
const avail = (p: string, c: string) => `${B}/available-providers/${p}/available-credentials/${c}`;
const STRIPE_KEY = `sk_test_${randomUUID().replace(/-/g, '')}`;
const REFUND = 'stripe__stripe_process_refund__stripe-main';
// The name before 2025-11, still taken by tools/call.
const DOTTED_REFUND = 'stripe.stripe_process_refund.stripe-main';
// What the Anthropic and OpenAI APIs take as a tool name.
const HOST_NAME = /^[a-zA-Z0-9_-]{1,64}$/;
// The stack's PUBLIC_URL: its origin may call the MCP endpoint from a browser.
const PUBLIC_URL = 'https://bridge.example.com/taskbridge';

describe('MCP server (POST /api/bridge/v1/mcp) with the real @modelcontextprotocol/sdk client', () => {
  let stack: Stack;
  let c: HttpClient;
  let stripe: FakeProviders;
  let mcpUrl: URL;
  const clients: Client[] = [];

  let lastTransport: StreamableHTTPClientTransport;
  async function connect(key = ADMIN_KEY): Promise<Client> {
    const client = new Client({ name: 'taskbridge-test', version: '1.0.0' });
    lastTransport = new StreamableHTTPClientTransport(mcpUrl, { requestInit: { headers: { authorization: `Bearer ${key}` } } });
    await client.connect(lastTransport);
    clients.push(client);
    return client;
  }
  const rawPost = (body: string, headers: Record<string, string> = {}) => fetch(mcpUrl, {
    method: 'POST', body,
    headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
  });

  before(async () => {
    await resetDb();
    stripe = await startFakeProviders({ stripeKey: STRIPE_KEY });
    stack = await startStack({
      STRIPE_API_BASE_URL: stripe.url, BRIDGE_ALLOW_PRIVATE: 'true', BRIDGE_TIMEOUT_MS: '1500',
      // Browser pages of these origins may call the MCP endpoint; of any other, not.
      PUBLIC_URL: PUBLIC_URL, MCP_ALLOWED_ORIGINS: ' https://App.Example.com:443, http://localhost:5173/,',
    }, { workers: 0 });
    c = stack.client;
    mcpUrl = new URL(`${stack.api.url}${B}/mcp`);
    for (const id of ['stripe-main', 'stripe-off']) {
      const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
      assert.equal(cred.status, 201, cred.text);
      assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: id, display_name: id, resource_server_credential_id: cred.body.id })).status, 201);
      assert.equal((await c.post(`${B}/provider/${id}/function/stripe_process_refund/enable`, {})).status, 201);
    }
    assert.equal((await c.patch(`${B}/provider/stripe-off`, { status: 'disabled' })).status, 200);
    // An instance without the function enabled: no tool.
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'stripe-bare', display_name: 'bare', resource_server_credential_id: cred.body.id })).status, 201);
  });
  after(async () => {
    await Promise.all(clients.map((cl) => cl.close()));
    await stack?.stop();
    stripe?.close();
  });

  it('negotiates the latest protocol and lists one tool per function instance a call can run, with its schema', async () => {
    const client = await connect();
    assert.equal(LATEST_PROTOCOL_VERSION, '2025-11-25');
    assert.equal(lastTransport.protocolVersion, LATEST_PROTOCOL_VERSION);
    assert.equal(client.getServerVersion()?.name, 'taskbridge-bridge');
    assert.ok(client.getServerCapabilities()?.tools);
    const { tools } = await client.listTools();
    // Not stripe-off's: a call is refused while its provider instance is disabled (a tool error, below).
    assert.deepEqual(tools.map((t) => t.name), [REFUND]);
    const refund = tools.find((t) => t.name === REFUND)!;
    // The same schema and documentation as the function's invoke operation in the instances document.
    const fn = (await c.get(`${B}/function-instances/openapi.json`)).body.paths[`${B}/provider/stripe-main/function/stripe_process_refund/invoke`].post;
    const { oneOf: _oneOf, ...params } = fn.requestBody.content['application/json'].schema.properties.params;
    assert.deepEqual(refund.inputSchema, params);
    assert.equal(refund.inputSchema.type, 'object');
    assert.equal(refund.description, fn.description);
    assert.ok(refund.description && refund.description.length > 10);
  });

  it('advertises input schemas that Claude-backed hosts take: no oneOf, anyOf or allOf at the top level, the rule kept in the description and checked on call', async () => {
    const client = await connect();
    const { tools } = await client.listTools();
    for (const t of tools) {
      for (const k of ['oneOf', 'anyOf', 'allOf']) assert.ok(!(k in t.inputSchema), `${t.name}: top-level ${k}`);
    }
    const refund = tools.find((t) => t.name === REFUND)!;
    assert.equal(refund.inputSchema.description, 'payment_intent or charge, not both');
    const both = await client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_1', charge: 'ch_1' } });
    assert.equal(both.isError, true);
    assert.match((both.content as { text: string }[])[0].text, /exactly one of payment_intent or charge/);
  });

  it('tools/call invokes the function: structured output, the credential decrypted only on the way out', async () => {
    const client = await connect();
    const before = stripe.seen.length;
    const r = await client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_mcp', amount: 700 } });
    assert.equal(r.isError, undefined);
    assert.deepEqual(r.structuredContent, { id: 're_1', object: 'refund', amount: 700, status: 'succeeded', payment_intent: 'pi_mcp' });
    assert.deepEqual(JSON.parse((r.content as { text: string }[])[0].text), r.structuredContent);
    assert.equal(stripe.seen.length, before + 1);
    assert.equal(stripe.seen.at(-1)!.authorization, `Bearer ${STRIPE_KEY}`);
    assert.equal(stripe.seen.at(-1)!.body, 'payment_intent=pi_mcp&amount=700');
    assert.ok(!JSON.stringify(r).includes(STRIPE_KEY));
  });

  it("tools/call answers a refund as a success whatever its members (Stripe refunded): null where Stripe says so, a member that does not fit left out, only the output's members sent", async () => {
    // A 502 (tool error) would tell the model the refund failed, and a retry with the same key gets the same answer.
    const nulls = await rawCall(REFUND, { payment_intent: 'pi_null' });
    assert.equal(nulls.answer.result?.isError, undefined);
    assert.deepEqual((nulls.answer.result as { structuredContent?: unknown }).structuredContent,
      { id: 're_null', object: 'refund', amount: 1000, status: null, currency: 'eur', created: 1700000000, charge: null, payment_intent: null, reason: null, balance_transaction: null, metadata: {} });
    assert.ok(!(await linesOf(nulls.reqId)).some((l) => l.level >= 40), 'nothing to warn about');
    const odd = await rawCall(REFUND, { payment_intent: 'pi_odd' });
    assert.equal(odd.answer.result?.isError, undefined);
    assert.deepEqual((odd.answer.result as { structuredContent?: unknown }).structuredContent, { id: 're_odd', object: 'refund', status: 'succeeded' });
    const warned = (await linesOf(odd.reqId)).filter((l) => l.level === 40);
    assert.equal(warned.length, 1, JSON.stringify(warned));
    assert.deepEqual((warned[0] as unknown as { unfit_members: string[] }).unfit_members, ['amount']);
    assert.ok(!JSON.stringify(warned).includes('ten'), 'the value is not logged');
    const extra = await connect().then((client) => client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_extra' } }));
    assert.equal(extra.isError, undefined);
    assert.deepEqual(extra.structuredContent, { id: 're_extra', object: 'refund', amount: 1000, status: 'succeeded', currency: 'eur' });
    assert.deepEqual(JSON.parse((extra.content as { text: string }[])[0].text), extra.structuredContent);
  });

  it('tools/call takes an idempotency key in params._meta["io.taskbridge/idempotency-key"]: sent to Stripe as Idempotency-Key; a bad one is -32602 and nothing is called', async () => {
    const client = await connect();
    const KEY = 'io.taskbridge/idempotency-key';
    assert.match(client.getInstructions() ?? '', /params\._meta\["io\.taskbridge\/idempotency-key"\]/, 'the server says so to the host');
    assert.match(client.getInstructions() ?? '', /\(1 to 255 characters, which must be visible ASCII \(inner spaces allowed\)\)/, "and the key's rules, as its schema has them");
    const plain = await client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_unkeyed' } });
    assert.equal(plain.isError, undefined);
    assert.equal(stripe.seen.at(-1)!.idempotencyKey, undefined, 'none unless the client gives one');
    // Another member of _meta (the SDK's progressToken) is no key and is let be.
    const keyed = await client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_keyed' }, _meta: { [KEY]: 'order 42 refund', progressToken: 1 } });
    assert.equal(keyed.isError, undefined);
    assert.deepEqual([stripe.seen.at(-1)!.body, stripe.seen.at(-1)!.idempotencyKey], ['payment_intent=pi_keyed', 'order 42 refund']);

    const calls = stripe.seen.length;
    // The REST invoke's idempotency_key rules (1 to 255 visible ASCII, inner spaces allowed).
    const ascii = 'must be visible ASCII (inner spaces allowed)';
    for (const [key, why] of [['', 'must NOT have fewer than 1 characters'], [' lead', ascii], ['trail ', ascii], ['x'.repeat(256), 'must NOT have more than 255 characters'],
      ['tab\there', ascii], ['caf\u00e9', ascii], [42, 'must be string'], [null, 'must be string']] as const) {
      await assert.rejects(client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_1' }, _meta: { [KEY]: key } }), (err: unknown) => {
        assert.ok(err instanceof McpError, String(err));
        assert.equal(err.code, ErrorCode.InvalidParams, JSON.stringify(key));
        assert.equal(err.message, `MCP error -32602: Invalid params: params._meta["${KEY}"] ${why}`, JSON.stringify(key));
        return true;
      });
    }
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
  });

  it('reports a refusal, bad arguments and an inactive instance as tool errors (isError) the model can read', async () => {
    const client = await connect();
    const text = (r: Awaited<ReturnType<Client['callTool']>>) => (r.content as { text: string }[])[0].text;
    const refused = await client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_refused' } });
    assert.equal(refused.isError, true);
    assert.equal(text(refused), "No such payment_intent: 'pi_refused'");

    const calls = stripe.seen.length;
    for (const [args, pattern] of [
      [{}, /^Invalid arguments: arguments must have exactly one of payment_intent or charge$/],
      [{ payment_intent: 'pi_1', charge: 'ch_1' }, /^Invalid arguments: arguments must have exactly one of payment_intent or charge$/],
      [{ payment_intent: 'pi_1', amount: 'ten' }, /arguments\.amount/],
      [{ payment_intent: 'pi_1', surprise: true }, /arguments\.surprise is not an allowed member/],
      // Every member it got wrong, so that the model mends them in one go.
      [{ payment_intent: 'x y', amount: 'ten', zzz: 1 }, /^Invalid arguments \(3\):\n(arguments\.(payment_intent|amount|zzz) [^\n]+(\n|$)){3}$/],
    ] as const) {
      const bad = await client.callTool({ name: REFUND, arguments: args });
      assert.equal(bad.isError, true, JSON.stringify(args));
      assert.match(text(bad), pattern);
    }
    const off = await client.callTool({ name: 'stripe__stripe_process_refund__stripe-off', arguments: { payment_intent: 'pi_1' } });
    assert.equal(off.isError, true);
    assert.match(text(off), /stripe-off' is disabled, not active: an admin disabled it \(PATCH status active enables it\)/);
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
  });

  it('checks the arguments as sent: a "__proto__" member is refused as REST refuses it, not dropped and the call run', async () => {
    const calls = stripe.seen.length;
    const args = `{"payment_intent": "pi_proto", "__proto__": {"amount": 5}}`;
    const call = (id: number) => `{"jsonrpc": "2.0", "id": ${id}, "method": "tools/call", "params": {"name": "${REFUND}", "arguments": ${args}}}`;
    const refusal = 'Invalid arguments: arguments.__proto__ is not an allowed member';
    const single = (await (await rawPost(call(1))).json()) as { result: { isError?: boolean; content: { text: string }[] } };
    assert.deepEqual([single.result.isError, single.result.content[0].text], [true, refusal]);
    const batch = (await (await rawPost(`[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, ${call(2)}]`)).json()) as { id: number; result: { isError?: boolean; content?: { text: string }[] } }[];
    const member = batch.find((a) => a.id === 2)!;
    assert.deepEqual([member.result.isError, member.result.content![0].text], [true, refusal]);
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
  });

  // The request's log lines, once its own "request" line is written.
  async function linesOf(reqId: string): Promise<{ level: number; msg: string; req_id?: string }[]> {
    await waitFor(async () => stack.api.logs.some((l) => l.includes(`"req_id":"${reqId}"`) && l.includes('"msg":"request"')), 'the request line');
    return stack.api.logs.filter((l) => l.includes(`"req_id":"${reqId}"`)).map((l) => JSON.parse(l));
  }
  const rawCall = async (name: string, args: Record<string, unknown>) => {
    const r = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name, arguments: args } }));
    return { reqId: r.headers.get('x-request-id')!, answer: (await r.json()) as { result?: { isError?: boolean }; error?: { code: number; message: string } } };
  };

  it('logs a tool call as REST logs the invoke: the call under the request id, a provider giving no answer at warn (a tool error), a fault of ours at error (-32603, its text not shown)', async () => {
    const ok = await rawCall(REFUND, { payment_intent: 'pi_logged' });
    assert.equal(ok.answer.result?.isError, undefined);
    assert.ok((await linesOf(ok.reqId)).some((l) => l.msg === 'bridge function invoked'), 'the call is logged under the request id');
    const viaRest = await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_logged' } });
    assert.ok((await linesOf(viaRest.headers.get('x-request-id')!)).some((l) => l.msg === 'bridge function invoked'), 'so is the invoke');

    const hold = await rawCall(REFUND, { payment_intent: 'pi_hold' });
    assert.equal(hold.answer.result?.isError, true);
    assert.ok((await linesOf(hold.reqId)).some((l) => l.level === 40 && /^mcp tool call failed: bad_gateway$/.test(l.msg)));

    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'stripe-damaged', display_name: 'damaged', resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await c.post(`${B}/provider/stripe-damaged/function/stripe_process_refund/enable`, {})).status, 201);
    // The stored ciphertext no longer opens with its DEK.
    await testDb()('bridge_credentials').where({ id: cred.body.id }).update({ value: JSON.stringify({ api_key: 'A'.repeat(40) }) });
    const rest = await c.post(`${B}/provider/stripe-damaged/function/stripe_process_refund/invoke`, { params: { payment_intent: 'pi_1' } });
    assert.equal(rest.status, 500);
    const damaged = await rawCall('stripe__stripe_process_refund__stripe-damaged', { payment_intent: 'pi_1' });
    assert.deepEqual(damaged.answer.error, { code: ErrorCode.InternalError, message: 'The service failed to complete the request; its operator can find why in its log' });
    assert.ok((await linesOf(damaged.reqId)).some((l) => l.level === 50 && l.msg === 'mcp request failed'));
    assert.ok(!JSON.stringify(damaged.answer).includes(cred.body.id), 'the credential is not named to the client');
    assert.equal((await c.delete(`${B}/provider/stripe-damaged`)).status, 200);
  });

  it('answers an unknown tool with the protocol error -32602', async () => {
    const client = await connect();
    for (const name of ['nope', 'stripe.stripe_process_refund', 'stripe.stripe_process_refund.stripe-bare', 'stripe.stripe_process_refund.no-such',
      'google_mail.stripe_process_refund.stripe-main', 'stripe.google_mail_send_email.stripe-main', 'stripe.stripe_process_refund.stripe-main.x',
      'stripe__stripe_process_refund', 'stripe__stripe_process_refund__', 'stripe__stripe_process_refund__stripe-bare', 'stripe__stripe_process_refund__no-such',
      'google_mail__stripe_process_refund__stripe-main', 'stripe__google_mail_send_email__stripe-main', 'stripe__stripe_process_refund__stripe-main.x',
      'stripe_stripe_process_refund_stripe-main', `stripe__stripe_process_refund__stripe-main${'_'.repeat(64 - REFUND.length)}`]) {
      await assert.rejects(client.callTool({ name, arguments: { payment_intent: 'pi_1' } }), (err: unknown) => {
        assert.ok(err instanceof McpError, String(err));
        assert.equal(err.code, ErrorCode.InvalidParams);
        assert.match(err.message, new RegExp(`Unknown tool: ${name.replace(/\./g, '\\.')}`));
        return true;
      });
    }
  });

  it('names every tool as the Anthropic and OpenAI APIs take it, shortening long identities with a hash so none collide, and calls it by that name or the old dotted one', async () => {
    // The longest instance ids the API takes (64), two sharing all the characters a shortened name keeps.
    const head = 'L'.repeat(63);
    const longIds = [`${head}a`, `${head}b`, 'm'.repeat(33), 'n'.repeat(32)];
    for (const id of longIds) {
      const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
      assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: id, display_name: 'long', resource_server_credential_id: cred.body.id })).status, 201);
      assert.equal((await c.post(`${B}/provider/${id}/function/stripe_process_refund/enable`, {})).status, 201);
    }
    try {
      const client = await connect();
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name);
      for (const name of names) assert.match(name, HOST_NAME);
      assert.equal(new Set(names).size, names.length, 'no two tools share a name');
      assert.equal(names.length, 1 + longIds.length);
      // Under 64 characters the name is the identity itself; at 64 or more it is cut to 47, `_` and
      // 16 hex of SHA-256 of the identity, so it is the same on every call and every release.
      const expected = (id: string) => {
        const full = `stripe__stripe_process_refund__${id}`;
        if (full.length < 64) return full;
        return `${full.slice(0, 47)}_${createHash('sha256').update(`stripe\nstripe_process_refund\n${id}`).digest('hex').slice(0, 16)}`;
      };
      assert.deepEqual(longIds.map(expected).map((n) => names.includes(n)), [true, true, true, true], JSON.stringify(names));
      assert.equal(expected('n'.repeat(32)), `stripe__stripe_process_refund__${'n'.repeat(32)}`);
      assert.equal(expected('m'.repeat(33)).length, 64);
      assert.equal(expected(longIds[0]).slice(0, 47), expected(longIds[1]).slice(0, 47));
      assert.deepEqual((await (await connect()).listTools()).tools.map((t) => t.name), names, 'the same names on the next call');

      // Each listed name calls its own instance; the old dotted name calls the same one.
      for (const [i, id] of longIds.entries()) {
        const r = await client.callTool({ name: expected(id), arguments: { payment_intent: `pi_long_${i}` } });
        assert.equal(r.isError, undefined, JSON.stringify(r));
        assert.equal(stripe.seen.at(-1)!.body, `payment_intent=pi_long_${i}`);
      }
      const dotted = await client.callTool({ name: DOTTED_REFUND, arguments: { payment_intent: 'pi_dotted' } });
      assert.equal(dotted.isError, undefined, JSON.stringify(dotted));
      assert.equal(stripe.seen.at(-1)!.body, 'payment_intent=pi_dotted');
      // A shortened name with another hash, or the uncut identity, names no tool.
      const calls = stripe.seen.length;
      for (const name of [`${expected(longIds[0]).slice(0, 48)}${'0'.repeat(16)}`, `stripe__stripe_process_refund__${'m'.repeat(33)}`]) {
        await assert.rejects(client.callTool({ name, arguments: { payment_intent: 'pi_1' } }), (err: unknown) =>
          err instanceof McpError && err.code === ErrorCode.InvalidParams && err.message === `MCP error -32602: Unknown tool: ${name}`);
      }
      assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
    } finally {
      for (const id of longIds) assert.equal((await c.delete(`${B}/provider/${id}`)).status, 200);
    }
  });

  it('keeps controller type ids free of "__" and a trailing "_", so a full tool name reads back one way', async () => {
    const providers = (await c.get(`${B}/available-providers?page_size=100`)).body.items as { type_id: string; functions: { type_id: string }[] }[];
    assert.ok(providers.length >= 2);
    for (const id of providers.flatMap((p) => [p.type_id, ...p.functions.map((f) => f.type_id)])) assert.match(id, /^(?!.*__)[a-z0-9_]*[a-z0-9]$/);
  });

  it('answers any other name a client sends (huge, unicode, NUL, empty) with -32602, never a 500', async () => {
    const calls = stripe.seen.length;
    for (const [name, message] of [
      ['x'.repeat(100_000), `Unknown tool: ${'x'.repeat(60)}… (100000 characters); tool names have at most 64 characters`],
      ['stripe__stripe_process_refund__stripé', 'Unknown tool: stripe__stripe_process_refund__stripé'],
      ['stripe__stripe_process_refund__\u{1F600}', 'Unknown tool: stripe__stripe_process_refund__\u{1F600}'],
      ['', 'Unknown tool: '],
      ['stripe.stripe_process_refund.stripe-main\n', 'Unknown tool: stripe.stripe_process_refund.stripe-main\\n'],
      [`${REFUND}\u0000`, 'Invalid params: params.name: contains a NUL character or an unpaired surrogate'],
    ] as const) {
      const r = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name, arguments: { payment_intent: 'pi_1' } } }));
      assert.equal(r.status, 200, name.slice(0, 60));
      assert.deepEqual(await r.json(), { jsonrpc: '2.0', id: 3, error: { code: ErrorCode.InvalidParams, message } }, name.slice(0, 60));
    }
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
  });

  it('answers params of the wrong shape with -32602 naming the field, for every method it serves, and a call as a task with -32601, not an internal or parse error', async () => {
    const cases: [string, unknown, RegExp][] = [
      // Worded as the rest of the API words a member missing or of the wrong type, not in the SDK's zod words
      // ("Invalid input: expected string, received undefined").
      ['tools/call', { name: 5 }, /^Invalid params: params\.name must be a string$/],
      ['tools/call', { name: 'stripe.stripe_process_refund.stripe-main', arguments: 'notobj' }, /^Invalid params: params\.arguments must be an object$/],
      ['tools/call', {}, /^Invalid params: params\.name is required$/],
      ['tools/call', undefined, /^Invalid params: params is required$/],
      ['tools/call', 5, /^Invalid params: params must be an object$/],
      ['tools/list', { cursor: 5 }, /^Invalid params: params\.cursor must be a string$/],
      ['initialize', { protocolVersion: 5, capabilities: {}, clientInfo: { name: 'x', version: '1' } }, /^Invalid params: params\.protocolVersion must be a string$/],
      ['initialize', { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x' } }, /^Invalid params: params\.clientInfo\.version is required$/],
      ['ping', { _meta: 'x' }, /^Invalid params: params\._meta must be an object$/],
    ];
    for (const [method, params, pattern] of cases) {
      const r = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 7, method, params }));
      assert.equal(r.status, 200, `${method} ${JSON.stringify(params)}`);
      const body = (await r.json()) as { id: number; error: { code: number; message: string } };
      assert.equal(body.id, 7);
      assert.equal(body.error.code, ErrorCode.InvalidParams, JSON.stringify(body));
      assert.match(body.error.message, pattern);
    }
    // A tool call sent as a task (MCP 2025-11-25) is refused before it runs: these tools are plain calls only.
    const calls = stripe.seen.length;
    const asTask = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'stripe.stripe_process_refund.stripe-main', arguments: { payment_intent: 'pi_task' }, task: { ttl: 60000 } } }));
    assert.equal(asTask.status, 200);
    assert.deepEqual(await asTask.json(), { jsonrpc: '2.0', id: 9, error: { code: ErrorCode.MethodNotFound, message: 'Method not found: tools/call as a task; this server runs tools as plain calls only (it declares no tasks capability)' } });
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
    // The transport's own refusals come first: a client that accepts no JSON gets 406 whatever its params.
    const unacceptable = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 8, method: 'tools/list', params: { cursor: 5 } }), { accept: 'text/html' });
    assert.equal(unacceptable.status, 406);
  });

  it('needs an API key with scope bridge:invoke (401, 403)', async () => {
    await assert.rejects(connect('not-a-key'), /401|unauthenticated|Unauthorized/i);
    const readOnly = (await c.post('/api/auth/v1/api-key', { name: 'bridge reader', scopes: ['bridge:read'] })).body.key;
    await assert.rejects(connect(readOnly), /403|forbidden/i);
    const invoker = (await c.post('/api/auth/v1/api-key', { name: 'bridge invoker', scopes: ['bridge:invoke'] })).body.key;
    const client = await connect(invoker);
    assert.deepEqual((await client.listTools()).tools.map((t) => t.name), [REFUND]);
  });

  // A refund as one POST, from a page of `origin` (undefined: no Origin, as the SDK's Node client sends).
  const refundFrom = (origin: string | undefined, pi: string, headers: Record<string, string> = {}) =>
    rawPost(JSON.stringify({ jsonrpc: '2.0', id: 'o', method: 'tools/call', params: { name: REFUND, arguments: { payment_intent: pi } } }), { ...(origin === undefined ? {} : { origin }), ...headers });
  const forbidden = (named: string) => ({ jsonrpc: '2.0', id: null, error: { code: -32000, message: `Forbidden: ${named} is not allowed` } });

  it('refuses a request whose Origin is not allowed (DNS rebinding) with 403 and a JSON-RPC error without an id, running nothing', async () => {
    const calls = stripe.seen.length;
    for (const origin of [
      'https://evil.example',
      // Close to an allowed one: another scheme, port or host, a suffix; not an origin at all (a path, a list).
      'http://bridge.example.com', 'https://bridge.example.com:8443', 'https://app.example.com.evil.example', 'http://localhost:5174', 'https://evil.example/https://app.example.com',
      'https://app.example.com, https://evil.example',
      // The opaque origin of a sandboxed iframe or a file:// page.
      'null',
      // The Host it was sent to: under DNS rebinding a foreign page's Origin names the Host it reached.
      new URL(stack.api.url).origin,
    ]) {
      const r = await refundFrom(origin, 'pi_foreign');
      assert.equal(r.status, 403, origin);
      assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
      assert.deepEqual(await r.json(), forbidden(`Origin ${origin}`), origin);
    }
    // A batch, and a notification (else 202), are refused all the same.
    for (const body of [[{ jsonrpc: '2.0', id: 1, method: 'ping' }, { jsonrpc: '2.0', method: 'notifications/initialized' }], { jsonrpc: '2.0', method: 'notifications/initialized' }]) {
      const r = await rawPost(JSON.stringify(body), { origin: 'https://evil.example' });
      assert.deepEqual([r.status, await r.json()], [403, forbidden('Origin https://evil.example')], JSON.stringify(body));
    }
    // Said without quoting what cannot be: an empty Origin, a long one only by its length.
    const empty = await new Promise<{ status: number; body: unknown }>((resolve, reject) => {
      const ping = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}';
      http.request(mcpUrl, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(ping), origin: '' } }, (res) => {
        let text = '';
        res.on('data', (chunk) => (text += chunk)).on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
      }).on('error', reject).end(ping);
    });
    assert.deepEqual(empty, { status: 403, body: forbidden('An empty Origin') });
    const long = `https://${'a'.repeat(300)}.example`;
    assert.deepEqual(await (await refundFrom(long, 'pi_foreign')).json(), forbidden(`Origin ${long.slice(0, 60)}… (${long.length} characters)`));
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
    // The operator can tell why from the log.
    const refused = await refundFrom('https://evil.example', 'pi_foreign');
    const lines = await linesOf(refused.headers.get('x-request-id')!);
    assert.ok(lines.some((l) => l.msg === 'mcp request refused: Origin not allowed' && (l as { origin?: string }).origin === 'https://evil.example'), JSON.stringify(lines));
  });

  it("takes a request from PUBLIC_URL's origin and from MCP_ALLOWED_ORIGINS, however the origin is spelt, and one without Origin", async () => {
    let calls = stripe.seen.length;
    for (const origin of ['https://bridge.example.com', 'HTTPS://Bridge.EXAMPLE.com:443', 'https://app.example.com', 'https://APP.example.com', 'http://localhost:5173', 'http://LOCALHOST:5173/', undefined]) {
      const r = await refundFrom(origin, 'pi_origin');
      assert.equal(r.status, 200, String(origin));
      const answer = (await r.json()) as { result: { isError?: boolean; structuredContent: { payment_intent: string } } };
      assert.equal(answer.result.isError, undefined, String(origin));
      assert.equal(stripe.seen.length, ++calls, `${origin}: the call ran`);
    }
    // The SDK's Node client sends no Origin: it connects and calls.
    const client = await connect();
    assert.equal((await client.callTool({ name: REFUND, arguments: { payment_intent: 'pi_sdk' } })).isError, undefined);
  });

  it('checks the Origin before the API key: a foreign page gets the same 403 whatever key it sends, an allowed one the usual 401 and 403', async () => {
    const readOnly = (await c.post('/api/auth/v1/api-key', { name: 'mcp origin reader', scopes: ['bridge:read'] })).body.key;
    const calls = stripe.seen.length;
    for (const authorization of [undefined, 'Bearer not-a-key', `Bearer ${readOnly}`, `Bearer ${ADMIN_KEY}`]) {
      const r = await fetch(mcpUrl, {
        method: 'POST', body: '{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
        headers: { 'content-type': 'application/json', origin: 'https://evil.example', ...(authorization ? { authorization } : {}) },
      });
      assert.deepEqual([r.status, await r.json()], [403, forbidden('Origin https://evil.example')], String(authorization));
    }
    assert.equal(stripe.seen.length, calls);
    const noKey = await fetch(mcpUrl, { method: 'POST', body: '{"jsonrpc": "2.0", "id": 1, "method": "ping"}', headers: { 'content-type': 'application/json', origin: 'https://app.example.com' } });
    assert.equal(noKey.status, 401);
    assert.equal(((await noKey.json()) as { data: { code: string } }).data.code, 'unauthenticated');
    const scope = await refundFrom('https://app.example.com', 'pi_scope', { authorization: `Bearer ${readOnly}` });
    assert.equal(scope.status, 403);
    assert.equal(((await scope.json()) as { data: { code: string } }).data.code, 'forbidden');
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
  });

  it('speaks HTTP as the transport specifies: earlier protocol revisions, parse errors, no GET stream, no sessions', async () => {
    const init = (version: string) => JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '0' } },
    });
    const old = await rawPost(init('2025-03-26'));
    assert.equal(old.status, 200);
    const oldBody = (await old.json()) as { result: { protocolVersion: string } };
    assert.equal(oldBody.result.protocolVersion, '2025-03-26');
    assert.equal(old.headers.get('mcp-session-id'), null, 'stateless: no session id');

    const broken = await rawPost('{"jsonrpc": "2.0", "id": 1, "method": ');
    assert.equal(broken.status, 400);
    const brokenBody = (await broken.json()) as { id: unknown; error: { code: number } };
    assert.equal(brokenBody.error.code, -32700);
    assert.equal(brokenBody.id, null);
    // No JSON at all is unreadable JSON too (it was -32600 'a message must be a JSON object').
    const empty = await rawPost('');
    assert.equal(empty.status, 400);
    assert.deepEqual(await empty.json(), { jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error: Request body is empty' } });

    const notAccepting = await rawPost(init('2025-11-25'), { accept: 'text/html' });
    assert.equal(notAccepting.status, 406);

    const get = await fetch(mcpUrl, { headers: { authorization: `Bearer ${ADMIN_KEY}`, accept: 'text/event-stream' } });
    assert.equal(get.status, 405);
    assert.equal((await fetch(mcpUrl, { method: 'DELETE', headers: { authorization: `Bearer ${ADMIN_KEY}` } })).status, 405);
  });

  it('takes its URL with a query string (a tracing or cache-busting parameter a host adds) as without: the SDK client connects and lists the tools', async () => {
    const client = new Client({ name: 'taskbridge-test', version: '1.0.0' });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${mcpUrl}?trace=1&v=2`), { requestInit: { headers: { authorization: `Bearer ${ADMIN_KEY}` } } }));
    clients.push(client);
    const { tools } = await client.listTools();
    assert.ok(tools.some((t) => t.name === REFUND), JSON.stringify(tools.map((t) => t.name)));
  });

  it('refuses a body it cannot read with 415 in the Error body, as every endpoint does, never the transport\'s JSON-RPC 415; takes the JSON types the API takes', async () => {
    const ping = JSON.stringify({ jsonrpc: '2.0', id: 'a', method: 'ping' });
    for (const [headers, message] of [
      [{ 'content-type': 'text/plain' }, "Content-Type must be application/json, got 'text/plain'"],
      [{ 'content-type': 'application/json, text/plain' }, "Content-Type must be application/json, got 'application/json, text/plain'"],
      [{ 'content-type': 'application/json; charset=latin1' }, "Content-Type charset must be utf-8 (JSON is UTF-8), got 'latin1'"],
      [{ 'content-type': 'application/json', 'content-encoding': 'gzip' }, "Content-Encoding 'gzip' is not supported: send the body uncompressed"],
    ] as const) {
      const r = await rawPost(ping, headers);
      assert.deepEqual([r.status, await r.json()], [415, { message, data: { code: 'unsupported_media_type' } }], JSON.stringify(headers));
    }
    // JSON under a structured-syntax type, or with parameters the transport reads as two headers joined:
    // JSON to every other endpoint (api/middleware/body.ts), and so here; the SDK refused them with its own 415.
    for (const type of ['application/vnd.api+json', 'application/merge-patch+json', 'application/json; a=b, c']) {
      const r = await rawPost(ping, { 'content-type': type });
      assert.deepEqual([r.status, await r.json()], [200, { jsonrpc: '2.0', id: 'a', result: {} }], type);
    }
  });

  it('answers any Accept that admits application/json (the one type it answers in), or none, and 406 only when JSON is refused', async () => {
    const ping = JSON.stringify({ jsonrpc: '2.0', id: 'a', method: 'ping' });
    // fetch always sends an Accept (*/* unless told): a request without one goes through node:http.
    const post = (accept: string | undefined) => new Promise<{ status: number; body: unknown }>((resolve, reject) => {
      const req = http.request(mcpUrl, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(ping), ...(accept === undefined ? {} : { accept }) },
      }, (res) => {
        let text = '';
        res.on('data', (chunk) => (text += chunk));
        res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
      });
      req.on('error', reject);
      req.end(ping);
    });
    for (const accept of [undefined, 'application/json', '*/*', 'application/*', 'text/html, application/json;q=0.5', 'Application/JSON, Text/Event-Stream', 'application/json, text/event-stream']) {
      assert.deepEqual(await post(accept), { status: 200, body: { jsonrpc: '2.0', id: 'a', result: {} } }, String(accept));
    }
    for (const accept of ['text/html', 'text/event-stream', 'application/json;q=0', '*/*, application/json;q=0', 'application/xml, text/*']) {
      assert.deepEqual(await post(accept), {
        status: 406, body: { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Not Acceptable: this server answers in application/json, which the Accept header does not allow' } },
      }, accept);
    }
  });

  it('answers JSON that is not a JSON-RPC message with -32600 saying why, echoing an id it can read', async () => {
    const cases: [string, string | number | null, string][] = [
      ['[]', null, 'the batch is empty'],
      ['5', null, 'a message must be a JSON object'],
      ['null', null, 'a message must be a JSON object'],
      ['{"jsonrpc": "2.0", "id": null, "method": "ping"}', null, 'id must be a string or an integer'],
      ['{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', null, 'id must be a string or an integer'],
      ['{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', null, 'id must be a string or an integer'],
      // An integer all the same, but one JSON.parse has rounded (…993 reads as …992): it cannot be echoed as sent.
      ['{"jsonrpc": "2.0", "id": 9007199254740993, "method": "ping"}', null, 'id is an integer past ±(2^53 - 1), which cannot be echoed exactly; send it as a string'],
      // An integer as JSON.parse reads it, but not the number sent: answered, it would be another id.
      ['{"jsonrpc": "2.0", "id": 1e-400, "method": "ping"}', null, 'id 1e-400 would be echoed as 0, another number (JSON numbers are read as doubles): send it as a string or an integer'],
      ['{"jsonrpc": "2.0", "id": 1.00000000000000001, "method": "tools/list"}', null, 'id 1.00000000000000001 would be echoed as 1, another number (JSON numbers are read as doubles): send it as a string or an integer'],
      // Refused first: the refusal of a value that cannot be stored would echo it.
      ['{"jsonrpc": "2.0", "id": 1e-400, "method": "ping", "x": "\\u0000"}', null, 'id 1e-400 would be echoed as 0, another number (JSON numbers are read as doubles): send it as a string or an integer'],
      ['[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "\\u0069d": -1e-400, "method": "ping"}]', null, 'batch member 1: id -1e-400 would be echoed as 0, another number (JSON numbers are read as doubles): send it as a string or an integer'],
      ['{"id": "a", "method": "ping"}', 'a', 'jsonrpc must be "2.0"'],
      ['{"jsonrpc": "2.0", "id": 3, "method": 7}', 3, 'method must be a string'],
      ['{"jsonrpc": "2.0", "id": 4}', 4, 'a message needs a method (a request or notification), or a result or an error (a response)'],
      ['[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, 5]', null, 'batch member 1: a message must be a JSON object'],
    ];
    for (const [body, id, why] of cases) {
      const r = await rawPost(body);
      assert.equal(r.status, 400, body);
      assert.deepEqual(await r.json(), { jsonrpc: '2.0', id, error: { code: ErrorCode.InvalidRequest, message: `Invalid Request: ${why}` } }, body);
    }
    // Well-formed messages still pass: a notification is accepted, a batch answered member by member.
    // 202 with no body, as the transport says: it was Koa's "Accepted" text.
    const accepted = await rawPost('{"jsonrpc": "2.0", "method": "notifications/initialized"}');
    assert.deepEqual([accepted.status, await accepted.text(), accepted.headers.get('content-length')], [202, '', '0']);
    // A cancel names a request by an id only a session could scope: accepted, ending nothing (README).
    assert.equal((await rawPost('{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "stop"}}')).status, 202);
    const batch = await rawPost('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": "two", "method": "ping"}]');
    assert.equal(batch.status, 200);
    assert.deepEqual(((await batch.json()) as { id: unknown }[]).map((m) => m.id), [1, 'two']);
  });

  it('answers JSON-RPC-shaped JSON that MCP does not accept (a stray member, a result or error of the wrong shape, params that are no object) with -32600 naming the member, not -32700', async () => {
    const cases: [string, string | number | null, RegExp][] = [
      ['{"jsonrpc": "2.0", "id": 1, "method": "ping", "extra": 1}', 1, /^Invalid Request: extra is not an allowed member$/],
      ['{"jsonrpc": "2.0", "id": 2, "method": "ping", "result": {}}', 2, /^Invalid Request: result is not an allowed member$/],
      ['{"jsonrpc": "2.0", "id": 3, "result": 5}', 3, /^Invalid Request: result must be an object$/],
      ['{"jsonrpc": "2.0", "id": 4, "error": {"code": "x", "message": "m"}}', 4, /^Invalid Request: error\.code must be a number$/],
      ['{"jsonrpc": "2.0", "id": 5, "error": 5}', 5, /^Invalid Request: error must be an object$/],
      ['{"jsonrpc": "2.0", "id": 6, "method": "foo/bar", "params": 5}', 6, /^Invalid Request: params must be an object$/],
      ['{"jsonrpc": "2.0", "method": "notifications/initialized", "params": 5}', null, /^Invalid Request: params must be an object$/],
      ['{"jsonrpc": "2.0", "id": "m", "method": "foo/bar", "params": {"_meta": 5}}', 'm', /^Invalid Request: params\._meta must be an object$/],
      ['[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": 5}]', 2, /^Invalid Request: batch member 1: params must be an object$/],
    ];
    for (const [body, id, pattern] of cases) {
      const r = await rawPost(body);
      assert.equal(r.status, 400, body);
      const answer = (await r.json()) as { id: unknown; error: { code: number; message: string } };
      assert.equal(answer.id, id, body);
      assert.equal(answer.error.code, ErrorCode.InvalidRequest, `${body}: ${JSON.stringify(answer)}`);
      assert.match(answer.error.message, pattern, body);
    }
    // A request to a method this server serves keeps its -32602 for params that are no object.
    const list = await rawPost('{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": 5}');
    assert.equal(list.status, 200);
    assert.equal(((await list.json()) as { error: { code: number } }).error.code, ErrorCode.InvalidParams);
  });

  it('answers valid JSON it cannot take (NUL, lone surrogate, deep nesting, 1e400) as -32602 in params or -32600 elsewhere, not -32700', async () => {
    const call = (args: string, id = '11') => `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":{"name":"${REFUND}","arguments":${args}}}`;
    const calls = stripe.seen.length;
    for (const [body, path, why] of [
      [call('{"payment_intent":"pi\\u0000"}'), 'params.arguments.payment_intent', 'contains a NUL character or an unpaired surrogate'],
      [call('{"payment_intent":"\\ud800"}'), 'params.arguments.payment_intent', 'contains a NUL character or an unpaired surrogate'],
      [call('{"payment_intent":"pi_1","amount":1e400}'), 'params.arguments.amount', 'is a number too large for JSON (it would be kept as null)'],
      [call(`{"x":${'['.repeat(100)}${']'.repeat(100)}}`), `params.arguments.x${'.0'.repeat(61)}`, 'nests deeper than 64 levels'],
    ] as const) {
      const r = await rawPost(body);
      assert.equal(r.status, 200, body.slice(0, 120));
      assert.deepEqual(await r.json(), { jsonrpc: '2.0', id: 11, error: { code: ErrorCode.InvalidParams, message: `Invalid params: ${path}: ${why}` } });
    }
    // Outside params, or without an id to answer: the message itself is invalid.
    const method = await rawPost('{"jsonrpc":"2.0","id":"m","method":"tools/li\\u0000st"}');
    assert.equal(method.status, 400);
    assert.deepEqual(await method.json(), { jsonrpc: '2.0', id: 'm', error: { code: ErrorCode.InvalidRequest, message: 'Invalid Request: method: contains a NUL character or an unpaired surrogate' } });
    const id = await rawPost(call('{"payment_intent":"pi_1"}', '1e400'));
    assert.equal(id.status, 400);
    assert.deepEqual(await id.json(), { jsonrpc: '2.0', id: null, error: { code: ErrorCode.InvalidRequest, message: 'Invalid Request: id: is a number too large for JSON (it would be kept as null)' } });
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
  });

  it('answers a method it does not serve with -32601 naming the method, alone and in a batch, as A2A does', async () => {
    for (const method of ['resources/list', 'prompts/get', 'logging/setLevel', 'no/such', '__proto__', 'toString']) {
      const r = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 4, method, params: {} }));
      assert.equal(r.status, 200);
      assert.deepEqual(await r.json(), { jsonrpc: '2.0', id: 4, error: { code: ErrorCode.MethodNotFound, message: `Method not found: ${method}` } });
    }
    const long = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 4, method: 'm'.repeat(5000) }));
    assert.deepEqual(await long.json(), { jsonrpc: '2.0', id: 4, error: { code: ErrorCode.MethodNotFound, message: `Method not found: ${'m'.repeat(60)}… (5000 characters)` } });
    const forged = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 4, method: 'no/such\r\nX-Forged: 1' }));
    assert.deepEqual(await forged.json(), { jsonrpc: '2.0', id: 4, error: { code: ErrorCode.MethodNotFound, message: 'Method not found: no/such\\r\\nX-Forged: 1' } });
    const batch = await rawPost('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "x"}}]');
    assert.deepEqual(await batch.json(), [{ jsonrpc: '2.0', id: 1, result: {} }, { jsonrpc: '2.0', id: 2, error: { code: ErrorCode.MethodNotFound, message: 'Method not found: resources/read' } }]);
  });

  it('words protocol errors once: no "MCP error <code>:" prefix on the wire for SDK clients to repeat', async () => {
    const r = await rawPost(JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'stripe.stripe_process_refund.no-such', arguments: {} } }));
    assert.deepEqual(await r.json(), { jsonrpc: '2.0', id: 5, error: { code: ErrorCode.InvalidParams, message: 'Unknown tool: stripe.stripe_process_refund.no-such' } });
    const client = await connect();
    await assert.rejects(client.listTools({ cursor: 'not-a-cursor' }), (err: unknown) =>
      err instanceof McpError && err.message === 'MCP error -32602: Invalid params: params.cursor: is not a cursor this server gave');
  });

  it('refuses a JSON-RPC batch from a client on MCP 2025-06-18 or later (that revision removed batches) before running any of it', async () => {
    const calls = stripe.seen.length;
    const batch = JSON.stringify([
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: REFUND, arguments: { payment_intent: 'pi_batch' } } },
      { jsonrpc: '2.0', id: 2, method: 'ping' },
    ]);
    for (const version of ['2025-06-18', '2025-11-25']) {
      const r = await rawPost(batch, { 'mcp-protocol-version': version });
      assert.equal(r.status, 400, version);
      assert.deepEqual(await r.json(), { jsonrpc: '2.0', id: null, error: { code: ErrorCode.InvalidRequest, message: `Invalid Request: MCP ${version} has no JSON-RPC batches; send one message per POST` } });
    }
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
    // 2025-03-26, also assumed when the header is absent, has them; an unsupported version stays the transport's 400.
    const pings = JSON.stringify([{ jsonrpc: '2.0', id: 1, method: 'ping' }, { jsonrpc: '2.0', id: 2, method: 'ping' }]);
    for (const headers of [{ 'mcp-protocol-version': '2025-03-26' }, {}] as Record<string, string>[]) {
      const r = await rawPost(pings, headers);
      assert.equal(r.status, 200);
      assert.deepEqual(await r.json(), [{ jsonrpc: '2.0', id: 1, result: {} }, { jsonrpc: '2.0', id: 2, result: {} }]);
    }
    const unsupported = await rawPost(pings, { 'mcp-protocol-version': '1999-01-01' });
    assert.equal(unsupported.status, 400);
    assert.match(((await unsupported.json()) as { error: { message: string } }).error.message, /Unsupported protocol version: 1999-01-01/);
  });

  it('answers a 2025-03-26 batch as JSON-RPC says: an array even of one, -32602 or -32601 per member, and refuses a request id used twice', async () => {
    const one = await rawPost('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]');
    assert.equal(one.status, 200);
    assert.deepEqual(await one.json(), [{ jsonrpc: '2.0', id: 1, result: {} }]);

    const calls = stripe.seen.length;
    const mixed = await rawPost(JSON.stringify([
      { jsonrpc: '2.0', id: 1, method: 'tools/list', params: { cursor: 5 } },
      { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: REFUND, arguments: { payment_intent: 'pi_task' }, task: { ttl: 60000 } } },
      { jsonrpc: '2.0', method: 'notifications/initialized' },
      { jsonrpc: '2.0', id: 3, method: 'ping' },
    ]));
    assert.equal(mixed.status, 200);
    const [list, task, ping, ...more] = (await mixed.json()) as { id: number; error?: { code: number; message: string } }[];
    assert.equal(more.length, 0);
    assert.equal(list.id, 1);
    assert.equal(list.error?.code, ErrorCode.InvalidParams);
    assert.equal(list.error!.message, 'Invalid params: params.cursor must be a string');
    assert.deepEqual(task, { jsonrpc: '2.0', id: 2, error: { code: ErrorCode.MethodNotFound, message: 'Method not found: tools/call as a task; this server runs tools as plain calls only (it declares no tasks capability)' } });
    assert.deepEqual(ping, { jsonrpc: '2.0', id: 3, result: {} });

    // Both calls would run and only one be answered: the batch is refused before either runs.
    const call = (pi: string) => ({ jsonrpc: '2.0', id: 'a', method: 'tools/call', params: { name: REFUND, arguments: { payment_intent: pi } } });
    const twice = await rawPost(JSON.stringify([{ jsonrpc: '2.0', id: 'a', result: {} }, call('pi_twice_1'), call('pi_twice_2')]));
    assert.equal(twice.status, 400);
    assert.deepEqual(await twice.json(), { jsonrpc: '2.0', id: null, error: { code: ErrorCode.InvalidRequest, message: 'Invalid Request: batch members 1 and 2 are requests with the same id "a"' } });
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');

    // Twenty messages at most: the answers of a batch are all held until its last.
    const batchOf = (n: number) => JSON.stringify([call('pi_many'), ...Array.from({ length: n - 1 }, (_, i) => ({ jsonrpc: '2.0', id: i, method: 'tools/list' }))]);
    const many = await rawPost(batchOf(21));
    assert.equal(many.status, 400);
    assert.deepEqual(await many.json(), { jsonrpc: '2.0', id: null, error: { code: ErrorCode.InvalidRequest, message: 'Invalid Request: a batch holds at most 20 messages, not 21; send the rest in another POST' } });
    assert.equal(stripe.seen.length, calls, 'nothing reached the provider');
    const twenty = await rawPost(batchOf(20));
    assert.equal(twenty.status, 200);
    assert.equal(((await twenty.json()) as unknown[]).length, 20);
    assert.equal(stripe.seen.length, calls + 1, 'the call of the batch of twenty ran');

    // MCP 2025-03-26: initialize MUST NOT be part of a batch, alone or not.
    const initialize = { jsonrpc: '2.0', id: 'i', method: 'initialize', params: { protocolVersion: '2025-03-26', capabilities: {}, clientInfo: { name: 'raw', version: '0' } } };
    for (const members of [[initialize], [{ jsonrpc: '2.0', method: 'notifications/initialized' }, initialize]]) {
      const batched = await rawPost(JSON.stringify(members));
      assert.equal(batched.status, 400);
      assert.deepEqual(await batched.json(), { jsonrpc: '2.0', id: null, error: { code: ErrorCode.InvalidRequest, message: `Invalid Request: batch member ${members.length - 1}: initialize is sent alone, never in a batch` } });
    }
  });

  it('answers every request of a batch that also cancels it: notifications/cancelled stops nothing, in a batch too', async () => {
    const calls = stripe.seen.length;
    const refund = await rawPost(JSON.stringify([
      { jsonrpc: '2.0', id: 'r1', method: 'tools/call', params: { name: REFUND, arguments: { payment_intent: 'pi_batch_cancel' } } },
      { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'r1', reason: 'changed my mind' } },
    ]));
    assert.equal(refund.status, 200);
    const [answer, ...more] = (await refund.json()) as { id: string; result: { structuredContent: unknown } }[];
    assert.equal(more.length, 0);
    assert.equal(answer.id, 'r1');
    assert.deepEqual(answer.result.structuredContent, { id: 're_1', object: 'refund', amount: 1000, status: 'succeeded', payment_intent: 'pi_batch_cancel' });
    assert.equal(stripe.seen.length, calls + 1, 'the refund reached the provider');

    const ping = await rawPost(JSON.stringify([
      { jsonrpc: '2.0', id: 1, method: 'ping' },
      { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1 } },
    ]));
    assert.equal(ping.status, 200);
    assert.deepEqual(await ping.json(), [{ jsonrpc: '2.0', id: 1, result: {} }]);
  });

  it('lists tools in pages, following nextCursor, full pages whatever is left out, and refuses a cursor it did not give with -32602', async () => {
    // More enabled function instances than a page holds, written straight to the tables: clones of
    // stripe-main, each beside a disabled clone (no tool) of the same time, next to it in key order.
    const extra = TOOLS_PAGE + 20;
    await testDb().raw(`insert into provider_instances (id, display_name, provider_controller_type_id, credential_controller_type_id, status, resource_server_credential_id)
      select 'stripe-many-' || g || s, 'many', provider_controller_type_id, credential_controller_type_id, case s when '' then status else 'disabled' end, resource_server_credential_id
        from provider_instances, generate_series(1, ?) g, unnest(array['', '-off']) s where id = 'stripe-main'`, [extra]);
    await testDb().raw(`insert into function_instances (provider_instance_id, function_controller_type_id, provider_controller_type_id)
      select id, 'stripe_process_refund', 'stripe' from provider_instances where id like 'stripe-many-%'`);
    try {
      const client = await connect();
      const first = await client.listTools();
      assert.equal(first.tools.length, TOOLS_PAGE);
      assert.ok(first.nextCursor);
      const second = await client.listTools({ cursor: first.nextCursor });
      assert.equal(second.nextCursor, undefined);
      const names = [...first.tools, ...second.tools].map((t) => t.name);
      assert.equal(names.length, extra + 1);
      assert.ok(!names.some((n) => n.endsWith('-off')), 'no disabled instance');
      assert.equal(new Set(names).size, names.length, 'no tool twice');
      assert.ok(names.includes(REFUND));
      await assert.rejects(client.listTools({ cursor: 'not-a-cursor' }), (err: unknown) =>
        err instanceof McpError && err.code === ErrorCode.InvalidParams && /params\.cursor/.test(err.message));
    } finally {
      await testDb()('provider_instances').where('id', 'like', 'stripe-many-%').delete();
    }
  });
});

describe('MCP server with MCP_ALLOWED_ORIGINS=*', () => {
  const stack = useStack({ MCP_ALLOWED_ORIGINS: 'https://app.example.com,*' }, { workers: 0 });

  it('takes a request from any Origin, null too (the behaviour before Origins were checked)', async () => {
    for (const origin of ['https://evil.example', 'null', 'not an origin', 'http://localhost:5173']) {
      const r = await fetch(`${stack.api.url}/api/bridge/v1/mcp`, {
        method: 'POST', body: '{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', origin },
      });
      assert.deepEqual([r.status, await r.json()], [200, { jsonrpc: '2.0', id: 1, result: {} }], origin);
    }
  });
});

describe('MCP batches and RATE_LIMIT_PER_SECOND', () => {
  const limit = 10;
  let stripe: FakeProviders;
  let key: string;
  const stack = useStarted(async () => {
    stripe = await startFakeProviders({ stripeKey: STRIPE_KEY });
    return startStack({ RATE_LIMIT_PER_SECOND: String(limit), STRIPE_API_BASE_URL: stripe.url, BRIDGE_ALLOW_PRIVATE: 'true' }, { workers: 0 });
  }, async (started) => {
    await started?.stop();
    stripe?.close();
  });
  const post = (body: unknown) => fetch(`${stack.api.url}${B}/mcp`, {
    method: 'POST', body: JSON.stringify(body),
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', accept: 'application/json' },
  });
  const refunds = (n: number, batch: string) => Array.from({ length: n }, (_, i) => ({ jsonrpc: '2.0', id: i, method: 'tools/call', params: { name: REFUND, arguments: { payment_intent: `pi_${batch}_${i}` } } }));
  // What a key may send is counted in windows of this machine's wall-clock seconds: a burst shows the
  // limit exactly only if it falls in one. Each try starts at the top of a second (what came before falls
  // in an earlier one); one that ends in the next second tells nothing and is tried again, and a machine
  // too loaded for any to fit fails the test rather than passing unchecked.
  async function inOneSecond<T>(burst: (attempt: number) => Promise<T>, tries = 5): Promise<T> {
    for (let attempt = 0; attempt < tries; attempt++) {
      await sleep(1000 - (Date.now() % 1000));
      const from = Date.now();
      const result = await burst(attempt);
      if (Math.floor(Date.now() / 1000) === Math.floor(from / 1000)) return result;
    }
    assert.fail(`none of ${tries} tries fitted its burst in one second: too loaded to tell`);
  }

  before(async () => {
    const c = stack.client;
    const cred = await c.post(`${avail('stripe', 'api_key')}/credential/resource-server`, { value: { api_key: STRIPE_KEY } });
    assert.equal(cred.status, 201, cred.text);
    assert.equal((await c.post(avail('stripe', 'api_key'), { provider_instance_id: 'stripe-main', display_name: 'main', resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await c.post(`${B}/provider/stripe-main/function/stripe_process_refund/enable`, {})).status, 201);
    // A key of its own: the set-up above took the admin key's requests.
    const created = await c.post('/api/auth/v1/api-key', { name: 'mcp batches', scopes: ['bridge:invoke'] });
    assert.equal(created.status, 201, created.text);
    key = created.body.key;
  });

  it('counts each member of a batch as a request: a batch past what is left this second is 429 with Retry-After and runs nothing; one larger than the limit is -32600', async () => {
    const before = stripe.seen.length;
    const tooMany = await post(refunds(20, 'many'));
    assert.equal(tooMany.status, 400);
    assert.deepEqual(await tooMany.json(), { jsonrpc: '2.0', id: null, error: { code: ErrorCode.InvalidRequest, message: `Invalid Request: a batch holds at most ${limit} messages, not 20 (RATE_LIMIT_PER_SECOND); send the rest in another POST` } });
    assert.equal(stripe.seen.length, before, 'nothing reached the provider');
    // Four batches of six at once: one fits in a second's ten requests, and each refused one's POST
    // leaves fewer for the next, so exactly one passes.
    const { seenBefore, answers } = await inOneSecond(async (attempt) => ({
      seenBefore: stripe.seen.length,
      answers: await Promise.all(['a', 'b', 'c', 'd'].map((b) => post(refunds(6, `${b}${attempt}`)))),
    }));
    assert.deepEqual(answers.map((r) => r.status).sort(), [200, 429, 429, 429]);
    for (const r of answers.filter((r) => r.status === 429)) {
      assert.match(r.headers.get('retry-after') ?? '', /^[1-9]\d*$/);
      const body = await r.json() as { data: { code: string } };
      assert.equal(body.data.code, 'rate_limited');
    }
    assert.equal(stripe.seen.length, seenBefore + 6, 'a refused batch called nothing');
  });

  it('counts a refused batch as its one POST', async () => {
    const pings = (n: number) => Array.from({ length: n }, (_, i) => ({ jsonrpc: '2.0', id: i, method: 'ping' }));
    const { seenBefore, statuses } = await inOneSecond(async (attempt) => {
      const seenBefore = stripe.seen.length;
      const first = await post(pings(6));
      const second = await post(refunds(6, `f${attempt}`));
      // Four left after the first; the refused second took one of them (its POST), so four no longer fit.
      const third = await post(refunds(4, `g${attempt}`));
      return { seenBefore, statuses: [first.status, second.status, third.status] };
    });
    assert.deepEqual(statuses, [200, 429, 429]);
    assert.equal(stripe.seen.length, seenBefore, 'a refused batch called nothing');
  });
});

// The JSON-RPC envelope of MCP requests, where the SDK's transport answers otherwise than JSON-RPC
// and MCP say (api/routes/mcp.ts asks these before and after the SDK): invalid messages and params,
// batches, and values refused before the SDK reads them. The tools themselves: mcp.ts.
import { Type, type Static } from '@sinclair/typebox';
import {
  CallToolRequestSchema, ErrorCode, InitializeRequestSchema, JSONRPCErrorResponseSchema, JSONRPCNotificationSchema, JSONRPCRequestSchema,
  JSONRPCResultResponseSchema, ListToolsRequestSchema, PingRequestSchema, SUPPORTED_PROTOCOL_VERSIONS, type JSONRPCErrorResponse,
} from '@modelcontextprotocol/sdk/types.js';
import { echoed, memberPath, type FieldError } from '../errors.ts';
import { normalOrigin } from '../origin.ts';
import { inexactId } from '../jsonrpc-id.ts';

// The requests the server answers, with the SDK's schemas for them.
const REQUESTS = { initialize: InitializeRequestSchema, ping: PingRequestSchema, 'tools/list': ListToolsRequestSchema, 'tools/call': CallToolRequestSchema } as const;

// The SDK answers params that do not fit with an internal error (-32603, zod's whole report) or a
// parse error (-32700, HTTP 400, when they are not an object). Given the request and the SDK's
// answer (its text), the answer to send instead: -32602 naming the field. Undefined: the SDK's
// stands (its other refusals, of headers, come before any params check).
// The SDK also answers -32603 to a tools/call sent as a task (MCP 2025-11-25 task augmentation)
// without running it: our tools run as plain calls only (no tasks capability; every tool's
// taskSupport is the default, forbidden), for which that revision says -32601.
export function paramsRefusal(body: unknown, sdkAnswer: string): JSONRPCErrorResponse | undefined {
  return mayBeParams(errorCodeOf(sdkAnswer)) ? refusalOf(body) : undefined;
}
// The codes the SDK answers params that do not fit with (and a tools/call sent as a task).
const mayBeParams = (sdkCode: unknown) => sdkCode === ErrorCode.InternalError || sdkCode === ErrorCode.ParseError;

// The shapes of the refusals answered with an HTTP error status, for their builders here and the
// route's OpenAPI responses (api/routes/mcp.ts).
// A message that is no JSON (-32700) or no valid JSON-RPC request (-32600): HTTP 400, its id echoed
// when it can be read (MCP: a string or an integer), else null.
export const EnvelopeRefusal = Type.Object({
  jsonrpc: Type.Literal('2.0'),
  id: Type.Union([Type.String(), Type.Integer(), Type.Null()]),
  error: Type.Object({ code: Type.Union([Type.Literal(-32700), Type.Literal(-32600)]), message: Type.String() }),
}, { $id: 'McpEnvelopeRefusal', description: 'the body is no JSON (-32700) or no valid JSON-RPC message (-32600), saying why; id echoed when it can be read' });
export type EnvelopeRefusal = Static<typeof EnvelopeRefusal>;
// A request refused for its headers, before any message is read, in the code and form the SDK's
// transport answers them in (id null, -32000): an Origin not allowed (403), an Accept that refuses
// JSON (406), and the SDK's own 400 for an MCP-Protocol-Version it does not speak.
export const HeaderRefusal = Type.Object({
  jsonrpc: Type.Literal('2.0'), id: Type.Null(), error: Type.Object({ code: Type.Literal(-32000), message: Type.String() }),
}, { $id: 'McpHeaderRefusal', description: 'a header refused (Origin, Accept, MCP-Protocol-Version): a JSON-RPC error without an id, saying which' });
export type HeaderRefusal = Static<typeof HeaderRefusal>;

// An id an answer can echo (MCP: a string or an integer), else null.
const readableId = (id: unknown): string | number | null => (typeof id === 'string' || Number.isSafeInteger(id) ? id as string | number : null);
// Why an id cannot be echoed. An integer past 2^53 is one, but JSON.parse has already rounded it.
const idProblem = (id: unknown) => (Number.isInteger(id)
  ? 'id is an integer past ±(2^53 - 1), which cannot be echoed exactly; send it as a string'
  : 'id must be a string or an integer');
// -32600 saying why, echoing `id` when it can be read.
const invalidRequest = (why: string, id?: unknown): EnvelopeRefusal => ({
  jsonrpc: '2.0', id: readableId(id), error: { code: -32600, message: `Invalid Request: ${why}` },
});
// -32700: the body is no JSON (or empty).
export const parseError = (why: string): EnvelopeRefusal => ({ jsonrpc: '2.0', id: null, error: { code: -32700, message: `Parse error: ${why}` } });

// A number id JSON.parse read as another number (1e-400 as 0), which the SDK would answer with that
// other number: told from the request's text.
export function inexactIdRefusal(body: unknown, text: string): EnvelopeRefusal | undefined {
  const inexact = inexactId(body, text);
  return inexact && invalidRequest(`${Array.isArray(body) ? `batch member ${inexact.index}: ` : ''}${inexact.problem}`);
}

// The answer to an Accept that refuses JSON, in the SDK's code for it (the transport's own errors are -32000).
export const NOT_ACCEPTABLE: HeaderRefusal = {
  jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Not Acceptable: this server answers in application/json, which the Accept header does not allow' },
};

// MCP's Streamable HTTP transport: the server MUST validate the Origin header of every request, and
// answer one that is present and invalid with 403, whose body may be a JSON-RPC error without an id:
// else a page of another site whose name was made to resolve to this server's address (DNS
// rebinding) could call it from inside the network, a browser sending that site's Origin. Given the
// origins allowed (config.ts mcpAllowedOrigins) and the request's Origin, that refusal (the code the
// SDK's own Origin check answers), or undefined. A request without Origin, from a client that is no
// browser page (the SDK's Node client, curl), passes; so does any with 'any' (MCP_ALLOWED_ORIGINS=*).
// An Origin no origin at all (`null`, unparsable, two of them) is refused as a foreign one is.
export function originRefusal(allowed: ReadonlySet<string> | 'any', origin: string | undefined): HeaderRefusal | undefined {
  if (origin === undefined || allowed === 'any') return undefined;
  const normal = normalOrigin(origin);
  if (normal !== undefined && allowed.has(normal)) return undefined;
  // A header may hold some 16 KiB: echoed says a long one by its start.
  const named = origin ? `Origin ${echoed(origin)}` : 'An empty Origin';
  return { jsonrpc: '2.0', id: null, error: { code: -32000, message: `Forbidden: ${named} is not allowed` } };
}

// The SDK answers JSON that is not a JSON-RPC message with a parse error (-32700), and an empty
// batch with 202 as if it were notifications. JSON-RPC says both are invalid requests (-32600), and
// MCP that an id is a string or an integer, never null. Given the body (read as JSON) and the SDK's
// answer, the refusal to send instead (HTTP 400, as the SDK's), saying what is wrong.
export function envelopeRefusal(body: unknown, sdkStatus: number, sdkAnswer: string): EnvelopeRefusal | undefined {
  if (sdkStatus !== 202 && errorCodeOf(sdkAnswer) !== ErrorCode.ParseError) return undefined;
  const members = Array.isArray(body) ? body : [body];
  if (!members.length) return invalidRequest('the batch is empty');
  for (const [i, m] of members.entries()) {
    const at = Array.isArray(body) ? `batch member ${i}: ` : '';
    if (typeof m !== 'object' || m === null || Array.isArray(m)) return invalidRequest(`${at}a message must be a JSON object`);
    const { jsonrpc, id, method } = m as Record<string, unknown>;
    if (jsonrpc !== '2.0') return invalidRequest(`${at}jsonrpc must be "2.0"`, id);
    if ('id' in m && readableId(id) === null) return invalidRequest(`${at}${idProblem(id)}`);
    if ('method' in m && typeof method !== 'string') return invalidRequest(`${at}method must be a string`, id);
    if (!('method' in m) && !('result' in m) && !('error' in m)) return invalidRequest(`${at}a message needs a method (a request or notification), or a result or an error (a response)`, id);
    // The rest of what the SDK calls a parse error (a stray member, a result or error of the wrong
    // shape, params that are no object): the first thing its schema for this kind of message finds.
    const schema = 'method' in m ? ('id' in m ? JSONRPCRequestSchema : JSONRPCNotificationSchema) : 'result' in m ? JSONRPCResultResponseSchema : JSONRPCErrorResponseSchema;
    const parsed = schema.safeParse(m);
    if (parsed.success) continue;
    const issue = parsed.error.issues[0];
    // A request to a method this server serves, with params of the wrong shape: paramsRefusal's -32602.
    if (!Array.isArray(body) && issue.path[0] === 'params' && refusalOf(body)) return undefined;
    return invalidRequest(`${at}${issueText(issue, m, 'the message')}`, id);
  }
  return undefined;
}

// MCP 2025-06-18 removed JSON-RPC batching; the SDK still runs a batch whatever version the client
// says it speaks (MCP-Protocol-Version). A batch from a client on a revision without batches is
// refused before any member runs. Without the header the client is taken to speak 2025-03-26, which
// has them; a version the SDK does not support is left to its own 400.
// MCP 2025-03-26 says initialize MUST NOT be in a batch; the SDK answered one alone in a batch, and
// one beside others with 'Only one initialization request is allowed'.
// Two requests with one id would both run and only one be answered (the SDK keys answers by id).
// A batch holds at most BATCH_MAX messages: the SDK holds every answer until the last and answers them
// as one text, so 20,000 tools/list in one 1 MiB body were gigabytes of heap in one request.
// Each member counts as a request against RATE_LIMIT_PER_SECOND (`perSecond`, 0: none): a batch larger
// than it could never pass, and is refused as one larger than BATCH_MAX is, not 429 for ever.
export const BATCH_MAX = 20;
export function batchRefusal(body: unknown, protocolVersion: string | undefined, perSecond: number): EnvelopeRefusal | undefined {
  if (!Array.isArray(body)) return undefined;
  if (protocolVersion && SUPPORTED_PROTOCOL_VERSIONS.includes(protocolVersion) && protocolVersion >= '2025-06-18') {
    return invalidRequest(`MCP ${protocolVersion} has no JSON-RPC batches; send one message per POST`);
  }
  if (body.length > BATCH_MAX) return invalidRequest(`a batch holds at most ${BATCH_MAX} messages, not ${body.length}; send the rest in another POST`);
  if (perSecond && body.length > perSecond) return invalidRequest(`a batch holds at most ${perSecond} messages, not ${body.length} (RATE_LIMIT_PER_SECOND); send the rest in another POST`);
  const requests = new Map<string, number>();
  for (const [i, m] of body.entries()) {
    const { id, method } = (typeof m === 'object' && m !== null ? m : {}) as { id?: unknown; method?: unknown };
    if (method === 'initialize') return invalidRequest(`batch member ${i}: initialize is sent alone, never in a batch`);
    if (typeof method !== 'string' || (typeof id !== 'string' && typeof id !== 'number')) continue;
    const key = `${typeof id}:${id}`;
    const first = requests.get(key);
    if (first !== undefined) return invalidRequest(`batch members ${first} and ${i} are requests with the same id ${JSON.stringify(id)}`);
    requests.set(key, i);
  }
  return undefined;
}

// The request body as the OpenAPI document describes it (api/routes/mcp.ts): a request to a method
// this server answers, a notification, or a batch of them (see batchRefusal). Each method's params
// are MCP's; the route reads the body itself and answers what does not fit with JSON-RPC errors.
const McpMessage = Type.Union([
  Type.Object({
    jsonrpc: Type.Literal('2.0'),
    id: Type.Union([Type.String(), Type.Integer({ minimum: -Number.MAX_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER })]),
    method: Type.Union(Object.keys(REQUESTS).map((name) => Type.Literal(name))),
    params: Type.Optional(Type.Record(Type.String(), Type.Unknown(), { description: "the method's params, as MCP defines them" })),
  }, { description: 'a request' }),
  Type.Object({
    jsonrpc: Type.Literal('2.0'),
    method: Type.String({ pattern: '^notifications/', description: 'e.g. notifications/initialized' }),
    params: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  }, { description: 'a notification (no id; answered 202 with no body)' }),
]);
export const McpRequest = Type.Union([McpMessage, Type.Array(McpMessage, { minItems: 1, maxItems: BATCH_MAX, description: 'a batch, with distinct request ids and no initialize, from a client on MCP 2025-03-26 (or sending no MCP-Protocol-Version)' })], { $id: 'McpRequest' });

// The SDK answers a batch of one request with that answer alone, not an array of one as JSON-RPC
// says, and a member's params that do not fit with -32603 (see paramsRefusal). Given the batch and
// the SDK's answer (its text), the array to send.
export function batchAnswer(body: unknown[], sdkAnswer: string): unknown[] {
  const parsed = JSON.parse(sdkAnswer) as unknown;
  const answers = (Array.isArray(parsed) ? parsed : [parsed]) as { id?: unknown; error?: { code?: unknown } }[];
  return answers.map((a) => {
    if (!mayBeParams(a.error?.code)) return a;
    const request = body.find((m) => typeof m === 'object' && m !== null && 'method' in m && (m as { id?: unknown }).id === a.id);
    return (request && refusalOf(request)) ?? a;
  });
}

// Valid JSON that is refused before the SDK reads it (a NUL or lone surrogate, nesting past 64
// levels, a number past the double range: domain/storable-json.ts) is no parse error: inside a
// request's params it is -32602 with the id echoed (HTTP 200, as the SDK answers bad params),
// elsewhere -32600 (HTTP 400, as envelopeRefusal).
export function unstorableRefusal(body: unknown, problem: FieldError): { status: 200; answer: JSONRPCErrorResponse } | { status: 400; answer: EnvelopeRefusal } {
  const single = typeof body === 'object' && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : undefined;
  const id = readableId(single?.id);
  const where = problem.path.replace(/^body\.?/, '') || 'the message';
  if (id !== null && problem.path.startsWith('body.params')) {
    return { status: 200, answer: { jsonrpc: '2.0', id, error: { code: ErrorCode.InvalidParams, message: `Invalid params: ${where}: ${problem.message}` } } };
  }
  return { status: 400, answer: invalidRequest(`${where}: ${problem.message}`, id) };
}

// The arguments of tools/call request `id` as the body (one message or a batch) holds them. The SDK
// rebuilds them as it checks the request, and a member named "__proto__" does not survive that: it
// was dropped, so a call the function's schema refuses (as REST's invoke does) ran without it.
export function sentArguments(body: unknown, id: string | number): unknown {
  const sent = (Array.isArray(body) ? body : [body]).find((m) => typeof m === 'object' && m !== null
    && (m as { method?: unknown }).method === 'tools/call' && (m as { id?: unknown }).id === id) as { params?: { arguments?: unknown } } | undefined;
  return sent?.params?.arguments;
}

// The first thing the SDK's schema found wrong with `message` (a JSON-RPC message), worded as the rest
// of the API words it ("params.name is required", "params.cursor must be a string"), not in zod's
// words ("Invalid input: expected string, received undefined"); what else zod finds, in its words
// after the member's path. `root`: what an empty path names.
type Issue = { code: string; path: PropertyKey[]; message: string; expected?: string; keys?: string[] };
const TYPE_WORDS: Record<string, string> = {
  string: 'a string', number: 'a number', int: 'an integer', boolean: 'a boolean', object: 'an object', record: 'an object', array: 'an array',
};
const pathOf = (names: PropertyKey[]) => names.reduce<string>((p, k) => (typeof k === 'number' ? `${p}[${k}]` : memberPath(p, String(k))), '').replace(/^\./, '');
function issueText(issue: Issue, message: unknown, root: string): string {
  const path = pathOf(issue.path) || root;
  if (issue.code === 'unrecognized_keys' && issue.keys?.length) return `${echoed(pathOf([...issue.path, issue.keys[0]]))} is not an allowed member`;
  if (issue.code !== 'invalid_type' || !issue.expected) return `${path}: ${issue.message}`;
  const value = issue.path.reduce<unknown>((v, k) => (typeof v === 'object' && v !== null ? (v as Record<PropertyKey, unknown>)[k] : undefined), message);
  return value === undefined ? `${path} is required` : `${path} must be ${TYPE_WORDS[issue.expected] ?? issue.expected}`;
}

function errorCodeOf(text: string): number {
  try {
    return Number((JSON.parse(text) as { error?: { code?: unknown } }).error?.code);
  } catch {
    return NaN;
  }
}

function refusalOf(body: unknown): JSONRPCErrorResponse | undefined {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return undefined;
  const { id, method } = body as { id?: unknown; method?: unknown };
  if (typeof method !== 'string' || !Object.hasOwn(REQUESTS, method) || (typeof id !== 'string' && typeof id !== 'number')) return undefined;
  const parsed = REQUESTS[method as keyof typeof REQUESTS].safeParse(body);
  if (parsed.success) {
    if (method !== 'tools/call' || (body as { params?: { task?: unknown } }).params?.task === undefined) return undefined;
    return { jsonrpc: '2.0', id, error: { code: ErrorCode.MethodNotFound, message: 'Method not found: tools/call as a task; this server runs tools as plain calls only (it declares no tasks capability)' } };
  }
  const issue = parsed.error.issues[0];
  return { jsonrpc: '2.0', id, error: { code: ErrorCode.InvalidParams, message: `Invalid params: ${issueText(issue, body, 'params')}` } };
}

// The bridge as a Model Context Protocol server: every enabled function instance is a tool named
// `<provider_controller_type_id>__<function_controller_type_id>__<provider_instance_id>` (see
// toolName), with the function's parameter schema as its input schema; calling it invokes the function.
// One server per HTTP request (stateless Streamable HTTP): tools are read from Postgres each time,
// so every API process sees the same list.
import { createHash } from 'node:crypto';
import { Type } from '@sinclair/typebox';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema, CancelledNotificationSchema, ErrorCode, InitializeRequestSchema, JSONRPCErrorResponseSchema, JSONRPCNotificationSchema, JSONRPCRequestSchema,
  JSONRPCResultResponseSchema, ListToolsRequestSchema, PingRequestSchema, SUPPORTED_PROTOCOL_VERSIONS,
  type CallToolResult, type JSONRPCErrorResponse, type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import type { Services } from '../services.ts';
import { AppError, InvalidRequest, logFailure, NotFound, unavailability, type FieldError } from '../errors.ts';
import { functionInstancesByIdPrefix, getFunctionInstance, getProviderInstance, listFunctionInstances, type FunctionInstanceRow } from '../../db/bridge.ts';
import { describedPage, PROVIDERS } from './catalog.ts';
import { invokeFunction } from './functions.ts';
import { SERVICE_VERSION } from '../version.ts';
import type { Logger } from '../logger.ts';

// A protocol error as the client should read it. The SDK sends an error's message as it is, and its
// own McpError's message starts "MCP error <code>: ", which SDK clients then prefix again.
export class McpRefusal extends Error {
  constructor(readonly code: number, message: string) {
    super(message);
  }
}

type ToolIdentity = Pick<FunctionInstanceRow, 'provider_controller_type_id' | 'function_controller_type_id' | 'provider_instance_id'>;

// The Anthropic and OpenAI APIs take a tool only if its name matches this (no dots, at most 64),
// failing a host's whole request otherwise; MCP (SEP-986) allows it too.
const NAME_MAX = 64;
const HASH_CHARS = 16;
const TOOL_NAME = new RegExp(`^[A-Za-z0-9_-]{1,${NAME_MAX}}$`);
// The name before 2025-11 (instance ids have no dots), still taken by tools/call for clients that stored it.
const DOTTED_NAME = /^([a-z0-9_]{1,64})\.([a-z0-9_]{1,64})\.([A-Za-z0-9_-]{1,64})$/;

// `<provider>__<function>__<instance>` when that is under 64 characters; else its first 47, `_` and
// 16 hex of SHA-256 of the identity: exactly 64, so a full name never equals a shortened one, and
// instances that share the first 47 characters differ by hash. Controller type ids have no `__` and
// do not end in `_`, so the full form reads back one way; resolveTool looks names up, not splits them.
export function toolName(r: ToolIdentity): string {
  const full = `${r.provider_controller_type_id}__${r.function_controller_type_id}__${r.provider_instance_id}`;
  if (full.length < NAME_MAX) return full;
  const hash = createHash('sha256').update(`${r.provider_controller_type_id}\n${r.function_controller_type_id}\n${r.provider_instance_id}`).digest('hex');
  return `${full.slice(0, NAME_MAX - HASH_CHARS - 1)}_${hash.slice(0, HASH_CHARS)}`;
}

// The function instance a tool name (listed or dotted) stands for, whatever its state; undefined if none.
async function resolveTool(db: Services['db'], name: string): Promise<ToolIdentity | undefined> {
  const dotted = DOTTED_NAME.exec(name);
  if (dotted) return { provider_controller_type_id: dotted[1], function_controller_type_id: dotted[2], provider_instance_id: dotted[3] };
  if (!TOOL_NAME.test(name)) return undefined;
  const shortened = name.length === NAME_MAX;
  const head = shortened ? name.slice(0, NAME_MAX - HASH_CHARS - 1) : name;
  for (const p of PROVIDERS) {
    for (const f of p.functions) {
      const prefix = `${p.type_id}__${f.type_id}__`;
      if (!shortened) {
        if (name.startsWith(prefix) && name.length > prefix.length) {
          return { provider_controller_type_id: p.type_id, function_controller_type_id: f.type_id, provider_instance_id: name.slice(prefix.length) };
        }
      } else if (head.startsWith(prefix) || prefix.startsWith(head)) {
        const rows = await functionInstancesByIdPrefix(db, p.type_id, f.type_id, head.slice(prefix.length));
        const row = rows.find((r) => toolName(r) === name);
        if (row) return row;
      }
    }
  }
  return undefined;
}

// What an unknown tool's error quotes: the name, unless it is far longer than any tool's.
const quoted = (name: string) => (name.length <= 200 ? name : `a name of ${name.length} characters (tool names have at most ${NAME_MAX})`);

// Tools come in pages (MCP's cursor pagination): each carries its parameter schema, and thousands
// of function instances would otherwise make one answer of tens of megabytes.
export const TOOLS_PAGE = 500;

// The Anthropic API (and Bedrock, Vertex, OpenAI) refuse a tool whose input schema has oneOf, anyOf
// or allOf at its top level, failing the host's whole request, not just that tool. They are left out
// of what is advertised; the function's schema says the rule in its description, and tools/call
// checks the arguments against the whole schema.
function advertisedInputSchema(parameters: Record<string, unknown>): Tool['inputSchema'] {
  const { oneOf: _oneOf, anyOf: _anyOf, allOf: _allOf, ...rest } = parameters;
  return rest as Tool['inputSchema'];
}

// A function the catalog no longer has is no tool (logged); the cursor is that of the rows read, so a
// page may hold fewer tools than TOOLS_PAGE, even none, and its cursor still leads to the rest.
export async function listTools(db: Services['db'], log: Logger, cursor?: string): Promise<{ tools: Tool[]; nextCursor?: string }> {
  let page;
  try {
    page = await listFunctionInstances(db, {}, TOOLS_PAGE, cursor);
  } catch (err) {
    if (err instanceof InvalidRequest) throw new McpRefusal(ErrorCode.InvalidParams, 'Invalid params: params.cursor: is not a cursor this server gave');
    throw err;
  }
  const tools = describedPage(page.items, log, 'MCP tools/list').map(({ row, f }) => (
    { name: toolName(row), title: f.name, description: f.documentation, inputSchema: advertisedInputSchema(f.parameters) }));
  return { tools, ...(page.next_page_token ? { nextCursor: page.next_page_token } : {}) };
}

const failure = (text: string): CallToolResult => ({ isError: true, content: [{ type: 'text', text }] });

// Every member the arguments got wrong, a line each, so that the model can mend them in one go.
function refusalText(err: AppError): string {
  const errors = err instanceof InvalidRequest ? (err.data.errors as FieldError[] | undefined) : undefined;
  if (!errors || errors.length < 2) return err.message;
  return [`Invalid arguments (${errors.length}):`, ...errors.map((e) => `${e.path} ${e.message}`)].join('\n');
}

// A tool that does not exist is a protocol error (-32602); what the model can act on in calling one
// that does (bad arguments, instance not active, provider refusal, or unreachable: 502/503) is a tool
// error. A fault of ours (a credential that does not decrypt, say) is neither: guarded logs it and
// answers -32603, as REST answers 500, rather than show the model its internals.
export async function callTool(services: Services, name: string, args: Record<string, unknown>, { signal, log = services.log }: { signal?: AbortSignal; log?: Logger } = {}): Promise<CallToolResult> {
  const unknown = () => new McpRefusal(ErrorCode.InvalidParams, `Unknown tool: ${quoted(name)}`);
  // Checked before the arguments: an unknown tool is that, whatever it was sent.
  const tool = await resolveTool(services.db, name);
  if (!tool) throw unknown();
  const { provider_controller_type_id: providerType, function_controller_type_id: functionType, provider_instance_id: instanceId } = tool;
  const instance = await getProviderInstance(services.db, instanceId);
  if (instance?.provider_controller_type_id !== providerType || !(await getFunctionInstance(services.db, instanceId, functionType))) throw unknown();
  try {
    const result = await invokeFunction(services, instanceId, functionType, args, { paramsPath: 'arguments', signal, log });
    if (result.type === 'error') return failure(String(result.message));
    const { type: _type, ...output } = result as Record<string, unknown>;
    return { structuredContent: output, content: [{ type: 'text', text: JSON.stringify(output) }] };
  } catch (err) {
    // Not enabled (or deleted meanwhile): no such tool. A credential controller the catalog no longer
    // has is this listed tool's failure, not its absence.
    if (err instanceof NotFound && err.data.resource !== 'credential_controller') throw unknown();
    if (!(err instanceof AppError) || (err.status >= 500 && err.status !== 502 && err.status !== 503)) throw err;
    logFailure(log, err, err, 'mcp tool call failed', { tool: name });
    return failure(refusalText(err));
  }
}

// What went wrong inside (a database error, say) is logged as REST logs it, not sent: the client gets -32603.
async function guarded<T>(log: Logger, what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof McpRefusal) throw err;
    const e = err instanceof AppError ? err : unavailability(err) ?? { status: 500, code: 'internal' };
    logFailure(log, err, e, 'mcp request failed', { what });
    // Only an outage passes: a fault of ours (a credential that does not decrypt) stays until mended.
    throw new McpRefusal(ErrorCode.InternalError, e.status === 503 ? 'The service could not complete the request; retry shortly' : 'The service failed to complete the request; its operator can find why in its log');
  }
}

// `signal`: the HTTP client is gone (a tool call in flight abandons its provider call); `log`: the request's.
export function createMcpServer(services: Services, signal?: AbortSignal, log = services.log): Server {
  const server = new Server({ name: 'taskbridge-bridge', version: SERVICE_VERSION }, { capabilities: { tools: {} } });
  // notifications/cancelled stops nothing (README): the SDK's own handler would abort a request of the
  // same batch and then drop its answer, leaving the batch unanswered though the call ran.
  server.setNotificationHandler(CancelledNotificationSchema, () => {});
  server.setRequestHandler(ListToolsRequestSchema, async ({ params }) => guarded(log, 'tools/list', () => listTools(services.db, log, params?.cursor)));
  server.setRequestHandler(CallToolRequestSchema, async ({ params }) =>
    guarded(log, 'tools/call', () => callTool(services, params.name, params.arguments ?? {}, { signal, log })));
  return server;
}

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

// JSON-RPC's answer to a message whose id cannot be read: id null.
type EnvelopeRefusal = Omit<JSONRPCErrorResponse, 'id'> & { id: string | number | null };
// An id an answer can echo (MCP: a string or an integer), else null.
const readableId = (id: unknown): string | number | null => (typeof id === 'string' || Number.isSafeInteger(id) ? id as string | number : null);
// -32600 saying why, echoing `id` when it can be read.
const invalidRequest = (why: string, id?: unknown): EnvelopeRefusal => ({
  jsonrpc: '2.0', id: readableId(id), error: { code: ErrorCode.InvalidRequest, message: `Invalid Request: ${why}` },
});

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
    if ('id' in m && readableId(id) === null) return invalidRequest(`${at}id must be a string or an integer`);
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
    return invalidRequest(`${at}${issue.path.join('.') || 'the message'}: ${issue.message}`, id);
  }
  return undefined;
}

// MCP 2025-06-18 removed JSON-RPC batching; the SDK still runs a batch whatever version the client
// says it speaks (MCP-Protocol-Version). A batch from a client on a revision without batches is
// refused before any member runs. Without the header the client is taken to speak 2025-03-26, which
// has them; a version the SDK does not support is left to its own 400.
// Two requests with one id would both run and only one be answered (the SDK keys answers by id).
// A batch holds at most BATCH_MAX messages: the SDK holds every answer until the last and answers them
// as one text, so 20,000 tools/list in one 1 MiB body were gigabytes of heap in one request.
export const BATCH_MAX = 20;
export function batchRefusal(body: unknown, protocolVersion: string | undefined): EnvelopeRefusal | undefined {
  if (!Array.isArray(body)) return undefined;
  if (protocolVersion && SUPPORTED_PROTOCOL_VERSIONS.includes(protocolVersion) && protocolVersion >= '2025-06-18') {
    return invalidRequest(`MCP ${protocolVersion} has no JSON-RPC batches; send one message per POST`);
  }
  if (body.length > BATCH_MAX) return invalidRequest(`a batch holds at most ${BATCH_MAX} messages, not ${body.length}; send the rest in another POST`);
  const requests = new Map<string, number>();
  for (const [i, m] of body.entries()) {
    const { id, method } = (typeof m === 'object' && m !== null ? m : {}) as { id?: unknown; method?: unknown };
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
export const McpRequest = Type.Union([McpMessage, Type.Array(McpMessage, { minItems: 1, maxItems: BATCH_MAX, description: 'a batch, with distinct request ids, from a client on MCP 2025-03-26 (or sending no MCP-Protocol-Version)' })], { $id: 'McpRequest' });

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
export function unstorableRefusal(body: unknown, problem: FieldError): { status: number; answer: EnvelopeRefusal } {
  const single = typeof body === 'object' && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : undefined;
  const id = readableId(single?.id);
  const where = problem.path.replace(/^body\.?/, '') || 'the message';
  if (id !== null && problem.path.startsWith('body.params')) {
    return { status: 200, answer: { jsonrpc: '2.0', id, error: { code: ErrorCode.InvalidParams, message: `Invalid params: ${where}: ${problem.message}` } } };
  }
  return { status: 400, answer: invalidRequest(`${where}: ${problem.message}`, id) };
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
  return { jsonrpc: '2.0', id, error: { code: ErrorCode.InvalidParams, message: `Invalid params: ${issue.path.join('.') || 'params'}: ${issue.message}` } };
}

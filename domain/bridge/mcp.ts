// The bridge as a Model Context Protocol server: every enabled function instance a call can run is a tool named
// `<provider_controller_type_id>__<function_controller_type_id>__<provider_instance_id>` (see
// toolName), with the function's parameter schema as its input schema; calling it invokes the function.
// One server per HTTP request (stateless Streamable HTTP): tools are read from Postgres each time,
// so every API process sees the same list.
import { createHash } from 'node:crypto';
import { Type } from '@sinclair/typebox';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema, CancelledNotificationSchema, ErrorCode, ListToolsRequestSchema, type CallToolResult, type Tool,
} from '@modelcontextprotocol/sdk/types.js';
import type { Services } from '../services.ts';
import { AppError, echoed, InvalidRequest, logFailure, NotFound, unavailability, type FieldError } from '../errors.ts';
import { functionInstancesByIdPrefix, getFunctionInstance, getProviderInstance, listRunnableFunctionInstances, type FunctionInstanceRow } from '../../db/bridge.ts';
import { CATALOG_PAIRS, checkAgainst, describedPage, PROVIDERS } from './catalog.ts';
import { invokeFunction } from './functions.ts';
import { sentArguments } from './mcp-envelope.ts';
import { SERVICE_VERSION } from '../version.ts';
import { IDEMPOTENCY_KEY_RULES, IdempotencyKey } from '../shapes/common.ts';
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

// A client lists tools to call them: only the instances a call would not refuse for what is known now
// (callTool, invokeFunction): not those of a provider instance that is not active (disabled, its user
// credential awaiting brokering or its refresh failed), nor those whose function or credential
// controller this release's catalog no longer has.
export async function listTools(db: Services['db'], log: Logger, cursor?: string): Promise<{ tools: Tool[]; nextCursor?: string }> {
  let page;
  try {
    page = await listRunnableFunctionInstances(db, CATALOG_PAIRS, TOOLS_PAGE, cursor);
  } catch (err) {
    if (err instanceof InvalidRequest) throw new McpRefusal(ErrorCode.InvalidParams, 'Invalid params: params.cursor: is not a cursor this server gave');
    throw err;
  }
  const tools = describedPage(page.items, log, 'MCP tools/list').map(({ row, f }) => (
    { name: toolName(row), title: f.name, description: f.documentation, inputSchema: advertisedInputSchema(f.parameters) }));
  return { tools, ...(page.next_page_token ? { nextCursor: page.next_page_token } : {}) };
}

// MCP leaves a request's params._meta to extensions, each key under its owner's reverse-DNS prefix.
// A host that retries a tools/call (after a timeout or a dropped connection) sends the same key, as a
// REST caller sends the invoke's idempotency_key, so that Stripe refunds once.
export const IDEMPOTENCY_META = 'io.taskbridge/idempotency-key';
// Other members (the SDK's progressToken, other extensions') are not ours to refuse.
const CallMeta = Type.Object({ [IDEMPOTENCY_META]: Type.Optional(IdempotencyKey) });

// The key a tools/call's _meta carries, checked as the REST invoke's; a bad one is the host's fault,
// not the model's: -32602, not a tool error.
function idempotencyKeyOf(meta: Record<string, unknown> | undefined): string | undefined {
  try {
    checkAgainst(CallMeta, meta ?? {}, 'params._meta');
  } catch (err) {
    if (!(err instanceof InvalidRequest)) throw err;
    const [first] = err.data.errors as FieldError[];
    throw new McpRefusal(ErrorCode.InvalidParams, `Invalid params: ${first.path} ${first.message}`);
  }
  return meta?.[IDEMPOTENCY_META] as string | undefined;
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
// `meta`: the request's params._meta (IDEMPOTENCY_META).
export async function callTool(
  services: Services, name: string, args: Record<string, unknown>,
  { signal, log = services.log, meta }: { signal?: AbortSignal; log?: Logger; meta?: Record<string, unknown> } = {},
): Promise<CallToolResult> {
  const unknown = () => new McpRefusal(ErrorCode.InvalidParams, `Unknown tool: ${echoed(name)}${name.length > NAME_MAX ? `; tool names have at most ${NAME_MAX} characters` : ''}`);
  // Checked before the arguments: an unknown tool is that, whatever it was sent.
  const tool = await resolveTool(services.db, name);
  if (!tool) throw unknown();
  const { provider_controller_type_id: providerType, function_controller_type_id: functionType, provider_instance_id: instanceId } = tool;
  const instance = await getProviderInstance(services.db, instanceId);
  if (instance?.provider_controller_type_id !== providerType || !(await getFunctionInstance(services.db, instanceId, functionType))) throw unknown();
  const idempotencyKey = idempotencyKeyOf(meta);
  try {
    const result = await invokeFunction(services, instanceId, functionType, args, { paramsPath: 'arguments', signal, log, idempotencyKey });
    if (result.type === 'error') return failure(String(result.message));
    const { type: _type, ...output } = result as Record<string, unknown>;
    return { structuredContent: output, content: [{ type: 'text', text: JSON.stringify(output) }] };
  } catch (err) {
    // Not enabled (or deleted meanwhile): no such tool. A credential controller the catalog no longer
    // has (a tool no longer listed, called by a name kept from before) is this tool's failure, not its absence.
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

// `signal`: the HTTP client is gone (a tool call in flight abandons its provider call); `log`: the
// request's; `body`: the request as sent, whose tool arguments are the ones checked (sentArguments).
export function createMcpServer(services: Services, signal?: AbortSignal, log = services.log, body?: unknown): Server {
  const server = new Server({ name: 'taskbridge-bridge', version: SERVICE_VERSION }, {
    capabilities: { tools: {} },
    instructions: `A tools/call that may act twice if retried (a Stripe refund) takes an idempotency key in params._meta["${IDEMPOTENCY_META}"] (${IDEMPOTENCY_KEY_RULES}): send the same key when retrying it, and the provider answers the repeat with the first call's answer instead of acting again.`,
  });
  // notifications/cancelled stops nothing (README): the SDK's own handler would abort a request of the
  // same batch and then drop its answer, leaving the batch unanswered though the call ran.
  server.setNotificationHandler(CancelledNotificationSchema, () => {});
  // The SDK's own answer to a method it has no handler for says only "Method not found", not which.
  server.fallbackRequestHandler = async ({ method }) => {
    throw new McpRefusal(ErrorCode.MethodNotFound, `Method not found: ${echoed(method)}`);
  };
  server.setRequestHandler(ListToolsRequestSchema, async ({ params }) => guarded(log, 'tools/list', () => listTools(services.db, log, params?.cursor)));
  server.setRequestHandler(CallToolRequestSchema, async ({ params }, { requestId }) => {
    const args = (sentArguments(body, requestId) ?? params.arguments ?? {}) as Record<string, unknown>;
    return guarded(log, 'tools/call', () => callTool(services, params.name, args, { signal, log, meta: params._meta }));
  });
  return server;
}

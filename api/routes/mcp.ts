// POST /api/bridge/v1/mcp: the bridge's MCP server over Streamable HTTP, stateless (no session
// id; GET and DELETE answer 405). The SDK's web-standard transport speaks the protocol; this
// handler hands it the request and copies its answer into Koa, or answers itself where the SDK would
// answer otherwise than JSON-RPC and MCP say (domain/bridge/mcp-envelope.ts). Tools: domain/bridge/mcp.ts.
// A request whose Origin is not allowed is refused before anything else (guard).
import { Type } from '@sinclair/typebox';
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js';
import { defineRoute } from '../route.ts';
import { clientGone } from '../client-gone.ts';
import { AnyQuery, ErrorBody } from '../../domain/shapes/common.ts';
import { JsonRpcResponse } from '../../domain/shapes/jsonrpc.ts';
import { readJsonRpcBody } from '../middleware/body.ts';
import { takeBatchRest } from '../middleware/rate-limit.ts';
import type { Context } from 'koa';
import { createMcpServer } from '../../domain/bridge/mcp.ts';
import {
  batchAnswer, batchRefusal, EnvelopeRefusal, envelopeRefusal, HeaderRefusal, inexactIdRefusal, McpRequest, NOT_ACCEPTABLE, originRefusal, paramsRefusal, parseError, unstorableRefusal,
} from '../../domain/bridge/mcp-envelope.ts';
import { mcpAllowedOrigins } from '../../domain/config.ts';
import { findUnstorable } from '../../domain/storable-json.ts';

export const MCP_PATH = '/api/bridge/v1/mcp';

// A JSON-RPC answer of ours in place of the SDK's: 400 for a message that is no valid request, 403
// for an Origin not allowed, 406 for an Accept that refuses JSON, 200 otherwise.
function answer(ctx: Context, status: 200 | 400 | 403 | 406, body: unknown): void {
  ctx.status = status;
  ctx.body = body;
}

export const mcpRoutes = [
  defineRoute({
    method: 'post', path: MCP_PATH, operationId: 'bridge-mcp', tag: 'bridge', scope: 'bridge:invoke', ownBody: McpRequest,
    summary: 'Model Context Protocol (Streamable HTTP, stateless): tools/list and tools/call over the enabled function instances',
    // Ignored, not refused: an MCP client reads only JSON-RPC answers, and a host may add a tracing or
    // cache-busting parameter to the URL it was given.
    query: AnyQuery,
    // The seed describes this 200 so.
    responseDescriptions: {
      200: 'MCP server running',
      400: 'The body is no JSON (-32700) or no valid JSON-RPC message (-32600), or MCP-Protocol-Version names a revision the server does not speak (-32000)',
      403: "The request's Origin is not allowed (a JSON-RPC error, answered before the API key is read), or the API key lacks the scope (Error)",
      406: 'The Accept header refuses application/json, the one type the server answers in',
    },
    responses: {
      200: Type.Union([JsonRpcResponse, Type.Array(JsonRpcResponse, { description: 'the answers to a batch' })]), 202: null,
      400: Type.Union([EnvelopeRefusal, HeaderRefusal]), 401: ErrorBody, 403: Type.Union([HeaderRefusal, ErrorBody]), 406: HeaderRefusal, 413: ErrorBody, 415: ErrorBody,
    },
    // The Origin is checked before the API key: a page of a foreign origin (a DNS rebinding) gets 403
    // whatever key it sends, learning nothing of it (401 or 403 for its scope), and costs no key
    // lookup, AUTH_FAILURES_PER_MINUTE or RATE_LIMIT_PER_SECOND.
    guard: (services) => {
      const allowed = mcpAllowedOrigins(services.cfg);
      return async (ctx, next) => {
        const refused = originRefusal(allowed, ctx.req.headers.origin);
        if (!refused) return next();
        (ctx.state.log ?? services.log).info({ origin: ctx.req.headers.origin?.slice(0, 200) }, 'mcp request refused: Origin not allowed');
        answer(ctx, 403, refused);
      };
    },
  }, async ({ ctx, services, log }) => {
    // The server answers in application/json only (the transport's JSON mode: no SSE stream). The SDK
    // wants Accept to name both that and text/event-stream, in lower case, so it refused
    // 'application/json' alone (modelcontextprotocol/typescript-sdk#1944), '*/*' (fetch's and curl's
    // default) and capitals. Koa's negotiation (RFC 9110) decides instead.
    if (!ctx.accepts('application/json')) return answer(ctx, 406, NOT_ACCEPTABLE);
    const read = await readJsonRpcBody(ctx, services.cfg.BODY_LIMIT_BYTES);
    // An empty body is no JSON either, not a message that is no object.
    if (!('body' in read)) {
      return answer(ctx, 400, parseError('parseError' in read ? read.parseError : 'Request body is empty'));
    }
    const { body } = read;
    // First: the refusals below echo the id, which for this one would be another number.
    const inexact = inexactIdRefusal(body, read.text);
    if (inexact) return answer(ctx, 400, inexact);
    const problem = findUnstorable(body);
    if (problem) {
      const refused = unstorableRefusal(body, problem);
      return answer(ctx, refused.status, refused.answer);
    }
    const batchRefused = batchRefusal(body, ctx.get('mcp-protocol-version') || undefined, services.cfg.RATE_LIMIT_PER_SECOND);
    if (batchRefused) return answer(ctx, 400, batchRefused);
    // Each member of a batch is a request (twenty tools/call are twenty provider calls); the rate
    // limit took the first. None runs unless all fit.
    if (Array.isArray(body)) takeBatchRest(services, ctx, body.length);
    const headers = new Headers();
    for (const [name, value] of Object.entries(ctx.req.headers)) {
      if (typeof value === 'string') headers.set(name, value);
    }
    // Accept was negotiated above, and the body read as JSON under a type the API takes (a +json type,
    // parameters with a comma): the SDK is given the headers it takes, not left to answer 415 in a
    // shape of its own (every 415 here is the API's Error body).
    headers.set('accept', 'application/json, text/event-stream');
    headers.set('content-type', 'application/json');
    const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    const gone = clientGone(ctx);
    // Should the SDK ever hold an answer back, the wait ends with the connection (nobody to answer then).
    const left = new Promise<undefined>((resolve) => {
      if (gone.aborted) resolve(undefined);
      else gone.addEventListener('abort', () => resolve(undefined), { once: true });
    });
    const server = createMcpServer(services, gone, log, body);
    try {
      await server.connect(transport);
      const sdk = await Promise.race([transport.handleRequest(new Request(`http://mcp.invalid${ctx.originalUrl}`, { method: 'POST', headers }), { parsedBody: body }), left]);
      if (!sdk) return;
      const text = await sdk.text();
      const invalid = envelopeRefusal(body, sdk.status, text);
      if (invalid) return answer(ctx, 400, invalid);
      const refused = paramsRefusal(body, text);
      if (refused) return answer(ctx, 200, refused);
      // Notifications only: 202 with no body, as the transport says (else Koa writes "Accepted").
      // Null before the status: set after it, Koa would turn the 202 into a 204.
      if (!text) ctx.body = null;
      ctx.status = sdk.status;
      sdk.headers.forEach((value, name) => ctx.set(name, value));
      if (text) ctx.body = Array.isArray(body) && sdk.status === 200 ? batchAnswer(body, text) : text;
    } finally {
      await server.close();
    }
  }),
];

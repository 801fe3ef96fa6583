// JSON-RPC 2.0 as the two JSON-RPC endpoints (A2A, MCP) answer it, for the OpenAPI document: what
// they take is described where their methods are (domain/a2a/jsonrpc.ts, domain/bridge/mcp-envelope.ts).
import { Type } from '@sinclair/typebox';

const Id = Type.Union([Type.String(), Type.Number(), Type.Null()], { description: 'the request id; null when it could not be read' });

export const JsonRpcResponse = Type.Union([
  Type.Object({ jsonrpc: Type.Literal('2.0'), id: Id, result: Type.Unknown() }),
  Type.Object({ jsonrpc: Type.Literal('2.0'), id: Id, error: Type.Object({ code: Type.Integer(), message: Type.String(), data: Type.Optional(Type.Unknown()) }) }),
], { $id: 'JsonRpcResponse', description: 'a JSON-RPC 2.0 response: a result or an error' });

// OpenAPI 3.1 has no schema for the events of a stream: what each one holds is said in words.
export const JsonRpcEventStream = Type.String({
  description: 'Server-Sent Events: the data: line of each event is one JSON-RPC response (JsonRpcResponse) to the call, '
    + 'the stream closing after the last; comment lines (": keep-alive") come between events while nothing happens.',
});

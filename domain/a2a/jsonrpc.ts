// JSON-RPC 2.0 dispatch for A2A v0.3: envelope checks, method lookup, params validation, and
// every failure as an error object with the request id echoed (null only when unreadable).
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import type { Config } from '../config.ts';
import { echoed, type FieldError } from '../errors.ts';
import { findUnstorable } from '../storable-json.ts';
import type { Logger } from '../logger.ts';
import { A2AError, JSONRPC, logRpcError, toJsonRpcError, type JsonRpcErrorObject } from './errors.ts';
import * as m from './methods.ts';
import * as p from './params.ts';
import { inexactId } from '../jsonrpc-id.ts';

export type RpcId = string | number | null;
export type RpcResponse = { jsonrpc: '2.0'; id: RpcId; result: unknown } | { jsonrpc: '2.0'; id: RpcId; error: JsonRpcErrorObject };
export type RpcOutcome = { response: RpcResponse } | { id: RpcId; stream: m.TaskStream };

interface Method {
  params: TSchema;
  validate: p.Validator<unknown>;
  run(call: m.A2ACall, params: unknown): Promise<unknown>;
  stream?: true;
  /** params may be left out: they are read as null */
  paramsOptional?: true;
}

const method = <S extends TSchema>(params: S, run: (call: m.A2ACall, params: Static<S>) => Promise<unknown>, opts: { stream?: true; paramsOptional?: true } = {}): Method =>
  ({ params, validate: p.validator(params), run: run as Method['run'], ...opts });

const METHODS: Record<string, Method> = {
  'message/send': method(p.MessageSendParams, m.sendMessage),
  'message/stream': method(p.MessageSendParams, m.streamMessage, { stream: true }),
  'tasks/get': method(p.TaskQueryParams, m.getTask),
  'tasks/cancel': method(p.TaskIdParams, m.cancelTask),
  'tasks/resubscribe': method(p.TaskIdParams, m.resubscribe, { stream: true }),
  'tasks/pushNotificationConfig/set': method(p.SetPushConfigParams, m.setPushConfig),
  'tasks/pushNotificationConfig/get': method(p.GetPushConfigParams, m.getPushConfig),
  'tasks/pushNotificationConfig/list': method(p.TaskIdParams, m.listPushConfigs),
  'tasks/pushNotificationConfig/delete': method(p.DeletePushConfigParams, m.deletePushConfig),
  'agent/getAuthenticatedExtendedCard': method(p.NoParams, (call) => m.extendedCard(call), { paramsOptional: true }),
};

// The request body as the OpenAPI document describes it (api/routes/a2a.ts): one shape per method,
// with the params schema that method checks. dispatch reads a body member by member instead, so
// that each thing wrong with it gets the JSON-RPC error that fits.
export const A2ARequest = Type.Union(Object.entries(METHODS).map(([name, { params, paramsOptional }]) => Type.Object({
  jsonrpc: Type.Literal('2.0'),
  id: p.RequestId,
  method: Type.Literal(name),
  params: paramsOptional ? Type.Optional(params) : params,
}, { additionalProperties: false })), { $id: 'A2ARequest', description: 'a JSON-RPC 2.0 request to one of the A2A v0.3 methods this agent serves' });

// JSON that could not be stored (NUL, lone surrogates, deep nesting: findUnstorable) is refused
// before any method runs: inside params, -32602 in place of their validation (so a streaming call
// gets it as its stream's event); elsewhere, -32600 before anything else is looked at.
const inParams = (problem: FieldError) => problem.path.startsWith('body.params');

function unstorableError(problem: FieldError): A2AError {
  const code = inParams(problem) ? JSONRPC.INVALID_PARAMS : JSONRPC.INVALID_REQUEST;
  const path = problem.path.replace(/^body\.?/, '');
  if (code === JSONRPC.INVALID_REQUEST) return new A2AError(code, `Invalid request: ${path || 'the request'} ${problem.message}`);
  // Named as a params check names a field, with the same data (params.ts).
  return new A2AError(code, `Invalid params: ${path} ${problem.message}`, { errors: [{ path, message: problem.message }] });
}

/**
 * Whether dispatch answers this body with a stream (told before it is dispatched, to hold a stream
 * place). With streaming switched off none is: those methods answer -32004 (requireStreaming). Nor
 * is one whose envelope dispatch refuses: its -32600 must not wait for, or be refused for, a stream
 * place. A streaming call without an id is refused too, after its params are checked (dispatch).
 */
export const callsStream = (body: unknown, cfg: Pick<Config, 'A2A_STREAMING'>, notes: BodyNotes): boolean => {
  if (!cfg.A2A_STREAMING || !isOneRequest(body)) return false;
  return envelopeError(body, notes) === undefined && Object.hasOwn(body, 'id') && !!METHODS[body.method as string].stream;
};

export const PARSE_ERROR: RpcResponse = { jsonrpc: '2.0', id: null, error: { code: JSONRPC.PARSE_ERROR, message: 'Parse error: the request body is not valid JSON' } };

export const errorResponse = (id: RpcId, err: unknown): RpcResponse => ({ jsonrpc: '2.0', id, error: toJsonRpcError(err) });

// The stream of a streaming call refused after it was accepted: its one event is the error.
async function* failed(err: unknown): m.TaskStream {
  throw err;
}

// A number id must come back as the client wrote it: beyond 2^53 JSON.parse has already rounded it
// (and 1e400 is Infinity), so answering it would answer another id.
export const isId = (v: unknown): v is RpcId => typeof v === 'string' || v === null || (typeof v === 'number' && Math.abs(v) <= Number.MAX_SAFE_INTEGER);

// A request this endpoint reads: one JSON object (a batch, an array, is refused whole).
const isOneRequest = (body: unknown): body is Record<string, unknown> => typeof body === 'object' && body !== null && !Array.isArray(body);

const MEMBERS = new Set(['jsonrpc', 'id', 'method', 'params']);
const unknownMember = (req: object) => Object.keys(req).find((k) => !MEMBERS.has(k));

/** What reading the request found: members that could not be stored (findUnstorable), and a number id JSON.parse read as another number (what is wrong with it). */
export interface BodyNotes { unstorable?: FieldError; inexactId?: string }

export function notesOf(body: unknown, text: string): BodyNotes {
  // A batch is refused whole: its members' ids are not read.
  return { unstorable: findUnstorable(body, 'body', { brackets: true }), inexactId: Array.isArray(body) ? undefined : inexactId(body, text)?.problem };
}

// What is wrong with a request's envelope (everything but its params), in the order dispatch tells
// it: -32600, or -32601 for a method this agent does not serve.
function envelopeError(req: Record<string, unknown>, { unstorable, inexactId }: BodyNotes): A2AError | undefined {
  if (unstorable && !inParams(unstorable)) return unstorableError(unstorable);
  if (req.jsonrpc !== '2.0') return new A2AError(JSONRPC.INVALID_REQUEST, 'Invalid request: jsonrpc must be "2.0"');
  if ('id' in req && !isId(req.id)) return new A2AError(JSONRPC.INVALID_REQUEST, 'Invalid request: id must be a string, a number of at most 2^53 - 1 in magnitude, or null');
  if (inexactId !== undefined) return new A2AError(JSONRPC.INVALID_REQUEST, `Invalid request: ${inexactId}`);
  const extra = unknownMember(req);
  if (extra !== undefined) return new A2AError(JSONRPC.INVALID_REQUEST, `Invalid request: unknown member '${echoed(extra)}' (a request has jsonrpc, id, method and params)`);
  if (typeof req.method !== 'string') return new A2AError(JSONRPC.INVALID_REQUEST, 'Invalid request: method must be a string');
  if (!Object.hasOwn(METHODS, req.method)) return new A2AError(JSONRPC.METHOD_NOT_FOUND, `Method not found: ${echoed(req.method)}`);
  return undefined;
}

export async function dispatch(call: m.A2ACall, body: unknown, log: Logger, notes: BodyNotes = {}): Promise<RpcOutcome> {
  if (!isOneRequest(body)) {
    const why = Array.isArray(body) ? 'batch requests are not supported' : 'the request must be a JSON object';
    return { response: errorResponse(null, new A2AError(JSONRPC.INVALID_REQUEST, `Invalid request: ${why}`)) };
  }
  const id: RpcId = isId(body.id) && notes.inexactId === undefined ? body.id : null;
  try {
    const envelope = envelopeError(body, notes);
    if (envelope) throw envelope;
    const method = body.method as string; // a method served: envelopeError
    const target = METHODS[method];
    const params = body.params === undefined && target.paramsOptional ? null : body.params;
    const validated = (value: unknown) => {
      // Past the envelope, what could not be stored is in the params (-32602).
      if (notes.unstorable) throw unstorableError(notes.unstorable);
      return target.validate(value);
    };
    // A request without an id is told what else is wrong with it first (the compatibility kit's
    // mandatory checks send id-less requests and expect -32601 and -32602); only then that
    // notifications are not taken.
    if (!('id' in body)) {
      validated(params);
      throw new A2AError(JSONRPC.INVALID_REQUEST, 'Invalid request: id is required (notifications are not supported)');
    }
    if (target.stream) {
      m.requireStreaming(call, method);
      // As in the SDK's server: with streaming on, a streaming call is answered with a stream, and
      // what goes wrong from there (params that do not fit, an unknown or terminal task) is its one
      // event: 0.3 clients read no other answer to these methods.
      const stream = await Promise.resolve()
        .then(() => target.run(call, validated(params)))
        .catch((err: unknown) => failed(err));
      return { id, stream: stream as m.TaskStream };
    }
    return { response: { jsonrpc: '2.0', id, result: await target.run(call, validated(params)) } };
  } catch (err) {
    const error = toJsonRpcError(err);
    logRpcError(log, err, error, { method: body.method }, 'a2a method failed');
    return { response: { jsonrpc: '2.0', id, error } };
  }
}

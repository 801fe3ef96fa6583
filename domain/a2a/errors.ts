// JSON-RPC 2.0 / A2A v0.3 errors. Domain code throws these (or the generic AppErrors, which
// toJsonRpcError maps); api/routes/a2a.ts turns them into error responses with HTTP 200.
import { AppError, logFailure, raceConflict, unavailability } from '../errors.ts';
import type { Logger } from '../logger.ts';

export const JSONRPC = {
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL: -32603,
  TASK_NOT_FOUND: -32001,
  TASK_NOT_CANCELABLE: -32002,
  PUSH_NOT_SUPPORTED: -32003,
  UNSUPPORTED_OPERATION: -32004,
} as const;

export interface JsonRpcErrorObject { code: number; message: string; data?: unknown }

export class A2AError extends Error {
  constructor(readonly code: number, message: string, readonly data?: unknown) {
    super(message);
    this.name = 'A2AError';
  }

  toJSON(): JsonRpcErrorObject {
    return { code: this.code, message: this.message, ...(this.data !== undefined ? { data: this.data } : {}) };
  }
}

export class TaskNotFoundError extends A2AError {
  constructor(taskId: string) { super(JSONRPC.TASK_NOT_FOUND, `Task not found: ${taskId}`, { taskId }); }
}
export class TaskNotCancelableError extends A2AError {
  constructor(taskId: string, state: string) { super(JSONRPC.TASK_NOT_CANCELABLE, `Task not cancelable: ${taskId} is already ${state}`, { taskId, state }); }
}
export const invalidParams = (message: string, data?: unknown) => new A2AError(JSONRPC.INVALID_PARAMS, message, data);
export const invalidRequest = (message: string, data?: unknown) => new A2AError(JSONRPC.INVALID_REQUEST, message, data);

// Any thrown value as a JSON-RPC error object; unexpected ones become -32603 without details,
// Postgres or Redis being unavailable -32603 saying so, with data.code 'unavailable' (retry later).
export function toJsonRpcError(err: unknown): JsonRpcErrorObject {
  if (err instanceof A2AError) return err.toJSON();
  const race = raceConflict(err);
  if (race) return invalidRequest(race.message).toJSON();
  const known = err instanceof AppError ? err : unavailability(err);
  if (known) {
    if (known.status === 404 && known.data.resource === 'task') return new TaskNotFoundError(String(known.data.id)).toJSON();
    // Anything else a client named that does not exist (a push config id) is a bad parameter.
    if (known.status === 404) return invalidParams(known.message, known.data).toJSON();
    if (known.status === 400) return invalidParams(known.message, known.data.errors ? { errors: known.data.errors } : undefined).toJSON();
    if (known.status === 409) return invalidRequest(known.message, known.data).toJSON();
    if (known.status === 413) return invalidParams(known.message, known.data).toJSON();
    // Said as REST says it, with no JSON-RPC code of its own: a key revoked while its stream was open
    // (api/a2a-sse.ts), Postgres or Redis out of reach.
    if (known.status === 401 || known.status === 503) return { code: JSONRPC.INTERNAL, message: known.message, data: { code: known.code } };
    // An upstream that failed (KMS sealing a push token) is no bug of ours: said as REST says it (502).
    if (known.status === 502) return { code: JSONRPC.INTERNAL, message: known.message, data: { code: known.code, ...known.data } };
  }
  return { code: JSONRPC.INTERNAL, message: 'Internal error' };
}

/** Logs a call's error (`error`: its JSON-RPC answer) as a request failing with the same cause would be (logFailure). */
export function logRpcError(log: Logger, err: unknown, error: JsonRpcErrorObject, fields: Record<string, unknown>, msg: string): void {
  if (err instanceof A2AError || error.code !== JSONRPC.INTERNAL) return;
  logFailure(log, err, (err instanceof AppError ? err : unavailability(err)) ?? { status: 500, code: 'internal' }, msg, fields);
}

// Typed errors thrown by domain and repository code; api/middleware/errors.ts maps them to HTTP.
import type { Logger } from './logger.ts';

// Every data.code an Error body may carry: the OpenAPI document's Error schema lists these.
export const ERROR_CODES = [
  'invalid_request', 'unauthenticated', 'forbidden', 'not_found', 'method_not_allowed', 'conflict',
  'gone', 'payload_too_large', 'unsupported_media_type', 'rate_limited', 'internal', 'bad_gateway',
  'unavailable',
] as const;
export type ErrorCode = typeof ERROR_CODES[number];

// What the agent runtime answers when it refuses what a run handed it or asked for (400: parts of
// the wrong shape, a status it cannot set or end in, bad function params; 404: an unknown secret, a
// function not enabled; 413: a message or artifact over what a task may hold): no retry can mend it.
export const refusedByRuntime = (err: unknown): err is AppError => err instanceof AppError && [400, 404, 413].includes(err.status);

export class AppError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    readonly data: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = new.target.name;
  }
}

// V8's JSON.parse message quotes up to some 20 characters of the text around an unexpected token
// (`Unexpected token 's', ..."w_value": sv-1d8f"... is not valid JSON`): a secret's value, a token or
// a key sent unquoted would come back in the 400, and into whatever logs the answer. Its own words
// (and the position, where V8 gives one) are kept.
export const jsonErrorWithoutExcerpt = (message: string) => message.replace(/, (?:\.\.\.)?".*"(?:\.\.\.)? is not valid JSON$/s, '');

// What a client sent (a method or tool name, a header) as an error quotes it back: in full up to
// ECHO_MAX characters, else its first ECHO_START and its length, so that a name of a megabyte does
// not come back whole. Control characters (and U+2028/9) are escaped, so that it reads on one line,
// never as lines of its own, wherever the message is shown or logged.
const ECHO_MAX = 100;
const ECHO_START = 60;
const ESCAPES: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };
export function echoed(text: string): string {
  let shown = text;
  if (text.length > ECHO_MAX) {
    // Not cut inside a surrogate pair.
    const end = /[\ud800-\udbff]/.test(text[ECHO_START - 1]) ? ECHO_START - 1 : ECHO_START;
    shown = `${text.slice(0, end)}… (${text.length} characters)`;
  }
  return shown.replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, (c) => ESCAPES[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

export interface FieldError { path: string; message: string }

// A member's path below `parent`: `parent.name`, or `parent["name"]` for a name that would read as
// the parent itself (empty) or as other members (a dot, a bracket, a quote, white space).
export const memberPath = (parent: string, name: string): string =>
  (/^[^\s.[\]"\u0000-\u001f\u007f]+$/.test(name) ? `${parent}.${name}` : `${parent}[${JSON.stringify(name)}]`);

export class InvalidRequest extends AppError {
  constructor(message: string, errors?: FieldError[]) {
    super(400, 'invalid_request', message, errors ? { errors } : {});
  }
}
export class Unauthenticated extends AppError {
  constructor(message = 'Missing or invalid API key', challenge = 'Bearer') {
    super(401, 'unauthenticated', message, {}, { 'WWW-Authenticate': challenge });
  }
}
export class Forbidden extends AppError {
  constructor(scope: string) {
    super(403, 'forbidden', `This API key lacks the scope '${scope}'`, { required_scope: scope });
  }
}
export class MethodNotAllowed extends AppError {
  constructor(message: string, allow: string) {
    super(405, 'method_not_allowed', message, { allow }, { Allow: allow });
  }
}
// What a 404's data.resource may name: fixed snake_case names, as clients match on them.
export type ResourceName =
  | 'task' | 'push_notification_config' | 'secret' | 'api_key' | 'envelope_key' | 'dek' | 'dek_alias' | 'job'
  | 'provider_controller' | 'credential_controller' | 'function_controller' | 'provider_instance' | 'function_instance'
  | 'credential' | 'user_credential' | 'resource_server_credential' | 'broker_state';
// How a 404's message names the resources it names in words; the others by their name.
const RESOURCE_WORDS: Partial<Record<ResourceName, string>> = {
  push_notification_config: 'push notification config', provider_controller: 'provider controller',
  credential_controller: 'credential controller', user_credential: 'user credential',
  resource_server_credential: 'resource server credential',
};
export class NotFound extends AppError {
  /** `resource`: what was looked for, data.resource (the ids go in `id` and `within`);
   * `within`: what the resource was looked for in, e.g. "for provider 'stripe'".
   * Or, for one looked for by something other than an id of its own (a task's only push config, a
   * brokering flow's state), `described`: the message saying what is missing, and data beside
   * `resource` (no made-up `id`). */
  constructor(resource: ResourceName, id: string, within?: string);
  constructor(resource: ResourceName, described: { message: string; data?: Record<string, unknown> });
  constructor(resource: ResourceName, id: string | { message: string; data?: Record<string, unknown> }, within?: string) {
    if (typeof id === 'string') super(404, 'not_found', `${RESOURCE_WORDS[resource] ?? resource} '${id}' not found${within ? ` ${within}` : ''}`, { resource, id });
    else super(404, 'not_found', id.message, { resource, ...id.data });
  }
}
export class Conflict extends AppError {
  constructor(message: string, data: Record<string, unknown> = {}) {
    super(409, 'conflict', message, data);
  }
}
export class Gone extends AppError {
  constructor(message: string) {
    super(410, 'gone', message);
  }
}
export class Upstream extends AppError {
  constructor(message: string, data: Record<string, unknown> = {}) {
    super(502, 'bad_gateway', message, data);
  }
}
// An upstream that gave no answer at all (unreachable, connection reset, none in time): unlike one
// that answered, it may never have acted on the request, so a single-use grant may still be good.
export class NoAnswer extends Upstream {}
export class RateLimited extends AppError {
  constructor(retryAfterMs: number, message?: string, data: Record<string, unknown> = {}) {
    const seconds = Math.max(1, Math.ceil(retryAfterMs / 1000));
    super(429, 'rate_limited', message ?? `Too many requests for this API key; retry in ${seconds} s`, { ...data, retry_after_ms: retryAfterMs }, { 'Retry-After': String(seconds) });
  }
}
export class Unavailable extends AppError {
  constructor(message: string, data: Record<string, unknown> = {}) {
    super(503, 'unavailable', message, data, { 'Retry-After': '5' });
  }
}
// The readiness probe's 503 (domain/readiness.ts): its answer that this process should get no
// traffic now (draining, a backing service out of reach), not a request failing.
export class NotReady extends Unavailable {}
// Postgres too busy for a write: it waited too long, or behind too many others, for a statement
// (db/statement-batcher.ts), as a request waiting for a pool connection would.
export class DatabaseBusy extends Unavailable {}
export class PayloadTooLarge extends AppError {
  constructor(message: string, data: Record<string, unknown> = {}) {
    super(413, 'payload_too_large', message, data);
  }
}
export class UnsupportedMediaType extends AppError {
  constructor(message: string, headers: Record<string, string> = {}) {
    super(415, 'unsupported_media_type', message, {}, headers);
  }
}

// A write that lost a race is a conflict the client may retry, not a bug: a row it refers to was
// deleted meanwhile (23503), the same identity was created meanwhile (23505), or a lock conflict
// (40001, 40P01). Other errors: undefined.
export function raceConflict(err: unknown): Conflict | undefined {
  const code = (err as { code?: unknown })?.code;
  if (code === '23503') return new Conflict('Something this request refers to was changed or deleted meanwhile; retry or check it');
  if (code === '23505') return new Conflict('A resource with this identity was created meanwhile');
  if (code === '40001' || code === '40P01') return new Conflict('A concurrent change conflicted with this request; retry');
  return undefined;
}

// Postgres or Redis out of reach, whatever is asked of it: connection failures, including a
// connection reset or cut under a statement (a server killed or restarted, a proxy dropping it);
// ioredis producers fail fast without a code ("Stream isn't writeable ...", "Connection is
// closed.", or "Command timed out" when silent past DB_QUERY_TIMEOUT_MS); a Postgres shutting down,
// restarting or full (57P01-57P03, 53300); no pool connection to be had, or no turn for a write
// (DatabaseBusy).
const POSTGRES_CODES = ['57P01', '57P02', '57P03', '53300'];
const UNREACHABLE_CODES = ['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', ...POSTGRES_CODES];
// ioredis's messages, and pg's and knex's.
const REDIS_MESSAGE = /Stream isn't writeable|^Connection is closed|^Command timed out$/;
const POSTGRES_MESSAGE = /Knex: Timeout acquiring a connection|Connection terminated unexpectedly|^timeout expired$|is not queryable$/;
export function unreachable(err: unknown): boolean {
  const e = err as { code?: unknown; name?: unknown; message?: unknown };
  const message = String(e?.message ?? '');
  return UNREACHABLE_CODES.includes(String(e?.code)) || e?.name === 'MaxRetriesPerRequestError' || REDIS_MESSAGE.test(message) || POSTGRES_MESSAGE.test(message) || err instanceof DatabaseBusy;
}

// A connection that could not be made at all: out of reach, or a system error on the way (a host that
// does not resolve: ENOTFOUND, EAI_AGAIN...), as the release step and the CLI tell their operator.
export function connectionFailed(err: unknown): boolean {
  return unreachable(err) || /^E[A-Z]+$/.test(String((err as { code?: unknown })?.code));
}

// Postgres refusing the login itself: a class 28 SQLSTATE (a wrong password, no pg_hba.conf entry)
// or a database that does not exist (3D000). No wait mends it.
export function loginRefused(err: unknown): boolean {
  const code = String((err as { code?: unknown })?.code);
  return code.startsWith('28') || code === '3D000';
}

// Redis refusing this login: a wrong password or user (WRONGPASS), or none where it asks for one
// (NOAUTH; ioredis's ready check wraps it as "Ready check failed: NOAUTH …").
export function redisLoginRefused(err: unknown): boolean {
  return /\b(WRONGPASS|NOAUTH)\b/.test(String((err as { message?: unknown })?.message));
}

// Postgres refusing the connection it was reached on: the login, or a class 08 (connection
// exception) SQLSTATE. As the release step and the CLI tell their operator, beside connectionFailed.
export function connectionRefused(err: unknown): boolean {
  return loginRefused(err) || String((err as { code?: unknown })?.code).startsWith('08');
}

// A statement the client gave up on: no answer read past DB_QUERY_TIMEOUT_MS and a grace (db/knex.ts).
// Not proof that Postgres is silent: its answer may wait unread behind an event loop kept busy that
// long, or the statement may still run where statement_timeout does not reach Postgres (PgBouncer's
// ignore_startup_parameters), e.g. waiting on another session's lock.
export function unanswered(err: unknown): boolean {
  return /Query read timeout$/.test(String((err as { message?: unknown })?.message ?? ''));
}

// A statement Postgres canceled (57014: DB_QUERY_TIMEOUT_MS) or the client gave up on.
export function statementTimedOut(err: unknown): boolean {
  return (err as { code?: unknown })?.code === '57014' || unanswered(err);
}

// A failure of Postgres or Redis to answer: the service is unavailable, not broken. Out of reach, or
// a statement that timed out, which may be about that statement alone. Other errors: undefined.
export function unavailability(err: unknown): Unavailable | undefined {
  if (unreachable(err) || statementTimedOut(err)) {
    return new Unavailable('A backing service is unavailable; retry shortly');
  }
  return undefined;
}

// What may be told to API users about a failure (task status messages, key job errors): the
// error's own message, except for database errors, whose text names our SQL: those say only
// their SQLSTATE (the worker log has the rest).
export function publicReason(err: unknown): string {
  const e = err as { message?: unknown; code?: unknown; severity?: unknown };
  if (typeof e?.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code) && typeof e.severity === 'string') return `a database error (SQLSTATE ${e.code})`;
  return typeof e?.message === 'string' ? e.message : String(err);
}

// Which backing service an outage came from, where the error's form tells (a refused or reset
// socket says neither).
export function outageOf(err: unknown): 'redis' | 'postgres' | undefined {
  const e = err as { code?: unknown; name?: unknown; message?: unknown };
  const message = String(e?.message ?? '');
  if (e?.name === 'MaxRetriesPerRequestError' || REDIS_MESSAGE.test(message)) return 'redis';
  if (POSTGRES_CODES.includes(String(e?.code)) || POSTGRES_MESSAGE.test(message) || statementTimedOut(err) || err instanceof DatabaseBusy) return 'postgres';
  return undefined;
}

// How a request's failure is logged, by the status it is answered with (or maps to): a fault of
// ours (500) at error with its stack; Postgres or Redis unavailable (503) or an upstream failing
// (502: a provider, a token endpoint, KMS), which clients can cause at will, at warn with the reason
// and `msg: <code>`; a client's error not at all. A readiness probe's 503 (NotReady) at debug: load
// balancers probe every few seconds, so a routine drain or an outage gave a warn line per probe, and
// its request line (info, with the status) records each, and its body names what failed.
export function logFailure(log: Logger | undefined, err: unknown, e: Pick<AppError, 'status' | 'code'>, msg: string, fields: Record<string, unknown> = {}): void {
  // An operator reading `Stream isn't writeable` learns from `service` that Redis is the one out of reach.
  if (e.status === 502 || e.status === 503) log?.[err instanceof NotReady ? 'debug' : 'warn']({ ...fields, reason: (err as Error)?.message, code: (err as { code?: unknown })?.code, service: outageOf(err) }, `${msg}: ${e.code}`);
  else if (e.status >= 500) log?.error({ ...fields, err }, msg);
}

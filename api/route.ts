// One declaration per endpoint: its schemas validate the request and feed the OpenAPI document.
import { Readable } from 'node:stream';
import { Type, type Static, type TObject, type TSchema } from '@sinclair/typebox';
import type { Router, RouterMiddleware } from '@koa/router';
import type { Context, Middleware } from 'koa';
import { Ajv } from 'ajv';
import addFormats from 'ajv-formats';
import { InvalidRequest, MethodNotAllowed } from '../domain/errors.ts';
import { checkValid, compileSchema } from '../domain/schema-check.ts';
import type { Services } from '../domain/services.ts';
import type { Logger } from '../domain/logger.ts';
import { authenticate, requireScope, type Principal, type Scope } from './middleware/auth.ts';
import { readJsonBody } from './middleware/body.ts';
import { rateLimit } from './middleware/rate-limit.ts';

export type Method = 'get' | 'post' | 'put' | 'patch' | 'delete';

// The groups operations are tagged with and what each is for (the seed's "What the service does"),
// declared in the OpenAPI document so a client's generator can name and describe them.
export const TAGS = {
  task: 'Create, list and read tasks and their messages. Tasks are grouped by context and each task has a timeline of events.',
  secret: 'Store secrets, keyed by a key name. Values are kept encrypted. A raw value is accepted on create and update, and only the encrypted value is returned (the decrypted list needs secret:decrypt).',
  encryption: 'Manage envelope encryption keys, data encryption keys (DEKs) and DEK aliases. Includes migrating DEKs to a different envelope key and rotating an alias to a new DEK.',
  bridge: 'Manage providers (provider instances, credentials, functions). Completes the OAuth flow that brokers user credentials. Carries MCP (model context protocol) JSON-RPC messages.',
  a2a: 'Agent-to-agent communication: agent cards, definitions and JSON-RPC requests for tasks and messages.',
  auth: 'Manage API keys (admin scope).',
  _internal: 'Health checks, runtime configuration and SDK code generation; also readiness, queue counts, metrics and this document.',
  v1: 'Marks the version-1 endpoints.',
} as const;
export type Tag = Exclude<keyof typeof TAGS, 'v1'>;

export interface RouteSpec<P extends TObject | undefined, Q extends TObject | undefined, B extends TSchema | undefined> {
  method: Method;
  path: string; // Koa style, e.g. /api/task/v1/:task_id
  operationId: string;
  tag: Tag;
  summary: string;
  scope: Scope | readonly Scope[] | null; // null: public route; several: all of them are needed
  params?: P;
  query?: Q;
  body?: B;
  /**
   * The handler reads the request body itself (the JSON-RPC endpoints, whose errors have their own
   * shape); this schema describes it in the OpenAPI document and checks nothing.
   */
  ownBody?: TSchema;
  responses: Record<number, TSchema | null>;
  /** What a response means, where 'Success' / 'Error' would not say (two success codes). */
  responseDescriptions?: Record<number, string>;
  responseType?: string; // media type of the success body; application/json when absent
  /** Other media types a success body may come in, each with its schema (A2A's streams: text/event-stream). */
  moreResponseTypes?: Record<string, TSchema>;
  /** A GET that refuses HEAD (405: fixedPathMethods), which the router would otherwise answer with the GET (a GET with effects, which a link prefetcher's HEAD would have); Allow leaves HEAD out. Fixed paths only: the router matches nothing else to them. */
  noHead?: true;
  /** Every answer (errors and the 405s of fixedPathMethods included) carries Cache-Control: no-store: it may hold what no cache should keep (the OAuth callback's new credential). */
  noStore?: true;
  /** A POST that writes nothing, so loses no race: no 409 implied in the OpenAPI document (api/openapi.ts). */
  readOnly?: true;
  /**
   * A check run first, before authentication and the rate limit (the MCP endpoint's Origin check):
   * it answers itself (its status listed in `responses`) to refuse, or calls next.
   */
  guard?: (services: Services) => Middleware;
}

type In<T> = T extends TSchema ? Static<T> : undefined;
export interface Request<P, Q, B> {
  params: In<P>;
  query: In<Q>;
  body: In<B>;
  principal: Principal | null;
  ctx: Context;
  services: Services;
  /** The request's logger: its lines carry the request id. */
  log: Logger;
}

export interface Route {
  spec: RouteSpec<TObject | undefined, TObject | undefined, TSchema | undefined>;
  handler: (req: Request<unknown, unknown, unknown>) => Promise<unknown>;
}

export function defineRoute<P extends TObject | undefined = undefined, Q extends TObject | undefined = undefined, B extends TSchema | undefined = undefined>(
  spec: RouteSpec<P, Q, B>,
  handler: (req: Request<P, Q, B>) => Promise<unknown>,
): Route {
  return { spec, handler } as unknown as Route;
}

// Path and query parameters arrive as strings: their compiler coerces and fills defaults.
const paramAjv = addFormats.default(new Ajv({ allErrors: true, coerceTypes: true, useDefaults: true, strict: false }));

// A body whose members are all optional may be left out: a request without one means `{}`.
export const bodyRequired = (schema: TSchema): boolean => !compileSchema(schema)({});

// A fixed path ('/api/secret/v1/import') also matches its parameterized siblings ('/:secret_id'):
// a method it lacks would reach those and be refused as a bad id, or be told it may use theirs.
// Requests to a fixed path with a method it lacks get 405 naming its own methods (HEAD too, for a
// GET route that refuses it: noHead).
export function fixedPathMethods(routes: Route[]): Middleware {
  const methods = new Map<string, Set<string>>();
  const noStore = new Set<string>();
  for (const { spec } of routes) {
    if (spec.path.includes(':')) continue;
    if (spec.noStore) noStore.add(spec.path);
    const set = methods.get(spec.path) ?? new Set<string>();
    // In the router's order (HEAD before GET), so Allow reads the same as on its own 405s.
    if (spec.method === 'get' && !spec.noHead) set.add('HEAD');
    set.add(spec.method.toUpperCase());
    methods.set(spec.path, set);
  }
  return async (ctx, next) => {
    // The router takes '/import/' for '/import' (one slash, not two).
    const path = ctx.path.length > 1 ? ctx.path.replace(/\/$/, '') : ctx.path;
    const allowed = methods.get(path);
    if (!allowed || allowed.has(ctx.method)) return next();
    if (noStore.has(path)) ctx.set('Cache-Control', 'no-store');
    const allow = [...allowed].join(', ');
    if (ctx.method === 'OPTIONS') {
      ctx.set('Allow', allow);
      ctx.status = 200;
      ctx.body = '';
      return undefined;
    }
    throw new MethodNotAllowed(`Method ${ctx.method} is not allowed on ${ctx.path}`, allow);
  };
}

// A path no route matches because a parameter's value holds '/' sent as it is: the router splits the
// path there ('/api/secret/v1/key/team/db' is no route, 'team%2Fdb' the key 'team/db'). Given the
// routes, a function naming, for a method and path, the parameter that would take the path's extra
// segments, if one of a route's parameters whose schema takes '/' can (a UUID's never does); else
// undefined. Segments are compared one by one (no regular expression: a path of thousands of
// slashes must cost no more than its length), and only for paths of a length a URL may have.
const HINTED_PATH_MAX = 4096;
export function slashedParameter(routes: Route[]): (method: string, path: string) => string | undefined {
  const candidates = routes.flatMap(({ spec }) => {
    const props = (spec.params as { properties?: Record<string, TSchema> } | undefined)?.properties ?? {};
    const segments = spec.path.split('/');
    const methods = spec.method === 'get' ? ['GET', 'HEAD'] : [spec.method.toUpperCase()];
    return Object.keys(props).filter((name) => compileSchema(props[name])('a/b')).map((name) => {
      const at = segments.indexOf(`:${name}`);
      return { name, methods, before: segments.slice(0, at), after: segments.slice(at + 1) };
    });
  });
  // A route's segment against the path's: a parameter takes any non-empty one, a fixed one itself.
  const fits = (route: string, given: string) => (route.startsWith(':') ? given !== '' : route === given);
  return (method, path) => {
    if (path.length > HINTED_PATH_MAX) return undefined;
    const given = path.split('/');
    return candidates.find(({ methods, before, after }) => methods.includes(method)
      // The parameter's own share: two segments or more (one would have matched the route).
      && given.length >= before.length + after.length + 2
      && before.every((seg, i) => fits(seg, given[i]))
      && after.every((seg, i) => fits(seg, given[given.length - after.length + i])))?.name;
  };
}

// ajv's coercion reads a string as Number() does, so '0x10', '1e2' and ' 1' would pass as integers.
const DECIMAL = /^-?[0-9]+$/;
function decimalCheck(schema: TObject | undefined, where: string): (values: Record<string, unknown>) => void {
  const keys = Object.entries(schema?.properties ?? {}).filter(([, p]) => (p as { type?: unknown }).type === 'integer').map(([k]) => k);
  return (values) => {
    for (const k of keys) {
      const v = values[k];
      if (typeof v === 'string' && !DECIMAL.test(v)) throw new InvalidRequest(`Invalid ${where}: ${where}.${k} must be a decimal integer`, [{ path: `${where}.${k}`, message: 'must be a decimal integer' }]);
    }
  };
}

// A UUID names the same row in either letter case (Postgres reads it so), but what a handler derives
// from the text sent would not: a list's page tokens digest its filters' values. Handlers get it in
// lower case, as Postgres answers it.
function uuidsInLowerCase(schema: TObject | undefined): (values: Record<string, unknown>) => void {
  const keys = Object.entries(schema?.properties ?? {}).filter(([, p]) => (p as { format?: unknown }).format === 'uuid').map(([k]) => k);
  return (values) => {
    for (const k of keys) if (typeof values[k] === 'string') values[k] = values[k].toLowerCase();
  };
}

const isEmptyObject = (v: unknown) => typeof v === 'object' && v !== null && !Array.isArray(v) && Object.keys(v).length === 0;

export function mount(router: Router, routes: Route[], services: Services): void {
  for (const { spec, handler } of routes) {
    const vParams = spec.params && paramAjv.compile(spec.params);
    // Unknown query parameters are refused as unknown body members are: a misspelt filter
    // (`?stauts=failed`) would otherwise list everything, and a route without a query schema takes
    // none (a filter it ignored would answer everything). A schema may stay open (the OAuth callback).
    const querySchema = spec.query ?? Type.Object({});
    const vQuery = paramAjv.compile(querySchema.additionalProperties === true ? querySchema : { ...querySchema, additionalProperties: false });
    const decimalQuery = decimalCheck(spec.query, 'query');
    const lowerParams = uuidsInLowerCase(spec.params);
    const lowerQuery = uuidsInLowerCase(spec.query);
    const vBody = spec.body && compileSchema(spec.body);
    const bodyOptional = spec.body !== undefined && !bodyRequired(spec.body);
    const okStatus = Number(Object.keys(spec.responses).find((s) => s.startsWith('2')) ?? 200);
    const stack: RouterMiddleware[] = [];
    // First: the error handler keeps headers set before a throw, so errors carry it too.
    if (spec.noStore) stack.push(async (ctx, next) => { ctx.set('Cache-Control', 'no-store'); await next(); });
    if (spec.guard) stack.push(spec.guard(services));
    if (spec.scope) stack.push(authenticate(services), rateLimit(services), requireScope(spec.scope));
    stack.push(async (ctx: Context) => {
      const params = { ...ctx.params };
      if (vParams) checkValid(vParams, params, 'path');
      lowerParams(params);
      const query = { ...ctx.query } as Record<string, unknown>;
      decimalQuery(query);
      checkValid(vQuery, query, 'query');
      lowerQuery(query);
      let body = spec.ownBody ? undefined : await readJsonBody(ctx, services.cfg.BODY_LIMIT_BYTES);
      if (vBody) {
        // No body at all stands for {} where the body is optional; a JSON null is a body, and refused.
        if (body === undefined && bodyOptional) body = {};
        if (body === undefined) throw new InvalidRequest('A JSON request body is required', [{ path: 'body', message: 'is required' }]);
        checkValid(vBody, body, 'body');
      } else if (body !== undefined && !isEmptyObject(body)) {
        // A route that takes no body refuses one (section 1: unknown members are 400; not JSON, 415
        // above), except `{}`, which some clients send with every POST and which asks for nothing.
        throw new InvalidRequest('This operation takes no request body', [{ path: 'body', message: 'must be absent (or {})' }]);
      }
      const result = await handler({ params, query, body, principal: ctx.state.principal ?? null, ctx, services, log: ctx.state.log ?? services.log } as unknown as Request<unknown, unknown, unknown>);
      if (ctx.body === undefined || ctx.body === null) {
        ctx.status = ctx.status === 404 ? okStatus : ctx.status;
        if (result !== undefined) ctx.body = result;
        // A stream is JSON text (domain/json-stream.ts; Koa pipes it, and destroys it if the client
        // goes): typed, or Koa would call it binary.
        if (result instanceof Readable) ctx.type = 'application/json';
      }
    });
    router.register(spec.path, [spec.method.toUpperCase()], stack, { name: spec.operationId });
  }
}

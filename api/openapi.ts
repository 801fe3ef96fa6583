import { Type, type TSchema } from '@sinclair/typebox';
import { bodyRequired, TAGS, type Route } from './route.ts';
import { ErrorBody } from '../domain/shapes/common.ts';

type Json = Record<string, unknown>;

// Shapes with an $id become named components; everything else is inlined.
function collect(schema: unknown, components: Record<string, Json>): unknown {
  if (Array.isArray(schema)) return schema.map((s) => collect(s, components));
  if (!schema || typeof schema !== 'object') return schema;
  const out: Json = {};
  for (const [k, v] of Object.entries(schema)) if (k !== '$id') out[k] = collect(v, components);
  const id = (schema as Json).$id;
  if (typeof id === 'string') {
    components[id] = out;
    return { $ref: `#/components/schemas/${id}` };
  }
  return out;
}

// Answered before any route runs, on every operation (api/client-errors.ts): a request that is not
// valid HTTP (400), chunk extensions over Node's limit (413), headers over it (431), an Expect other
// than 100-continue (417) and a request not arrived whole within API_REQUEST_TIMEOUT_MS (408: its
// headers, or its body while it is read), all with the Error body, whatever the route answers itself
// with those statuses (the JSON-RPC endpoints' own 400 and 413 included).
const BEFORE_ROUTING = { 400: ErrorBody, 408: ErrorBody, 413: ErrorBody, 417: ErrorBody, 431: ErrorBody };
const orBeforeRouting = (status: string, schema: TSchema | null): TSchema | null => {
  const before = (BEFORE_ROUTING as Record<string, TSchema>)[status];
  return before && schema && schema !== before ? Type.Union([schema, before]) : schema;
};

// Sent with every answer, whatever its status (api/middleware/request-id.ts; api/client-errors.ts
// before routing): the request's own X-Request-Id when sane, else a new one; logs carry it as req_id.
const ANY_STATUS_HEADERS: Json = {
  'X-Request-Id': { description: "The request's X-Request-Id echoed (1..128 of A-Z a-z 0-9 . _ : -), else a new UUID; logs name it req_id", required: true, schema: { type: 'string', pattern: '^[A-Za-z0-9._:-]{1,128}$' } },
};

// The headers an error status carries, wherever it is listed (domain/errors.ts sets them):
// 401 the scheme to authenticate with, 405 the methods the path takes, 429 and 503 when to try
// again, 415 (only for a compressed body, api/middleware/body.ts) the one encoding taken.
const RETRY_AFTER = { description: 'Seconds to wait before retrying', required: true, schema: { type: 'string', pattern: '^[0-9]+$' } };
const STATUS_HEADERS: Record<string, Json> = {
  401: { 'WWW-Authenticate': { description: 'Bearer: send Authorization: Bearer <api key>', required: true, schema: { type: 'string', pattern: '^Bearer' } } },
  405: { Allow: { description: 'The methods this path answers, comma-separated', required: true, schema: { type: 'string' } } },
  415: { 'Accept-Encoding': { description: 'identity: sent when the body was refused for its Content-Encoding (send it uncompressed); absent when it was for its type or charset', required: false, schema: { type: 'string', const: 'identity' } } },
  429: { 'Retry-After': RETRY_AFTER },
  503: { 'Retry-After': RETRY_AFTER },
};

// On every answer of a noStore route (api/route.ts): it may hold a credential, which no cache should
// keep. The answers given before routing (BEFORE_ROUTING) may come without it.
const noStoreHeader = (status: string): Json => ({
  'Cache-Control': { description: 'no-store: the answer may hold what no cache should keep (a new credential)', required: !(status in BEFORE_ROUTING), schema: { type: 'string', const: 'no-store' } },
});

export function buildOpenApi(routes: Route[], info: { version: string; serverUrl: string }): Json {
  const components: Record<string, Json> = {};
  const paths: Record<string, Json> = {};
  for (const { spec } of routes) {
    const path = spec.path.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
    const parameters: Json[] = [];
    for (const [where, schema] of [['path', spec.params], ['query', spec.query]] as const) {
      if (!schema) continue;
      const required = new Set((schema as { required?: string[] }).required ?? []);
      for (const [name, prop] of Object.entries((schema as { properties: Record<string, TSchema> }).properties)) {
        parameters.push({ name, in: where, required: where === 'path' || required.has(name), schema: collect(prop, components) });
      }
    }
    const responses: Json = {};
    // What the shared layers answer on any route they run for (api/route.ts, api/middleware/), listed
    // whether or not the route names them: authentication, scope and rate limit; bad path or query
    // parameters (400); a body too large (413), not JSON (415) or invalid (400). mount reads a body on
    // every route but those that read their own (ownBody), and refuses one where the route takes none,
    // so 415 is listed on GETs and DELETEs too. A route that needs a key reads it from Postgres: 503
    // while Postgres or Redis is unreachable, and 500 for a fault of ours, as on any route that does
    // real work. A write can lose a race (a row it refers to
    // deleted meanwhile, a deadlock): 409 (raceConflict) on every operation that writes, bar the
    // JSON-RPC endpoints, which answer that in their protocol.
    const writes = spec.method !== 'get' && !spec.readOnly && !spec.ownBody;
    const implied = {
      ...BEFORE_ROUTING,
      ...(spec.scope ? { 401: ErrorBody, 403: ErrorBody, 429: ErrorBody, 500: ErrorBody, 503: ErrorBody } : {}),
      ...(spec.ownBody ? {} : { 415: ErrorBody }),
      ...(writes ? { 409: ErrorBody } : {}),
    };
    const own = Object.fromEntries(Object.entries(spec.responses).map(([status, schema]) => [status, orBeforeRouting(status, schema)]));
    for (const [status, schema] of Object.entries({ ...implied, ...own })) {
      const success = status.startsWith('2');
      const types = success ? { [spec.responseType ?? 'application/json']: schema, ...spec.moreResponseTypes } : { 'application/json': schema };
      responses[status] = schema
        ? { description: spec.responseDescriptions?.[Number(status)] ?? (success ? 'Success' : 'Error'), content: Object.fromEntries(Object.entries(types).map(([type, s]) => [type, { schema: collect(s, components) }])) }
        // A redirect (Koa's ctx.redirect): Location says where to; Koa writes a short note as the body,
        // HTML to a client that accepts it (browsers, fetch's */*), else plain text.
        : status.startsWith('3')
          ? { description: spec.responseDescriptions?.[Number(status)] ?? 'Redirect to Location', headers: { Location: { required: true, schema: { type: 'string', format: 'uri' } } },
            content: { 'text/html': { schema: { type: 'string' } }, 'text/plain': { schema: { type: 'string' } } } }
          : { description: 'No content' };
      const answer = responses[status] as Json;
      responses[status] = { ...answer, headers: { ...(answer.headers as Json | undefined), ...ANY_STATUS_HEADERS, ...(spec.noStore ? noStoreHeader(status) : {}), ...STATUS_HEADERS[status] } };
    }
    // A body the handler reads itself is always needed (its protocol's errors answer one left out).
    const body = spec.body ?? spec.ownBody;
    const op: Json = {
      operationId: spec.operationId,
      summary: spec.summary,
      tags: [spec.tag, 'v1'],
      ...(parameters.length ? { parameters } : {}),
      ...(body ? { requestBody: { required: spec.body ? bodyRequired(spec.body) : true, content: { 'application/json': { schema: collect(body, components) } } } } : {}),
      responses,
      ...(spec.scope ? { security: [{ bearer: [] }], 'x-required-scope': spec.scope } : { security: [] }),
    };
    paths[path] = { ...(paths[path] ?? {}), [spec.method]: op };
  }
  return {
    openapi: '3.1.0',
    // The interface is labelled v1 (the seed's Versioning), as its paths are; the release that serves it rides along.
    info: { title: 'taskbridge', version: 'v1', description: 'Agent tasks, secrets, encryption keys, provider bridge and A2A.', 'x-service-version': info.version },
    servers: [{ url: info.serverUrl }],
    tags: Object.entries(TAGS).map(([name, description]) => ({ name, description })),
    paths,
    components: { schemas: components, securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'API key' } } },
  };
}

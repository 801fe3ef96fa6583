// GET /api/openapi.json: a valid OpenAPI 3.1 document covering every route, whose schemas are
// the ones responses actually follow.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv } from 'ajv';
import addFormats from 'ajv-formats';
import { allRoutes } from '../api/app.ts';
import { ERROR_CODES } from '../domain/errors.ts';
import fs from 'node:fs';
import path from 'node:path';
import { ADMIN_KEY, testDb, textMessage, useStack, useStarted, waitFor, type Client, type Response } from './helpers/stack.ts';
import { consent, startOAuthStack, type OAuthStack } from './helpers/oauth-server.ts';

// A validator of a schema in the served document, its component refs resolved against it.
const documentValidators = (doc: any) => {
  const ajv = addFormats.default(new Ajv({ strict: false, discriminator: true }));
  ajv.addSchema(doc, 'openapi');
  const compile = (schema: unknown) => ajv.compile(JSON.parse(JSON.stringify(schema).replace(/"#\/components/g, '"openapi#/components')));
  return { ajv, compile };
};

// A response against the operation its method and path name: its status listed, its content type
// one listed for that status, its JSON body valid against that type's schema.
const responseChecker = (doc: any, client: Client) => {
  const { ajv, compile } = documentValidators(doc);
  const templates = Object.keys(doc.paths).map((p) => ({ p, re: new RegExp(`^${p.replace(/\./g, '\\.').replace(/\{[^}]+\}/g, '[^/]+')}$`) }))
    .sort((a, b) => Number(a.p.includes('{')) - Number(b.p.includes('{'))); // a fixed path before its parameterized sibling
  const seen = new Set<string>();
  const check = (r: Response, method: string, url: string) => {
    const path = new URL(url, 'http://x').pathname;
    const template = templates.find((t) => t.re.test(path))?.p;
    const op = template && doc.paths[template][method];
    assert.ok(op, `${method} ${path} is not documented`);
    const answer = op.responses[String(r.status)];
    assert.ok(answer, `${op.operationId} does not document status ${r.status}: ${r.text.slice(0, 300)}`);
    seen.add(`${op.operationId} ${r.status}`);
    // The headers it names are there; the ones the shared layers add are named.
    for (const [name, h] of Object.entries<any>(answer.headers ?? {})) if (h.required) assert.ok(r.headers.get(name), `${op.operationId} ${r.status}: no ${name} header`);
    for (const name of ['Allow', 'Retry-After', 'Location', 'X-Request-Id', 'Accept-Encoding', 'WWW-Authenticate']) {
      const value = r.headers.get(name);
      if (value === null) continue;
      assert.ok(answer.headers?.[name], `${op.operationId} ${r.status}: ${name} is not documented`);
      const valid = compile(answer.headers[name].schema);
      assert.ok(valid(value), `${op.operationId} ${r.status}: ${name} '${value}': ${ajv.errorsText(valid.errors)}`);
    }
    const type = r.headers.get('content-type')?.split(';')[0] ?? '';
    if (!answer.content) return assert.equal(r.text, '', `${op.operationId} ${r.status}`);
    assert.ok(answer.content[type], `${op.operationId} ${r.status}: content type '${type}' is not among ${Object.keys(answer.content)}`);
    if (type !== 'application/json') return;
    const validate = compile(answer.content[type].schema);
    assert.ok(validate(r.body), `${op.operationId} ${r.status}: ${ajv.errorsText(validate.errors)}\n${r.text.slice(0, 1000)}`);
  };
  const call = async (method: string, url: string, body?: unknown, init?: Parameters<Client['request']>[3], as = client) => {
    const r = await as.request(method.toUpperCase(), url, body, init);
    check(r, method, url);
    return r;
  };
  return { check, call, seen };
};

describe('OpenAPI document', () => {
  // A request timeout short enough to see its 408 (the default is 5 minutes).
  const stack = useStack({ API_REQUEST_TIMEOUT_MS: '2000' }, { workers: 0 });
  let doc: any;
  before(async () => {
    const r = await stack.client.as('').get('/api/openapi.json');
    assert.equal(r.status, 200);
    doc = r.body;
  });

  it('validates as OpenAPI 3.1', async () => {
    const validator = new Validator();
    const res = await validator.validate(structuredClone(doc));
    assert.ok(res.valid, JSON.stringify(res.errors, null, 2)?.slice(0, 4000));
    assert.equal(validator.version, '3.1');
    assert.equal(doc.openapi, '3.1.0');
    // The seed: the interface description is labelled v1.
    assert.equal(doc.info.version, 'v1');
    assert.match(doc.info['x-service-version'], /^\d+\.\d+\.\d+/);
  });

  it('describes every route in allRoutes with its method, operationId, parameters and security', () => {
    const ids = new Set<string>();
    for (const { spec } of allRoutes) {
      const path = spec.path.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
      const op = doc.paths[path]?.[spec.method];
      assert.ok(op, `${spec.method.toUpperCase()} ${path} missing`);
      assert.equal(op.operationId, spec.operationId);
      assert.ok(!ids.has(spec.operationId), `duplicate operationId ${spec.operationId}`);
      ids.add(spec.operationId);
      for (const name of spec.path.match(/:([A-Za-z0-9_]+)/g) ?? []) {
        assert.ok(op.parameters?.some((p: any) => p.in === 'path' && p.name === name.slice(1) && p.required), `${spec.operationId}: path parameter ${name}`);
      }
      if (spec.scope) assert.deepEqual(op.security, [{ bearer: [] }], spec.operationId);
      else assert.deepEqual(op.security, [], spec.operationId);
      assert.equal(!!op.requestBody, !!(spec.body ?? spec.ownBody), `${spec.operationId}: requestBody`);
    }
    // Statuses the shared layers answer are listed even where a route does not name them.
    const statuses = (path: string, method: string) => Object.keys(doc.paths[path][method].responses).sort();
    // 400, 408, 413, 417 and 431 on every operation: they are answered before any route runs (408 and 413 also while a body is read).
    assert.deepEqual(statuses('/_internal/v1/trigger_codegen', 'post'), ['200', '400', '401', '403', '408', '413', '415', '417', '429', '431', '500', '503']);
    assert.deepEqual(statuses('/api/bridge/v1/available-providers/{provider_controller_type_id}/available-credentials/{credential_controller_type_id}/credential/resource-server', 'post'),
      ['201', '400', '401', '403', '404', '408', '409', '413', '415', '417', '429', '431', '500', '502', '503']);
    // A GET refuses a body too (400, 413, 415: its own test below).
    assert.deepEqual(statuses('/_internal/v1/health', 'get'), ['200', '400', '408', '413', '415', '417', '431']);
    // The seed's list-contexts answers: 500 among its errors; no 404, which a list never answers.
    assert.deepEqual(statuses('/api/task/v1/context', 'get'), ['200', '400', '401', '403', '408', '413', '415', '417', '429', '431', '500', '503']);
    for (const list of ['/api/task/v1', '/api/task/v1/context/{context_id}/task', '/api/secret/v1', '/api/encryption/v1/envelope']) {
      assert.ok(!statuses(list, 'get').includes('404'), list);
    }
    // A DEK under an AWS KMS envelope key that KMS fails to wrap or unwrap: 502 (encryption-api.test.ts).
    for (const [path, method] of [['/api/encryption/v1/envelope/{envelope_id}/dek/{dek_id}/migrate', 'post'], ['/api/encryption/v1/envelope/{envelope_id}/migrate', 'post'],
      ['/api/bridge/v1/available-providers/{provider_controller_type_id}/available-credentials/{credential_controller_type_id}/credential/user-credential/broker', 'post'],
      ['/api/secret/v1', 'post'], ['/api/secret/v1/{secret_id}', 'put'], ['/api/secret/v1/list-decrypted', 'get']]) {
      assert.ok(statuses(path, method).includes('502'), `${method} ${path}`);
    }
    // Starting a rotation only queues its job: the new DEK is made by the worker.
    assert.ok(!statuses('/api/encryption/v1/dek/alias/{alias}/rotate', 'post').includes('502'));
    // The seed's list-contexts query: page_size a required int64, next_page_token an optional string.
    const params = Object.fromEntries(doc.paths['/api/task/v1/context'].get.parameters.map((p: any) => [p.name, p]));
    assert.deepEqual([params.page_size.required, params.page_size.schema.type, params.page_size.schema.format], [true, 'integer', 'int64']);
    assert.deepEqual([params.next_page_token.required, params.next_page_token.schema.type], [false, 'string']);
    assert.equal(doc.paths['/api/secret/v1'].get.parameters.find((p: any) => p.name === 'page_size').schema.format, 'int64');
    // The OAuth callback, a GET, writes (the credential; the instance's states deleted): a lost race is its 409.
    // Its 200 is only ever the credential stored (or a 303).
    assert.deepEqual(statuses('/api/bridge/v1/generic-oauth-callback', 'get'), ['200', '303', '400', '404', '405', '408', '409', '410', '413', '415', '417', '431', '500', '502', '503']);
    assert.deepEqual(doc.paths['/api/bridge/v1/generic-oauth-callback'].get.responses['200'].content['application/json'].schema, { $ref: '#/components/schemas/BrokeredUserCredential' });
    // Its answers may hold a new credential: Cache-Control: no-store on all it answers itself (the
    // responses checker asserts a required header is there), optional on those given before routing.
    for (const [status, answer] of Object.entries<any>(doc.paths['/api/bridge/v1/generic-oauth-callback'].get.responses)) {
      assert.deepEqual([answer.headers['Cache-Control']?.schema, answer.headers['Cache-Control']?.required], [{ type: 'string', const: 'no-store' }, !['400', '408', '413', '417', '431'].includes(status)], status);
    }
    assert.equal(doc.paths['/api/bridge/v1/credential/{credential_id}'].get.responses['200'].headers['Cache-Control'], undefined, 'only where it is sent');
    // 409s that only races give are listed too: a task naming the context that retention is deleting
    // (README, Operating), a secret moving between aliases while written, a rotation's job id taken;
    // any write losing a race (a row it refers to deleted meanwhile): every operation that writes.
    assert.ok(statuses('/api/task/v1', 'post').includes('409'));
    assert.ok(statuses('/api/secret/v1/{secret_id}', 'put').includes('409'));
    assert.ok(statuses('/api/encryption/v1/dek/alias/{alias}/rotate', 'post').includes('409'));
    for (const { spec } of allRoutes) {
      const listed = statuses(spec.path.replace(/:([A-Za-z0-9_]+)/g, '{$1}'), spec.method);
      for (const s of ['400', '408', '413', '417', '431']) assert.ok(listed.includes(s), `${spec.operationId} does not list ${s}`);
      if (spec.method !== 'get' && !spec.ownBody && !spec.readOnly) assert.ok(listed.includes('409'), `${spec.operationId} writes but does not list 409`);
    }
    // The headers those statuses always carry, wherever they are listed.
    for (const [p, ops] of Object.entries<any>(doc.paths)) {
      for (const [method, op] of Object.entries<any>(ops)) {
        for (const [status, header] of [['405', 'Allow'], ['429', 'Retry-After'], ['503', 'Retry-After']]) {
          if (op.responses[status]) assert.equal(op.responses[status].headers?.[header]?.required, true, `${method} ${p} ${status}: ${header}`);
        }
      }
    }
    // Sending a message has two success codes; each says what it means (a 200 is a retry, README).
    const sent = doc.paths['/api/task/v1/{task_id}/message'].post.responses;
    assert.equal(sent['201'].description, 'The message is stored');
    assert.match(sent['200'].description, /^A retry: /);
    assert.equal(doc.paths['/api/task/v1/{task_id}'].get.responses['200'].description, 'Success');
    // Only a body whose members are all optional may be left out.
    assert.equal(doc.paths['/api/encryption/v1/envelope/{envelope_id}/dek'].post.requestBody.required, false);
    assert.equal(doc.paths['/api/task/v1'].post.requestBody.required, true);
    const documented = Object.values(doc.paths).reduce((n: number, p: any) => n + Object.keys(p).length, 0);
    assert.equal(documented, allRoutes.length, 'no operation the API does not mount');
  });

  it("declares the seed's tags with their purposes, and every tag an operation carries", () => {
    const declared = new Map<string, string>(doc.tags?.map((t: any) => [t.name, t.description]));
    // The seed's "What the service does" table.
    for (const [name, purpose] of [['task', /tasks and their messages/], ['secret', /secrets/], ['encryption', /envelope encryption keys/],
      ['bridge', /providers/], ['a2a', /Agent-to-agent/], ['_internal', /Health checks/], ['v1', /version-1 endpoints/]] as const) {
      assert.match(declared.get(name) ?? '', purpose, name);
    }
    for (const [p, ops] of Object.entries<any>(doc.paths)) {
      for (const [method, op] of Object.entries<any>(ops)) for (const t of op.tags) assert.ok(declared.has(t), `${method} ${p}: tag ${t} not declared`);
    }
  });

  it("names the seed's resources as components, where operations refer to them", () => {
    for (const name of ['Error', 'ContextInfo', 'ContextInfoPaginatedResponse', 'Secret', 'Task', 'Message', 'MessagePart', 'TimelineItem', 'ProviderInstance',
      'FunctionInstance', 'FunctionController', 'CredentialController', 'ProviderController', 'Credential', 'BrokerState']) {
      assert.ok(doc.components.schemas[name], `components.schemas.${name}`);
    }
    assert.deepEqual(doc.paths['/api/task/v1/context'].get.responses['200'].content['application/json'].schema, { $ref: '#/components/schemas/ContextInfoPaginatedResponse' });
    assert.deepEqual(doc.components.schemas.Message.properties.parts.items, { $ref: '#/components/schemas/MessagePart' });
  });

  it('the Error body is what the service writes: data always, data.code one of its codes, data.errors its field errors', () => {
    const { compile } = validators();
    const error = compile(doc.components.schemas.Error);
    assert.ok(error({ message: 'm', data: { code: 'not_found', resource: 'task', id: 'x' } }));
    assert.ok(error({ message: 'm', data: { code: 'invalid_request', errors: [{ path: 'body.name', message: 'must not be blank' }] } }));
    assert.ok(!error({ message: 'm' }), 'an Error body without data');
    assert.ok(!error({ message: 'm', data: { code: 'no_such_code' } }), 'a code the service never sends');
    assert.ok(!error({ message: 'm', data: { code: 'invalid_request', errors: [{ path: 'body.name' }] } }), 'a field error without its message');
    assert.deepEqual(doc.components.schemas.Error.properties.data.properties.code.enum, [...ERROR_CODES]);
  });

  it('lists every decrypt_error code list-decrypted answers, kms_key_unusable (a disabled or deleted KMS key) among them', () => {
    assert.deepEqual(doc.components.schemas.DecryptedSecret.properties.decrypt_error.properties.code,
      { anyOf: ['value_does_not_decrypt', 'dek_does_not_unwrap', 'envelope_key_unusable', 'kms_key_unusable'].map((c) => ({ type: 'string', const: c })) });
  });

  it('every $ref points at a component that exists', () => {
    const refs = JSON.stringify(doc).match(/"\$ref":"[^"]+"/g) ?? [];
    assert.ok(refs.length > 0);
    for (const ref of new Set(refs)) {
      const name = /#\/components\/schemas\/(.+)"$/.exec(ref)?.[1];
      assert.ok(name && doc.components.schemas[name], `dangling ${ref}`);
    }
  });

  const validators = () => documentValidators(doc);

  it('task responses and errors follow the documented schemas', async () => {
    const { ajv, compile } = validators();
    const check = (r: Response, path: string, method: string) => {
      const schema = doc.paths[path][method].responses[String(r.status)]?.content?.['application/json']?.schema;
      assert.ok(schema, `${method} ${path} does not document status ${r.status}`);
      const validate = compile(schema);
      assert.ok(validate(r.body), `${method} ${path} ${r.status}: ${ajv.errorsText(validate.errors)}\n${r.text}`);
    };
    const c = stack.client;
    const created = await c.post('/api/task/v1', { message: { role: 'user', parts: [{ type: 'text-part', text: 'a' }, { type: 'data-part', data: { x: 1 } }, { type: 'file-part', file: { uri: 'https://example.com/f' } }] } });
    check(created, '/api/task/v1', 'post');
    const id = created.body.task.id;
    await c.put(`/api/task/v1/${id}`, { status: 'working', message: textMessage('working', 'agent') });
    check(await c.post(`/api/task/v1/${id}/message`, textMessage('more')), '/api/task/v1/{task_id}/message', 'post');
    check(await c.get(`/api/task/v1/${id}`), '/api/task/v1/{task_id}', 'get');
    check(await c.get(`/api/task/v1/${id}/timeline`), '/api/task/v1/{task_id}/timeline', 'get');
    check(await c.get(`/api/task/v1/${id}/message`), '/api/task/v1/{task_id}/message', 'get');
    check(await c.get('/api/task/v1?page_size=1'), '/api/task/v1', 'get');
    check(await c.get('/api/task/v1/context?page_size=5'), '/api/task/v1/context', 'get');
    check(await c.put(`/api/task/v1/${id}`, { status: 'completed' }), '/api/task/v1/{task_id}', 'put');
    check(await c.put(`/api/task/v1/${id}`, { status: 'working' }), '/api/task/v1/{task_id}', 'put');
    check(await c.get('/api/task/v1/00000000-0000-4000-8000-000000000000'), '/api/task/v1/{task_id}', 'get');
    check(await c.get('/api/task/v1/context'), '/api/task/v1/context', 'get');
    check(await c.as('').get('/api/task/v1'), '/api/task/v1', 'get');
    check(await c.post('/api/auth/v1/api-key', { name: 'doc', scopes: ['task:read'] }), '/api/auth/v1/api-key', 'post');
    check(await c.get('/api/auth/v1/api-key'), '/api/auth/v1/api-key', 'get');
    check(await c.get('/_internal/v1/ready'), '/_internal/v1/ready', 'get');
  });

  const checker = () => responseChecker(doc, stack.client);

  // node:http, for what fetch will not send: a body with a GET, an Expect header; with `unfinished`, a
  // body whose end never comes (send a Content-Length over it).
  const send = (method: string, url: string, headers: Record<string, string>, body = '', { unfinished = false } = {}) => new Promise<Response>((resolve, reject) => {
    const req = http.request(new URL(url, stack.api.url), { method: method.toUpperCase(), headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-length': String(Buffer.byteLength(body)), ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (c) => (text += c)).on('end', () => {
        const got = new Headers(Object.entries(res.headers).map(([k, v]) => [k, String(v)]));
        resolve({ status: res.statusCode!, headers: got, text, body: text ? JSON.parse(text) : undefined });
      });
    });
    req.on('error', reject);
    if (unfinished) req.write(body);
    else req.end(body);
  });

  // The answer to bytes written on a raw socket (for what no HTTP client sends: malformed HTTP), read
  // until the server closes the connection.
  const raw = (text: string) => new Promise<Response>((resolve, reject) => {
    const socket = net.connect(Number(new URL(stack.api.url).port), '127.0.0.1', () => socket.write(text));
    const chunks: Buffer[] = [];
    socket.on('data', (b: Buffer) => chunks.push(b));
    socket.on('error', reject);
    socket.on('close', () => {
      const answer = Buffer.concat(chunks).toString('utf8');
      const [head, body = ''] = answer.split('\r\n\r\n');
      const [statusLine, ...lines] = head.split('\r\n');
      const headers = new Headers(lines.map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1).trim()]));
      resolve({ status: Number(statusLine.split(' ')[1]), headers, text: body, body: body ? JSON.parse(body) : undefined });
    });
  });

  it('a body where the operation takes none: the 400, 413 and 415 it answers are documented on every operation that reads one', async () => {
    // mount (api/route.ts) reads the body of every route but those that read their own.
    for (const { spec } of allRoutes) {
      const statuses = Object.keys(doc.paths[spec.path.replace(/:([A-Za-z0-9_]+)/g, '{$1}')][spec.method].responses);
      if (!spec.ownBody) for (const s of ['400', '413', '415']) assert.ok(statuses.includes(s), `${spec.operationId} does not list ${s}`);
    }
    const { check, call } = checker();
    const secret = await call('post', '/api/secret/v1', { key: `doc-${randomUUID()}`, raw_value: 'v' });
    assert.equal(secret.status, 201, secret.text);
    const big = JSON.stringify({ pad: 'x'.repeat(Number(stack.env.BODY_LIMIT_BYTES ?? 1 << 20)) });
    for (const [method, url] of [['get', '/_internal/v1/health'], ['get', '/api/openapi.json'], ['get', '/api/task/v1/context?page_size=1'],
      ['delete', `/api/secret/v1/${secret.body.id}`], ['delete', '/api/encryption/v1/envelope/none.key'], ['get', '/.well-known/agent-card.json']]) {
      for (const [type, body, status] of [['text/plain', 'not json', 415], ['application/json', '{"x":1}', 400], ['application/json', big, 413]] as const) {
        const r = await send(method, url, { 'content-type': type }, body);
        assert.equal(r.status, status, `${method} ${url}: ${r.text}`);
        check(r, method, url);
      }
    }
    // A compressed body is 415 saying what is taken (Accept-Encoding), on a route's body as on a JSON-RPC endpoint's;
    // a request's own X-Request-Id is echoed.
    for (const [method, url, body] of [['get', '/api/task/v1/context?page_size=1', '{}'], ['post', '/api/task/v1', JSON.stringify({ message: textMessage('gz') })], ['post', '/api/a2a/v1', '{}'], ['post', '/api/bridge/v1/mcp', '{}']]) {
      const r = await send(method, url, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'x-request-id': 'doc-gz.1' }, body);
      assert.equal(r.status, 415, `${method} ${url}: ${r.text}`);
      assert.equal(r.headers.get('accept-encoding'), 'identity');
      assert.equal(r.headers.get('x-request-id'), 'doc-gz.1');
      check(r, method, url);
    }
  });

  it('answers given before or around the routes are documented with their headers: 431, 417, 408, 405 with Allow, 503 with Retry-After, a race\'s 409', async () => {
    const { check, call, seen } = checker();
    // Answered by api/client-errors.ts before any route.
    const big = await stack.client.request('GET', '/api/task/v1', undefined, { headers: { 'x-pad': 'x'.repeat(20_000) } });
    assert.equal(big.status, 431, big.text);
    check(big, 'get', '/api/task/v1');
    const expect = await send('post', '/api/task/v1', { 'content-type': 'application/json', expect: 'bogus' }, JSON.stringify({ message: textMessage('expect') }));
    assert.equal(expect.status, 417, expect.text);
    check(expect, 'post', '/api/task/v1');
    // Not valid HTTP (a header name with a space), on an endpoint whose own errors are JSON-RPC's: 400.
    const malformed = await raw(`POST /api/a2a/v1 HTTP/1.1\r\nHost: x\r\nBad Header: v\r\nContent-Length: 2\r\n\r\n{}`);
    assert.equal(malformed.status, 400, malformed.text);
    check(malformed, 'post', '/api/a2a/v1');
    // Chunk extensions over Node's limit, while the MCP endpoint reads its body: 413.
    const extended = await raw(`POST /api/bridge/v1/mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1;x=${'a'.repeat(20_000)}\r\n{\r\n`);
    assert.equal(extended.status, 413, extended.text);
    check(extended, 'post', '/api/bridge/v1/mcp');
    // A body not arrived within API_REQUEST_TIMEOUT_MS: 408, with the request's own X-Request-Id.
    const slow = await send('post', '/api/task/v1', { 'content-type': 'application/json', 'content-length': '100', 'x-request-id': 'doc-slow.1' }, '{"message":', { unfinished: true });
    assert.equal(slow.status, 408, slow.text);
    assert.equal(slow.headers.get('x-request-id'), 'doc-slow.1');
    check(slow, 'post', '/api/task/v1');
    // The OAuth callback refuses HEAD (it would redeem the state): 405 naming the methods it takes.
    const head = await stack.client.request('HEAD', '/api/bridge/v1/generic-oauth-callback?state=s&code=c');
    assert.equal(head.status, 405);
    assert.equal(head.headers.get('allow'), 'GET');
    assert.ok(doc.paths['/api/bridge/v1/generic-oauth-callback'].get.responses['405'].headers.Allow, 'the 405 documents Allow');
    assert.equal(head.headers.get('cache-control'), 'no-store');
    // Not ready: this process can read no local envelope key file.
    const keysDir = path.join(stack.env.DATA_DIR, 'keys');
    const files = fs.readdirSync(keysDir);
    for (const f of files) fs.renameSync(path.join(keysDir, f), path.join(keysDir, `${f}.away`));
    try {
      // A check's outcome is reused for a second: a probe just before may still be answered.
      const down = await waitFor(async () => {
        const r = await call('get', '/_internal/v1/ready');
        return r.status !== 200 && r;
      }, 'a check without the key files');
      assert.equal(down.status, 503, down.text);
      assert.equal(down.headers.get('retry-after'), '5');
    } finally {
      for (const f of files) fs.renameSync(path.join(keysDir, `${f}.away`), path.join(keysDir, f));
    }
    // A write losing a race: the DEK an alias is pointed at is deleted while the update waits on it.
    const E = '/api/encryption/v1';
    const file = `doc-${randomUUID()}.key`;
    await call('post', `${E}/envelope`, { type: 'local', file_name: file });
    const [first, doomed] = [(await call('post', `${E}/envelope/${file}/dek`, {})).body, (await call('post', `${E}/envelope/${file}/dek`, {})).body];
    const alias = `doc-${randomUUID()}`;
    await call('post', `${E}/dek/alias`, { dek_id: first.id, alias });
    const deleter = await testDb().transaction();
    let raced: Promise<Response>;
    try {
      await deleter('deks').where({ id: doomed.id }).delete();
      raced = stack.client.put(`${E}/dek/alias/${alias}`, { new_dek_id: doomed.id });
      await waitFor(async () => {
        const { rows } = await testDb().raw(`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and pid <> pg_backend_pid()`);
        return rows[0].n >= 1;
      }, 'the alias update to wait for the deleted DEK');
      await deleter.commit();
    } finally {
      if (!deleter.isCompleted()) await deleter.rollback();
    }
    const lost = await raced!;
    assert.equal(lost.status, 409, lost.text);
    check(lost, 'put', `${E}/dek/alias/${alias}`);
    for (const expected of ['list-tasks 431', 'a2a-jsonrpc 400', 'bridge-mcp 413', 'create-task 417', 'create-task 408', 'ready 503', 'update-dek-alias 409']) assert.ok(seen.has(expected), `not exercised: ${expected} (${[...seen].join(', ')})`);
  });

  it('secret and encryption responses, and their errors, follow the documented schemas', async () => {
    const { call, seen } = checker();
    const E = '/api/encryption/v1';
    const [file, target] = [`doc-${randomUUID()}.key`, `doc-${randomUUID()}.key`];
    await call('post', `${E}/envelope`, { type: 'local', file_name: file });
    await call('post', `${E}/envelope`, { type: 'local', file_name: target });
    await call('post', `${E}/envelope`, { type: 'local', file_name: file }); // 409
    await call('get', `${E}/envelope`);
    await call('get', `${E}/envelope/${file}`);
    await call('get', `${E}/envelope/missing.key`);
    const dek = (await call('post', `${E}/envelope/${file}/dek`, {})).body;
    await call('post', `${E}/envelope/${file}/dek`, { id: dek.id }); // 409
    await call('get', `${E}/envelope/${file}/dek`);
    const alias = `doc-${randomUUID()}`;
    await call('post', `${E}/dek/alias`, { dek_id: dek.id, alias });
    await call('get', `${E}/dek/alias/${alias}`);
    const other = (await call('post', `${E}/envelope/${file}/dek`, {})).body;
    await call('put', `${E}/dek/alias/${alias}`, { new_dek_id: other.id });
    await call('post', `${E}/envelope/${file}/dek/${dek.id}/migrate`, { to_envelope_encryption_key_id: file }); // 400: same envelope
    await call('post', `${E}/envelope/${file}/dek/${dek.id}/migrate`, { to_envelope_encryption_key_id: target });
    const job = await call('post', `${E}/envelope/${file}/migrate`, { to_envelope_encryption_key_id: target });
    await call('get', `${E}/job/${job.body.id}`);
    await call('post', `${E}/job/${job.body.id}/cancel`);
    await call('get', `${E}/job/${randomUUID()}`);

    const S = '/api/secret/v1';
    const key = `doc/${randomUUID()}`;
    const secret = (await call('post', S, { key, raw_value: 'value', dek_alias: alias })).body;
    await call('post', S, { key, raw_value: 'value' }); // 409
    await call('post', S, { key: `${key}-x`, raw_value: 'value', dek_alias: 'no-such-alias' }); // 404
    await call('post', `${S}/import`, { key: `${key}-imported`, encrypted_value: secret.encrypted_secret, dek_alias: alias });
    await call('get', `${S}?page_size=1`);
    await call('get', `${S}/list-decrypted?page_size=1`);
    await call('get', `${S}/key/${encodeURIComponent(key)}`);
    await call('get', `${S}/${secret.id}`);
    await call('put', `${S}/${secret.id}`, { raw_value: 'other' });
    await call('put', `${S}/${secret.id}`, { raw_value: 'other', extra: 1 }); // 400
    await call('delete', `${E}/dek/alias/${alias}`); // 409: secrets use it
    await call('get', `${S}/not-a-uuid`);
    await call('delete', `${S}/${secret.id}`);
    await call('delete', `${S}/${secret.id}`); // 404
    await call('get', S, undefined, undefined, stack.client.as('')); // 401
    const reader = (await call('post', '/api/auth/v1/api-key', { name: 'doc-reader', scopes: ['task:read'] })).body;
    await call('get', S, undefined, undefined, stack.client.as(reader.key)); // 403
    await call('delete', `/api/auth/v1/api-key/${reader.id}`);
    await call('get', '/_internal/v1/runtime_config');
    await call('get', '/_internal/v1/queues');
    await call('get', '/api/a2a/v1/definition');
    await call('get', '/api/a2a/v1/agent/authenticatedExtendedCard');
    await call('get', '/api/bridge/v1/available-providers');
    await call('get', '/api/bridge/v1/provider');
    await call('get', '/api/bridge/v1/provider/grouped-by-function');
    await call('get', '/api/bridge/v1/function-instances');
    await call('get', '/api/bridge/v1/credential');
    for (const expected of ['create-envelope-key 409', 'get-envelope-key 404', 'create-dek 409', 'migrate-dek 400', 'migrate-dek 200', 'migrate-all-deks 202',
      'create-secret 404', 'update-secret 400', 'delete-dek-alias 409', 'delete-secret 404', 'list-secrets 401', 'list-secrets 403']) {
      assert.ok(seen.has(expected), `not exercised: ${expected} (${[...seen].join(', ')})`);
    }
  });

  it('describes the JSON-RPC endpoints: the request bodies they read, and A2A answering JSON or an event stream', async () => {
    const { ajv, compile } = validators();
    const a2a = doc.paths['/api/a2a/v1'].post;
    const mcp = doc.paths['/api/bridge/v1/mcp'].post;
    for (const op of [a2a, mcp]) {
      assert.deepEqual(Object.keys(op.requestBody?.content ?? {}), ['application/json'], op.operationId);
      assert.equal(op.requestBody.required, true, op.operationId);
    }
    // A2A refuses a body with JSON-RPC errors, HTTP 200: its only 400 is Node's, to a request that is not valid HTTP.
    assert.deepEqual(a2a.responses['400'].content['application/json'].schema, { $ref: '#/components/schemas/Error' });
    assert.deepEqual(Object.keys(a2a.responses['200'].content), ['application/json', 'text/event-stream']);
    assert.equal(a2a.responses['200'].content['text/event-stream'].schema.type, 'string');
    // Every method dispatch serves, each with its params.
    const methods = doc.components.schemas.A2ARequest.anyOf.map((b: any) => b.properties.method.const);
    assert.deepEqual(methods, ['message/send', 'message/stream', 'tasks/get', 'tasks/cancel', 'tasks/resubscribe', 'tasks/pushNotificationConfig/set',
      'tasks/pushNotificationConfig/get', 'tasks/pushNotificationConfig/list', 'tasks/pushNotificationConfig/delete', 'agent/getAuthenticatedExtendedCard']);

    // Requests built from the documented schema are taken, and answered as documented.
    const a2aRequest = compile(a2a.requestBody.content['application/json'].schema);
    const a2aAnswer = compile(a2a.responses['200'].content['application/json'].schema);
    const valid = (validate: ReturnType<typeof compile>, value: unknown) => assert.ok(validate(value), `${ajv.errorsText(validate.errors)}\n${JSON.stringify(value)}`);
    const message = { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text: 'documented' }] };
    const sendMessage = { jsonrpc: '2.0', id: 'doc-1', method: 'message/send', params: { message, configuration: { blocking: false } } };
    valid(a2aRequest, sendMessage);
    assert.ok(!a2aRequest({ ...sendMessage, method: 'message/sned' }), 'an unknown method');
    assert.ok(!a2aRequest({ ...sendMessage, params: { message: { ...message, parts: [] } } }), 'params the method refuses');
    assert.ok(!a2aRequest({ ...sendMessage, id: 2 ** 53 }), 'an id that cannot be echoed');
    valid(a2aRequest, { jsonrpc: '2.0', id: 3, method: 'agent/getAuthenticatedExtendedCard' });
    const sent = await stack.client.post('/api/a2a/v1', sendMessage);
    assert.equal(sent.status, 200, sent.text);
    assert.match(sent.headers.get('content-type') ?? '', /^application\/json/);
    valid(a2aAnswer, sent.body);
    assert.equal(sent.body.result.kind, 'task', sent.text);
    const taskId = sent.body.result.id;
    const cancel = { jsonrpc: '2.0', id: 4, method: 'tasks/cancel', params: { id: taskId } };
    valid(a2aRequest, cancel);
    const canceled = await stack.client.post('/api/a2a/v1', cancel);
    valid(a2aAnswer, canceled.body);
    assert.equal(canceled.body.result.status.state, 'canceled', canceled.text);
    // A stream: each data: line is a documented JSON-RPC response (a terminal task's: the task, then its final status).
    const resubscribe = { jsonrpc: '2.0', id: 5, method: 'tasks/resubscribe', params: { id: taskId } };
    valid(a2aRequest, resubscribe);
    const streamed = await stack.client.request('POST', '/api/a2a/v1', resubscribe, { headers: { accept: 'text/event-stream' } });
    assert.equal(streamed.status, 200);
    assert.ok(Object.keys(a2a.responses['200'].content).includes(streamed.headers.get('content-type')?.split(';')[0] ?? ''), streamed.headers.get('content-type') ?? '');
    const events = streamed.text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
    assert.deepEqual(events.map((e) => e.result?.kind), ['task', 'status-update'], streamed.text);
    for (const e of events) valid(a2aAnswer, e);

    // The seed's description of the MCP endpoint's 200.
    assert.equal(mcp.responses['200'].description, 'MCP server running');
    const mcpRequest = compile(mcp.requestBody.content['application/json'].schema);
    const mcpAnswer = compile(mcp.responses['200'].content['application/json'].schema);
    const list = { jsonrpc: '2.0', id: 1, method: 'tools/list' };
    const batch = [{ ...list, id: 'a' }, { jsonrpc: '2.0', id: 'b', method: 'ping' }];
    valid(mcpRequest, list);
    valid(mcpRequest, batch);
    assert.ok(!mcpRequest({ ...list, id: null }), 'MCP ids are never null');
    assert.ok(!mcpRequest([]), 'an empty batch');
    for (const body of [list, batch]) {
      const r = await stack.client.request('POST', '/api/bridge/v1/mcp', body, { headers: { accept: 'application/json, text/event-stream' } });
      assert.equal(r.status, 200, r.text);
      valid(mcpAnswer, r.body);
      assert.ok(!JSON.stringify(r.body).includes('"error"'), r.text);
    }
    // Its 403s: an Origin not allowed (a JSON-RPC error, before the key is read), a key without the scope (Error).
    const { call } = checker();
    assert.match(mcp.responses['403'].description, /Origin is not allowed/);
    for (const client of [stack.client, stack.client.as('')]) {
      const foreign = await call('post', '/api/bridge/v1/mcp', list, { headers: { origin: 'https://evil.example' } }, client);
      assert.deepEqual([foreign.status, foreign.body.error?.code, foreign.body.id], [403, -32000, null], foreign.text);
    }
    const reader = (await stack.client.post('/api/auth/v1/api-key', { name: 'doc mcp', scopes: ['bridge:read'] })).body.key;
    const scope = await call('post', '/api/bridge/v1/mcp', list, {}, stack.client.as(reader));
    assert.deepEqual([scope.status, scope.body.data?.code], [403, 'forbidden'], scope.text);

    // Its refusals, each of the shape listed for its status: no free-form object (one takes {}).
    const { check } = checker();
    for (const status of ['400', '403', '406', '415']) {
      assert.ok(!compile(mcp.responses[status].content['application/json'].schema)({}), `MCP ${status} is documented as a free-form object`);
    }
    const refusals: [number, number | string, Record<string, string>, string][] = [
      [400, -32700, {}, '{"jsonrpc": "2.0", "id": 1, "method": '],
      [400, -32600, {}, '{"jsonrpc": "1.0", "id": 7, "method": "ping"}'],
      [400, -32000, { 'mcp-protocol-version': '1999-01-01' }, JSON.stringify(list)],
      [406, -32000, { accept: 'text/html' }, JSON.stringify(list)],
      [415, 'unsupported_media_type', { 'content-type': 'text/plain' }, JSON.stringify(list)],
    ];
    for (const [status, code, headers, body] of refusals) {
      const r = await send('post', '/api/bridge/v1/mcp', { 'content-type': 'application/json', accept: 'application/json', ...headers }, body);
      assert.deepEqual([r.status, r.body.error?.code ?? r.body.data?.code], [status, code], r.text);
      check(r, 'post', '/api/bridge/v1/mcp');
    }
  });
});

describe('OpenAPI document: a 429 carries the Retry-After it documents', () => {
  const stack = useStack({ RATE_LIMIT_PER_SECOND: '1' }, { workers: 0 });

  it('a request past RATE_LIMIT_PER_SECOND: 429 with Retry-After, both listed on the operation', async () => {
    const doc = (await stack.client.as('').get('/api/openapi.json')).body;
    const answer = await waitFor(async () => {
      const r = await stack.client.get('/api/task/v1');
      return r.status === 429 && r;
    }, 'a 429');
    const documented = doc.paths['/api/task/v1'].get.responses['429'];
    assert.ok(documented, 'list-tasks lists 429');
    assert.equal(documented.headers['Retry-After'].required, true);
    assert.match(answer.headers.get('retry-after') ?? '', new RegExp(documented.headers['Retry-After'].schema.pattern));
    assert.equal(answer.body.data.code, 'rate_limited');
  });
});

describe('OpenAPI document: bridge, encryption, task and internal answers follow the documented schemas', () => {
  const CLIENT_SECRET = `cs-${randomUUID()}`;
  let all: OAuthStack | undefined;
  // A real OAuth server for the callback, a fake Gmail for invoking a function; one stream per key,
  // so that a second stream is refused.
  const stack = useStarted(async () => (all = await startOAuthStack(CLIENT_SECRET, { A2A_STREAMS_PER_KEY: '1' }, { workers: 0 })).stack, async () => all?.stop());
  let doc: any;
  before(async () => {
    doc = (await stack.client.as('').get('/api/openapi.json')).body;
  });
  // The callback as the user's browser follows it, its 303 not followed.
  const callback = async (url: string): Promise<Response> => {
    const r = await fetch(url, { redirect: 'manual' });
    const text = await r.text();
    return { status: r.status, headers: r.headers, text, body: r.headers.get('content-type')?.startsWith('application/json') ? JSON.parse(text) : text };
  };

  it('credentials, provider instances, functions and the OAuth callback (200 and 303), lists with items', async () => {
    const { call, check, seen } = responseChecker(doc, stack.client);
    const B = '/api/bridge/v1';
    const mail = `${B}/available-providers/google_mail/available-credentials/oauth_auth_flow`;
    const callbackUrl = `${stack.api.url}${B}/generic-oauth-callback`;
    const rs = (await call('post', `${mail}/credential/resource-server`, { value: { client_id: 'doc-client', client_secret: CLIENT_SECRET, redirect_uri: callbackUrl } })).body;
    const user = (await call('post', `${mail}/credential/user-credential`, { value: { access_token: 'at-doc', refresh_token: 'rt-doc', expiry_time: '2099-01-01T00:00:00Z' } })).body;
    await call('get', `${B}/credential/${rs.id}`);
    await call('post', mail, { provider_instance_id: 'doc-mail', display_name: 'Doc mail', resource_server_credential_id: rs.id, user_credential_id: user.id });
    await call('post', mail, { provider_instance_id: 'doc-back', display_name: 'Doc back', resource_server_credential_id: rs.id, return_on_successful_brokering: { type: 'url', url: 'https://example.com/done' } });
    await call('get', `${B}/provider/doc-mail`);
    await call('patch', `${B}/provider/doc-mail`, { display_name: 'Doc mail renamed' });
    await call('post', `${B}/provider/doc-mail/function/google_mail_send_email/enable`, {});
    await call('post', `${B}/provider/doc-mail/function/google_mail_send_email/invoke`, { params: { to: 'a@example.com', subject: 'doc', body: 'hello' } });
    // Lists with an item of each kind.
    await call('get', `${B}/provider`);
    await call('get', `${B}/provider/grouped-by-function`);
    await call('get', `${B}/function-instances`);
    await call('get', `${B}/function-instances/openapi.json`);
    await call('get', `${B}/credential`);
    // Exported as the definition has them, imported again under new ids.
    const exported = (await call('get', '/api/a2a/v1/definition')).body.providers.find((p: { id: string }) => p.id === 'doc-mail');
    await call('post', `${mail}/credential/resource-server/import`, { value: exported.resource_server_credential.value });
    await call('post', `${mail}/credential/user-credential/import`, { value: exported.user_credential.value });
    await call('post', `${B}/provider/doc-mail/function/google_mail_send_email/disable`, {});
    // The OAuth callback: the credential (200), then a 303 to return_on_successful_brokering.
    for (const id of ['doc-mail', 'doc-back']) {
      const state = (await call('post', `${mail}/credential/user-credential/broker`, { provider_instance_id: id })).body;
      const back = await consent(state.action.Redirect.url);
      check(await callback(back), 'get', back);
    }
    const unused = (await call('get', `${B}/credential?unused=true`)).body.items;
    await call('delete', `${B}/credential/${unused[0].id}`);
    await call('delete', `${B}/provider/doc-back`);
    for (const expected of ['create-resource-server-credential 201', 'create-user-credential 201', 'import-resource-server-credential 201', 'import-user-credential 201',
      'get-credential 200', 'delete-credential 200', 'create-provider-instance 201', 'get-provider-instance 200', 'update-provider-instance 200', 'delete-provider-instance 200',
      'enable-function 201', 'invoke-function 200', 'disable-function 200', 'function-instances-openapi 200', 'broker-user-credential 200',
      'generic-oauth-callback 200', 'generic-oauth-callback 303']) {
      assert.ok(seen.has(expected), `not exercised: ${expected} (${[...seen].join(', ')})`);
    }
  });

  it('A2A message/stream: an event stream whose every data: line is a documented JSON-RPC response; one past the key\'s streams a documented 429', async () => {
    const { call, check } = responseChecker(doc, stack.client);
    const { ajv, compile } = documentValidators(doc);
    const answer = compile(doc.paths['/api/a2a/v1'].post.responses['200'].content['application/json'].schema);
    const message = { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text: 'streamed' }] };
    const res = await fetch(`${stack.api.url}/api/a2a/v1`, {
      method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 'doc-stream', method: 'message/stream', params: { message } }),
    });
    // No worker runs the task: canceling it, once the first event names it, ends the stream.
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = '';
    while (!text.includes('\n\n')) {
      const { value, done } = await reader.read();
      assert.ok(!done, `the stream ended before its first event: ${text}`);
      text += value;
    }
    const taskId = JSON.parse(text.split('\n').find((l) => l.startsWith('data: '))!.slice(6)).result.id;
    // A2A_STREAMS_PER_KEY is 1: a second stream meanwhile is refused with 429 and Retry-After.
    const refused = await call('post', '/api/a2a/v1', { jsonrpc: '2.0', id: 'doc-stream-2', method: 'message/stream', params: { message: { ...message, messageId: randomUUID() } } });
    assert.equal(refused.status, 429, refused.text);
    assert.equal(refused.body.data.code, 'rate_limited');
    const canceled = await stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 'doc-cancel', method: 'tasks/cancel', params: { id: taskId } });
    assert.equal(canceled.body.result?.status.state, 'canceled', canceled.text);
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += chunk.value;
    check({ status: res.status, headers: res.headers, text, body: text }, 'post', '/api/a2a/v1');
    const events = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
    assert.deepEqual(events.map((e) => e.result?.kind), ['task', 'status-update'], text);
    for (const e of events) assert.ok(answer(e), `${ajv.errorsText(answer.errors)}\n${JSON.stringify(e)}`);
  });

  it('keys, tasks by context, code generation, metrics, health, this document and the agent cards', async () => {
    const { call, seen } = responseChecker(doc, stack.client);
    const E = '/api/encryption/v1';
    const file = `doc-${randomUUID()}.key`;
    await call('post', `${E}/envelope`, { type: 'local', file_name: file });
    const dek = (await call('post', `${E}/envelope/${file}/dek`, {})).body;
    await call('post', `${E}/envelope/${file}/dek/import`, { id: `doc-${randomUUID()}`, encrypted_data_encryption_key: dek.encrypted_data_encryption_key });
    const alias = `doc-${randomUUID()}`;
    await call('post', `${E}/dek/alias`, { dek_id: dek.id, alias });
    await call('post', `${E}/dek/alias/${alias}/rotate`);
    const empty = `doc-${randomUUID()}.key`;
    await call('post', `${E}/envelope`, { type: 'local', file_name: empty });
    await call('delete', `${E}/envelope/${empty}`);
    const task = (await call('post', '/api/task/v1', { message: textMessage('doc') })).body.task;
    await call('get', `/api/task/v1/context/${task.context_id}/task`);
    await call('post', '/_internal/v1/trigger_codegen');
    await call('get', '/metrics');
    await call('get', '/_internal/v1/health');
    await call('get', '/api/openapi.json');
    for (const card of ['/.well-known/agent-card.json', '/api/a2a/v1/.well-known/agent-card.json', '/api/a2a/v1/.well-known/agent.json']) await call('get', card);
    for (const expected of ['import-dek 201', 'rotate-dek-alias 202', 'delete-envelope-key 200', 'list-tasks-by-context 200', 'trigger-codegen 200', 'metrics 200',
      'health 200', 'openapi 200', 'agent-card 200', 'a2a-agent-card 200', 'a2a-agent-card-legacy 200']) {
      assert.ok(seen.has(expected), `not exercised: ${expected} (${[...seen].join(', ')})`);
    }
  });
});

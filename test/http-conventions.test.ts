// HTTP conventions of SPEC.md section 1, enforced in middleware for every route.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { ADMIN_KEY, assertError, Client, requestLogsThrough, startApi, testDb, textMessage, useStack, waitFor, type Response } from './helpers/stack.ts';
import { TASK_STATES } from '../domain/task-states.ts';

const LIMIT = 4096;


// A raw request, for what fetch will not send (chunked bodies, undecodable paths).
function raw(url: string, opts: { method: string; path: string; headers?: Record<string, string>; chunks?: string[] }): Promise<{ status: number; body: any; headers: http.IncomingHttpHeaders }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request({ hostname, port, method: opts.method, path: opts.path, headers: opts.headers }, (res) => {
      let text = '';
      res.on('data', (b) => { text += b; });
      res.on('end', () => resolve({ status: res.statusCode!, body: text ? JSON.parse(text) : undefined, headers: res.headers }));
    });
    req.on('error', reject);
    for (const c of opts.chunks ?? []) req.write(c);
    req.end();
  });
}

// What the server answers to bytes written as they are (what no HTTP client would send), read until it closes.
function rawExchange(url: string, text: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname, () => socket.write(text));
    let data = '';
    socket.on('data', (b) => (data += b.toString()));
    socket.on('end', () => resolve(data));
    socket.on('error', reject);
  });
}

describe('HTTP conventions', () => {
  const stack = useStack({ BODY_LIMIT_BYTES: String(LIMIT) }, { workers: 0 });
  const taskCount = async () => Number((await testDb()('tasks').count({ n: '*' }))[0].n);

  it('answers 415 for a body that is not application/json, storing nothing', async () => {
    const before = await taskCount();
    const body = JSON.stringify({ message: textMessage('x') });
    for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'application/jsonx']) {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': type }, raw: body });
      assertError(r, 415, 'unsupported_media_type');
    }
    // Without the header, or with it empty, the message says so (it said "got 'none'").
    const auth = { authorization: `Bearer ${stack.client.key}`, 'content-length': String(body.length) };
    for (const [headers, message] of [
      [auth, 'Content-Type must be application/json; the request has no Content-Type header'],
      [{ ...auth, 'content-type': '' }, 'Content-Type must be application/json; the request\'s Content-Type header is empty'],
      [{ ...auth, 'content-type': `text/${'x'.repeat(300)}` }, `Content-Type must be application/json, got 'text/${'x'.repeat(55)}… (305 characters)'`],
    ] as const) {
      const r = await raw(stack.api.url, { method: 'POST', path: '/api/task/v1', headers, chunks: [body] });
      assert.deepEqual([r.status, r.body], [415, { message, data: { code: 'unsupported_media_type' } }], JSON.stringify(headers).slice(0, 100));
    }
    assert.equal(await taskCount(), before);
  });

  it('answers 400 naming the missing body when a route needs one and none (or an empty one) is sent', async () => {
    const before = await taskCount();
    for (const headers of [{ 'content-type': 'application/json' }, { 'content-type': 'text/plain' }]) {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers, raw: '' });
      assertError(r, 400, 'invalid_request');
      assert.equal(r.body.message, 'A JSON request body is required');
    }
    const auth = { authorization: `Bearer ${stack.client.key}` };
    for (const headers of [auth, { ...auth, 'content-type': 'text/plain', 'transfer-encoding': 'chunked' }]) {
      const r = await raw(stack.api.url, { method: 'POST', path: '/api/task/v1', headers, chunks: [] });
      assert.equal(r.status, 400, JSON.stringify(headers));
      assert.equal(r.body.message, 'A JSON request body is required');
    }
    assert.equal(await taskCount(), before);
  });

  it('answers 415 for a body declared in a charset other than UTF-8, storing nothing (its text would be read as other text)', async () => {
    const before = await taskCount();
    // C3 A9: 'é' in UTF-8, 'Ã©' in ISO-8859-1; E9 alone: 'é' in windows-1252, no UTF-8 at all.
    for (const [type, bytes] of [['application/json; charset=iso-8859-1', [0xc3, 0xa9]], ['application/json;charset="Windows-1252"', [0xe9]], ['application/json; charset=utf-16', [0x41]]] as const) {
      const body = Buffer.concat([Buffer.from('{"message":{"role":"user","parts":[{"type":"text-part","text":"'), Buffer.from(bytes), Buffer.from('"}]}}')]);
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': type }, raw: body });
      assertError(r, 415, 'unsupported_media_type');
      assert.match(r.body.message, /^Content-Type charset must be utf-8 \(JSON is UTF-8\), got '(iso-8859-1|Windows-1252|utf-16)'$/);
    }
    for (const [type, shown] of [['application/json; charset="latin\t1"', 'latin\\t1'], [`application/json; charset=${'c'.repeat(300)}`, `${'c'.repeat(60)}… (300 characters)`]]) {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': type }, raw: JSON.stringify({ message: textMessage('x') }) });
      assertError(r, 415, 'unsupported_media_type');
      assert.equal(r.body.message, `Content-Type charset must be utf-8 (JSON is UTF-8), got '${shown}'`);
    }
    const secret = await stack.client.request('POST', '/api/secret/v1', undefined, { headers: { 'content-type': 'application/json; charset=latin1' }, raw: Buffer.from('{"key":"latin1","raw_value":"p\u00c3\u00a9ss"}', 'latin1') });
    assertError(secret, 415, 'unsupported_media_type');
    assert.equal((await stack.client.get('/api/secret/v1/key/latin1')).status, 404);
    assert.equal(await taskCount(), before);
  });

  it('accepts application/json with a charset and +json types', async () => {
    for (const type of ['application/json; charset=utf-8', 'application/json;charset="UTF-8"', 'application/json; charset=utf8', 'application/vnd.api+json']) {
      const r = await stack.client.request('POST', '/api/task/v1', { message: textMessage('typed') }, { headers: { 'content-type': type } });
      assert.equal(r.status, 201, `${type}: ${r.text}`);
    }
  });

  it('answers 413 for a body over BODY_LIMIT_BYTES, with or without Content-Length, storing nothing', async () => {
    const before = await taskCount();
    const big = { message: textMessage('x'.repeat(LIMIT)) };
    const r = await stack.client.post('/api/task/v1', big);
    assertError(r, 413, 'payload_too_large');
    assert.equal(r.body.data.limit, LIMIT);
    const chunked = await raw(stack.api.url, {
      method: 'POST', path: '/api/task/v1',
      headers: { authorization: `Bearer ${stack.client.key}`, 'content-type': 'application/json', 'transfer-encoding': 'chunked' },
      chunks: JSON.stringify(big).match(/.{1,1000}/g)!,
    });
    assert.equal(chunked.status, 413);
    assert.equal(chunked.body.data.code, 'payload_too_large');
    // Just under the limit is fine.
    const fits = await stack.client.post('/api/task/v1', { message: textMessage('y'.repeat(LIMIT - 200)) });
    assert.equal(fits.status, 201, fits.text);
    assert.equal(await taskCount(), before + 1);
  });

  it('answers 400 for a body that is not valid JSON or is JSON null', async () => {
    const before = await taskCount();
    for (const body of ['{"message":', '{message: 1}', 'nul', '\u0000', 'null', '"text"', '42']) {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': 'application/json' }, raw: body });
      assertError(r, 400, 'invalid_request');
    }
    assert.equal(await taskCount(), before);
  });

  it('answers requests the HTTP parser refuses with the Error body too (431 for oversized headers, 400 for malformed HTTP)', async () => {
    const big = await stack.client.request('GET', `/api/task/v1?pad=${'x'.repeat(20_000)}`);
    assert.equal(big.status, 431);
    assert.equal(big.body.data.code, 'invalid_request');
    assert.match(big.body.message, /headers exceed/);
    const raw = await rawExchange(stack.api.url, 'NOT HTTP AT ALL\r\n\r\n');
    assert.match(raw, /^HTTP\/1\.1 400 Bad Request\r\n/);
    assert.deepEqual(JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)), { message: 'The request is not valid HTTP', data: { code: 'invalid_request' } });
    // Section 1: every response carries X-Request-Id, these too, and the log line of each names it.
    const bigId = big.headers.get('x-request-id') ?? '';
    assert.match(bigId, /^[0-9a-f-]{36}$/);
    const rawId = /\r\nX-Request-Id: ([0-9a-f-]{36})\r\n/i.exec(raw)?.[1];
    assert.ok(rawId, raw);
    assert.notEqual(rawId, bigId);
    await waitFor(async () => [bigId, rawId].every((id) => stack.api.logs.some((l) => l.includes(`"req_id":"${id}"`))), 'the refused requests in the API log');
  });

  it('logs a client that hangs up mid-body as a 400 of its own, not as an outage or a fault, storing nothing', async () => {
    const before = await taskCount();
    const url = new URL(stack.api.url);
    const requestId = `hang-up-${Date.now()}`;
    await new Promise<void>((resolve, reject) => {
      const socket = net.connect(Number(url.port), url.hostname, () => {
        socket.write(`POST /api/task/v1 HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${ADMIN_KEY}\r\nContent-Type: application/json\r\n`
          + `Content-Length: 1000\r\nX-Request-Id: ${requestId}\r\n\r\n{"message":`);
        setTimeout(() => { socket.destroy(); resolve(); }, 200);
      });
      socket.on('error', reject);
    });
    const line = await waitFor(async () => stack.api.logs.find((l) => l.includes(`"req_id":"${requestId}"`) && l.includes('"msg":"request"')), 'the request line');
    assert.equal(JSON.parse(line).status, 400, line);
    const all = stack.api.logs.filter((l) => l.includes(`"req_id":"${requestId}"`));
    assert.ok(!all.some((l) => l.includes('"level":50') || l.includes('unavailable')), all.join('\n'));
    assert.equal(await taskCount(), before);
  });

  it('answers 400 for a body that is not UTF-8 instead of storing replacement characters', async () => {
    const before = await taskCount();
    const raw = Buffer.concat([Buffer.from('{"message":{"role":"user","parts":[{"type":"text-part","text":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}}')]);
    const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': 'application/json' }, raw });
    assertError(r, 400, 'invalid_request');
    assert.match(r.body.message, /not valid UTF-8/);
    assert.equal(await taskCount(), before);
  });

  it('answers 400 for a JSON null body where the body is optional, doing nothing (no body at all stands for {})', async () => {
    const dekCount = async () => Number((await testDb()('deks').count({ n: '*' }))[0].n);
    const envelope = (await stack.client.get('/api/encryption/v1/envelope?page_size=1')).body.items[0].id;
    const before = await dekCount();
    const refused = await stack.client.request('POST', `/api/encryption/v1/envelope/${envelope}/dek`, undefined, { headers: { 'content-type': 'application/json' }, raw: 'null' });
    assertError(refused, 400, 'invalid_request');
    assert.equal(await dekCount(), before);
    const created = await stack.client.request('POST', `/api/encryption/v1/envelope/${envelope}/dek`);
    assert.equal(created.status, 201, created.text);
    assert.equal(await dekCount(), before + 1);
  });

  it('refuses a body where the operation takes none (415 not JSON, 400 with members), doing nothing; {} and no body are fine', async () => {
    const secret = async (key: string) => {
      const r = await stack.client.post('/api/secret/v1', { key, raw_value: 'v' });
      assert.equal(r.status, 201, r.text);
      return r.body.id as string;
    };
    const exists = async (id: string) => (await stack.client.get(`/api/secret/v1/${id}`)).status === 200;
    const id = await secret('bodyless.one');
    const text = await stack.client.request('DELETE', `/api/secret/v1/${id}`, undefined, { headers: { 'content-type': 'text/plain' }, raw: 'not json at all' });
    assertError(text, 415, 'unsupported_media_type');
    const members = await stack.client.request('DELETE', `/api/secret/v1/${id}`, { force: true });
    assertError(members, 400, 'invalid_request');
    assert.equal(members.body.message, 'This operation takes no request body');
    const withNull = await stack.client.request('DELETE', `/api/secret/v1/${id}`, undefined, { headers: { 'content-type': 'application/json' }, raw: 'null' });
    assertError(withNull, 400, 'invalid_request');
    assert.ok(await exists(id), 'nothing was deleted');
    assert.equal((await stack.client.request('DELETE', `/api/secret/v1/${id}`, {})).status, 200);
    const other = await secret('bodyless.two');
    assert.equal((await stack.client.request('DELETE', `/api/secret/v1/${other}`)).status, 200);
    assert.ok(!(await exists(id)) && !(await exists(other)));
  });

  it('answers 415 for a compressed body (Content-Encoding), storing nothing', async () => {
    const before = await taskCount();
    const body = JSON.stringify({ message: textMessage('x') });
    // The encoding quoted as every error quotes what a client sent (echoed): control characters
    // escaped, a long one by its start and its length.
    for (const [encoding, shown] of [['gzip', 'gzip'], ['br', 'br'], ['identity, gzip', 'identity, gzip'], ['gzip,\tbr', 'gzip,\\tbr'],
      [`x-${'z'.repeat(300)}`, `x-${'z'.repeat(58)}… (302 characters)`]]) {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': 'application/json', 'content-encoding': encoding }, raw: body });
      assertError(r, 415, 'unsupported_media_type');
      assert.equal(r.body.message, `Content-Encoding '${shown}' is not supported: send the body uncompressed`);
      assert.equal(r.headers.get('accept-encoding'), 'identity');
    }
    const plain = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': 'application/json', 'content-encoding': 'identity' }, raw: body });
    assert.equal(plain.status, 201, plain.text);
    assert.equal(await taskCount(), before + 1);
  });

  it('answers 400 for JSON that cannot be stored: NUL characters, unpaired surrogates, nesting deeper than 64 levels, numbers past the double range', async () => {
    const before = await taskCount();
    const task = (text: string, metadata = '{}') => `{"message":{"role":"user","parts":[{"type":"text-part","text":${text}}]},"metadata":${metadata}}`;
    const cases: [string, string][] = [
      [task('"a\\u0000b"'), 'body.message.parts.0.text'],
      [task('"\\ud800"'), 'body.message.parts.0.text'],
      [task('"\\udc00x"'), 'body.message.parts.0.text'],
      [task('"x"', '{"k\\u0000":1}'), 'body.metadata'],
      [task('"x"', `${'{"a":'.repeat(70)}1${'}'.repeat(70)}`), 'body.metadata'],
      [task('"x"', `{"deep":${'['.repeat(1500)}${']'.repeat(1500)}}`), 'body.metadata.deep'],
      // Past the double range: JSON.parse makes it Infinity, which would be stored as null.
      [task('"x"', '{"big":1e999}'), 'body.metadata.big'],
      [task('"x"', '{"small":-1e400}'), 'body.metadata.small'],
    ];
    for (const [body, path] of cases) {
      const r = await stack.client.request('POST', '/api/task/v1', undefined, { headers: { 'content-type': 'application/json' }, raw: body });
      assertError(r, 400, 'invalid_request');
      assert.ok(r.body.data.errors[0].path.startsWith(path), r.text.slice(0, 300));
    }
    // A paired surrogate (an emoji) and nesting within the limit are fine.
    const ok = await stack.client.request('POST', '/api/task/v1', undefined, {
      headers: { 'content-type': 'application/json' }, raw: task('"\\ud83d\\ude00 ok"', `${'{"a":'.repeat(40)}1${'}'.repeat(40)}`),
    });
    assert.equal(ok.status, 201, ok.text);
    assert.equal(ok.body.message.parts[0].text, '\u{1F600} ok');
    assert.equal(await taskCount(), before + 1);
  });

  it('says what a refused value must be in words, once per member: the choices, a UUID, a pattern\'s rule, a query parameter given twice', async () => {
    const c = stack.client;
    const cases: [Promise<Response>, string, string][] = [
      [c.get('/api/task/v1?status=bogus'), 'query.status', `must be one of ${TASK_STATES.join(', ')}`],
      [c.get('/api/encryption/v1/job/zzz'), 'path.job_id', 'must be a UUID'],
      [c.get(`/api/task/v1/${randomUUID()}/timeline?order=asc&order=desc`), 'query.order', 'must be given once'],
      [c.post('/api/secret/v1', { key: 'a b', raw_value: 'x' }), 'body.key', 'must be made of A-Z a-z 0-9 _ . / -'],
      [c.post('/api/task/v1', { message: { role: 'robot', parts: [{ type: 'text-part', text: 'x' }] } }), 'body.message.role', 'must be one of user, agent'],
    ];
    for (const [call, path, message] of cases) {
      const r = await call;
      assertError(r, 400, 'invalid_request');
      assert.deepEqual(r.body.data.errors, [{ path, message }], r.text);
      assert.equal(r.body.message, `Invalid ${path.split('.')[0]}: ${path} ${message}`);
    }
  });

  it('names a member whose name is empty or holds a dot, bracket, quote or space in brackets as a JSON string, not as the body itself or a nested member', async () => {
    const c = stack.client;
    const json = { headers: { 'content-type': 'application/json' } };
    const message = '"message":{"role":"user","parts":[{"type":"text-part","text":"x"}]}';
    const cases: [Promise<Response>, string, string][] = [
      [c.request('POST', '/api/task/v1', undefined, { ...json, raw: `{"":1,${message}}` }), 'body[""]', 'is not an allowed member'],
      [c.request('POST', '/api/task/v1', undefined, { ...json, raw: `{"a.b":1,${message}}` }), 'body["a.b"]', 'is not an allowed member'],
      [c.request('POST', '/api/task/v1', undefined, { ...json, raw: `{"message":{"role":"user","parts":[{"type":"text-part","text":"x"}],"x]":1}}` }), 'body.message["x]"]', 'is not an allowed member'],
      [c.get('/api/task/v1?=1'), 'query[""]', 'is not an allowed member'],
      [c.get('/api/task/v1?a%20b=1'), 'query["a b"]', 'is not an allowed member'],
      [c.request('POST', '/api/task/v1', undefined, { ...json, raw: `{${message},"metadata":{"x.y":"\\u0000"}}` }), 'body.metadata["x.y"]', 'contains a NUL character or an unpaired surrogate'],
    ];
    for (const [call, path, words] of cases) {
      const r = await call;
      assertError(r, 400, 'invalid_request');
      assert.deepEqual(r.body.data.errors, [{ path, message: words }], r.text);
      assert.equal(r.body.message, `Invalid ${path.split(/[.[]/)[0]}: ${path} ${words}`);
    }
  });

  it('lists the first 100 errors of a body with more, then says there are more (300 unknown members), storing nothing', async () => {
    const before = (await stack.client.get('/api/secret/v1')).body.secrets.length;
    const body: Record<string, unknown> = { key: 'many-errors', raw_value: 'v' };
    for (let i = 0; i < 300; i++) body[`m${i}`] = 0;
    const r = await stack.client.post('/api/secret/v1', body);
    assertError(r, 400, 'invalid_request');
    const errors = r.body.data.errors;
    assert.equal(errors.length, 101);
    assert.deepEqual(errors.slice(0, 2), [{ path: 'body.m0', message: 'is not an allowed member' }, { path: 'body.m1', message: 'is not an allowed member' }]);
    assert.deepEqual(errors.at(-1), { path: 'body', message: 'has more errors than the 100 listed' });
    const few = await stack.client.post('/api/secret/v1', { key: 'few-errors', raw_value: 'v', a: 1, b: 2 });
    assert.deepEqual(few.body.data.errors.map((e: { path: string }) => e.path), ['body.a', 'body.b'], 'no such entry when all are listed');
    assert.equal((await stack.client.get('/api/secret/v1')).body.secrets.length, before);
  });

  it('answers 404 with the Error body for unknown routes, with and without a key', async () => {
    for (const path of ['/nope', '/api/task/v2', '/api/task/v1/00000000-0000-4000-8000-000000000000/unknown', '/api']) {
      const r = await stack.client.get(path);
      assertError(r, 404, 'not_found');
      assertError(await stack.client.as('').get(path), 404, 'not_found');
    }
  });

  it('answers 405 with an Allow header for a known path and a wrong method', async () => {
    const r = await stack.client.delete('/api/task/v1');
    assertError(r, 405, 'method_not_allowed');
    const allow = (r.headers.get('allow') ?? '').split(/,\s*/).sort();
    assert.ok(allow.includes('GET') && allow.includes('POST'), `Allow: ${allow}`);
    assert.ok(!allow.includes('DELETE'));
    const health = await stack.client.post('/_internal/v1/health', {});
    assertError(health, 405, 'method_not_allowed');
    assert.match(health.headers.get('allow') ?? '', /GET/);
  });

  it('answers 405 naming only its own methods for a fixed path that a parameterized sibling also matches', async () => {
    const cases: [string, string, string][] = [
      ['GET', '/api/secret/v1/import', 'POST'], ['DELETE', '/api/secret/v1/import', 'POST'],
      ['POST', '/api/secret/v1/list-decrypted', 'HEAD, GET'], ['PUT', '/api/secret/v1/list-decrypted', 'HEAD, GET'],
      ['DELETE', '/api/task/v1/context', 'HEAD, GET'],
    ];
    for (const [method, path, allow] of cases) {
      for (const p of [path, `${path}/`]) {
        const r = await stack.client.request(method, p);
        assertError(r, 405, 'method_not_allowed');
        assert.equal(r.headers.get('allow'), allow, `${method} ${p}`);
        const options = await stack.client.request('OPTIONS', p);
        assert.equal(options.status, 200);
        assert.equal(options.headers.get('allow'), allow, `OPTIONS ${p}`);
      }
    }
  });

  it('matches paths in the letter case SPEC writes them: another case is 404, not a sibling route or another Allow', async () => {
    // A router matching without case sent these to parameterized siblings (400 for a bad id, an Allow
    // of theirs) or answered them, past the fixed-path handling that matches paths as written.
    const cases: [string, string][] = [
      ['GET', '/API/TASK/V1/context?page_size=1'], ['GET', '/Api/Task/V1/Context?page_size=1'], ['DELETE', '/API/TASK/V1/CONTEXT'],
      ['OPTIONS', '/API/TASK/V1/CONTEXT'], ['GET', '/API/SECRET/V1/IMPORT'], ['POST', '/api/bridge/v1/GENERIC-OAUTH-CALLBACK'],
      ['GET', '/_INTERNAL/V1/HEALTH'], ['GET', '/api/task/V1'],
    ];
    for (const [method, path] of cases) {
      const r = await stack.client.request(method, path, method === 'POST' ? {} : undefined);
      assertError(r, 404, 'not_found');
      assert.equal(r.headers.get('allow'), null, `${method} ${path}`);
      assert.deepEqual(r.body.data, { code: 'not_found', resource: 'route', id: path.split('?')[0] }, `${method} ${path}`);
    }
    assert.equal((await stack.client.get('/api/task/v1/context?page_size=1')).status, 200);
  });

  it('answers a method no route has (PROPFIND) like any wrong method: 405 on a known path, 404 elsewhere, logged below error', async () => {
    const r = await stack.client.request('PROPFIND', '/api/task/v1');
    assertError(r, 405, 'method_not_allowed');
    assert.match(r.body.message, /PROPFIND/);
    assert.deepEqual((r.headers.get('allow') ?? '').split(/,\s*/).sort(), ['GET', 'HEAD', 'POST']);
    assertError(await stack.client.request('PROPFIND', '/api/no-such-thing'), 404, 'not_found');
    // Log lines arrive in order: once a later request's line is in, the PROPFIND ones are too.
    const marker = `after-propfind-${Date.now()}`;
    await stack.client.request('GET', '/api/openapi.json', undefined, { headers: { 'x-request-id': marker } });
    await waitFor(async () => stack.api.logs.some((l) => l.includes(marker)), 'the later request logged');
    assert.ok(stack.api.logs.some((l) => l.includes('"method":"PROPFIND"')), 'the PROPFIND requests are in the log');
    assert.ok(!stack.api.logs.some((l) => l.includes('PROPFIND') && /"level":(50|"error")/.test(l)), 'no error-level log line');
  });

  it('answers an Expect other than 100-continue with 417 and the Error body, storing nothing', async () => {
    const before = await taskCount();
    const r = await raw(stack.api.url, {
      method: 'POST', path: '/api/task/v1', chunks: [JSON.stringify({ message: textMessage('expect') })],
      headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', expect: 'bogus', 'x-request-id': 'expect-417' },
    });
    assert.equal(r.status, 417);
    assert.equal(r.headers['x-request-id'], 'expect-417');
    assert.match(String(r.headers['content-type']), /^application\/json/);
    assert.deepEqual(r.body, { message: "Expect 'bogus' is not supported: only 100-continue is", data: { code: 'invalid_request' } });
    await waitFor(async () => stack.api.logs.some((l) => l.includes('"req_id":"expect-417"')), 'the refused request in the API log');
    for (const [expect, shown] of [['bogus\tthing', 'bogus\\tthing'], ['e'.repeat(300), `${'e'.repeat(60)}… (300 characters)`]]) {
      const quoted = await raw(stack.api.url, {
        method: 'POST', path: '/api/task/v1', chunks: [JSON.stringify({ message: textMessage('expect') })],
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', expect },
      });
      assert.deepEqual([quoted.status, quoted.body.message], [417, `Expect '${shown}' is not supported: only 100-continue is`]);
    }
    assert.equal(await taskCount(), before);
  });

  it('logs a refused Expect\'s target without its user info, query and fragment', async () => {
    const answer = await rawExchange(stack.api.url, 'GET http://u:expect-secret-1@h/x?token=expect-secret-2#expect-secret-3 HTTP/1.1\r\nHost: h\r\nExpect: x\r\nX-Request-Id: expect-target\r\n\r\n');
    assert.match(answer, /^HTTP\/1\.1 417 /);
    const line = await waitFor(async () => stack.api.logs.find((l) => l.includes('"req_id":"expect-target"')), 'the refused request in the API log');
    // Before: "path":"http://u:expect-secret-1@h/x" (and, without a query, the fragment).
    assert.match(line, /"path":"http:\/\/h\/x"/);
    assert.ok(!stack.api.logs.some((l) => l.includes('expect-secret')), line);
  });

  it('answers an HTTP/1.1 request without a Host header with 400 and the Error body, storing nothing', async () => {
    const before = await taskCount();
    const body = JSON.stringify({ message: textMessage('no host') });
    const answer = await rawExchange(stack.api.url, `POST /api/task/v1 HTTP/1.1\r\nAuthorization: Bearer ${ADMIN_KEY}\r\n`
      + `Content-Type: application/json\r\nContent-Length: ${body.length}\r\nX-Request-Id: no-host\r\nConnection: close\r\n\r\n${body}`);
    assert.match(answer, /^HTTP\/1\.1 400 Bad Request\r\n/);
    assert.match(answer, /\r\nX-Request-Id: no-host\r\n/i);
    assert.deepEqual(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)), {
      message: 'An HTTP/1.1 request must carry a Host header', data: { code: 'invalid_request', errors: [{ path: 'header.host', message: 'is required' }] },
    });
    const line = await waitFor(async () => stack.api.logs.find((l) => l.includes('"req_id":"no-host"') && l.includes('"msg":"request"')), 'the request line');
    assert.equal(JSON.parse(line).status, 400, line);
    assert.equal(await taskCount(), before);
  });

  it('answers CONNECT (a proxy tunnel) with 405 and the Error body instead of dropping the connection', async () => {
    const { hostname, port } = new URL(stack.api.url);
    const r = await new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: any }>((resolve, reject) => {
      const req = http.request({ hostname, port, method: 'CONNECT', path: 'example.com:443' });
      req.on('connect', (res, socket, head) => {
        let text = head.toString();
        socket.on('data', (b) => (text += b));
        socket.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: JSON.parse(text) }));
      });
      req.on('error', reject);
      req.end();
    });
    assert.equal(r.status, 405);
    assert.match(String(r.headers['x-request-id']), /^[0-9a-f-]{36}$/);
    assert.deepEqual((r.headers.allow ?? '').split(', ').sort(), ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH', 'POST', 'PUT']);
    assert.deepEqual(r.body.data.code, 'method_not_allowed');
    assert.match(r.body.message, /CONNECT is not allowed: this server is not a proxy/);
  });

  it('echoes a valid X-Request-Id, mints one otherwise, on successes and errors, and logs it', async () => {
    const mine = 'trace-abc.123:XYZ';
    const ok = await stack.client.request('GET', '/_internal/v1/health', undefined, { headers: { 'x-request-id': mine } });
    assert.equal(ok.headers.get('x-request-id'), mine);
    const err = await stack.client.request('GET', '/nope', undefined, { headers: { 'x-request-id': mine } });
    assert.equal(err.headers.get('x-request-id'), mine);
    for (const bad of ['has space', 'x'.repeat(129), 'semi;colon', '<script>']) {
      const r = await stack.client.request('GET', '/_internal/v1/health', undefined, { headers: { 'x-request-id': bad } });
      const id = r.headers.get('x-request-id') ?? '';
      assert.notEqual(id, bad);
      assert.match(id, /^[0-9a-f-]{36}$/);
    }
    const minted = (await stack.client.get('/api/task/v1/00000000-0000-4000-8000-000000000000')).headers.get('x-request-id');
    assert.match(minted ?? '', /^[0-9a-f-]{36}$/);
    const other = (await stack.client.get('/_internal/v1/health')).headers.get('x-request-id');
    assert.notEqual(other, minted);
    await waitFor(async () => stack.api.logs.some((l) => l.includes(`"req_id":"${mine}"`)) && stack.api.logs.some((l) => l.includes(`"req_id":"${minted}"`)), 'request ids in the API log');
  });

  it('logs one line per request with its method, path, route pattern (as /metrics labels it), status and duration', async () => {
    const r = await stack.client.get('/api/task/v1/00000000-0000-4000-8000-000000000000');
    const unmatched = await stack.client.get('/no/such/thing');
    const line = (res: Response) => {
      const id = res.headers.get('x-request-id');
      const lines = stack.api.logs.filter((l) => l.includes(`"req_id":"${id}"`) && l.includes('"msg":"request"'));
      return lines.length === 1 && JSON.parse(lines[0]);
    };
    await waitFor(async () => line(r) && line(unmatched), 'the request lines');
    const { method, path, route, status, ms } = line(r);
    assert.deepEqual({ method, path, route, status }, { method: 'GET', path: '/api/task/v1/00000000-0000-4000-8000-000000000000', route: '/api/task/v1/:task_id', status: 404 });
    assert.equal(typeof ms, 'number');
    assert.equal(line(unmatched).route, 'unmatched');
  });

  it("logs load balancers' probes and Prometheus' scrapes at debug while they succeed, and at info once one fails", async () => {
    const paths = ['/_internal/v1/health', '/metrics', '/_internal/v1/ready'];
    const polled = [];
    for (const p of paths) polled.push(await stack.client.get(p));
    const refused = await stack.client.as(undefined).get('/metrics');
    assert.deepEqual([...polled, refused].map((r) => r.status), [200, 200, 200, 401]);
    const last = await requestLogsThrough(stack, refused);
    assert.ok(last.some((l: string) => l.includes(`"req_id":"${refused.headers.get('x-request-id')}"`)), 'the refused scrape is logged');
    for (const [i, r] of polled.entries()) assert.ok(!stack.api.logs.some((l) => l.includes(`"req_id":"${r.headers.get('x-request-id')}"`)), `${paths[i]}: no request line at info`);
    // At LOG_LEVEL=debug each of them has its request line, at debug (20).
    const debug = await startApi({ ...stack.env, LOG_LEVEL: 'debug' });
    try {
      for (const p of paths) {
        const r = await new Client(debug.url).get(p);
        assert.equal(r.status, 200, `${p}: ${r.text}`);
        const line = await waitFor(async () => debug.logs.find((l) => l.includes(`"req_id":"${r.headers.get('x-request-id')}"`) && l.includes('"msg":"request"')), `the request line of ${p} at debug`, 5000);
        assert.equal(JSON.parse(line).level, 20, line);
      }
    } finally {
      await debug.stop();
    }
  });

  it('refuses a query parameter the operation does not take (a misspelt filter would list everything)', async () => {
    const c = stack.client;
    for (const [url, path] of [['/api/task/v1?stauts=failed', 'query.stauts'], ['/api/secret/v1?page_size=5&pagesize=5', 'query.pagesize'], ['/api/bridge/v1/provider?staus=active', 'query.staus']] as const) {
      const r = await c.get(url);
      assertError(r, 400, 'invalid_request');
      assert.deepEqual(r.body.data.errors, [{ path, message: 'is not an allowed member' }], `${url}: ${r.text}`);
    }
    assert.equal((await c.get('/api/task/v1?status=failed&page_size=5')).status, 200, 'the parameters it takes');
  });

  it('refuses a query parameter on an operation that takes none, doing nothing (a filter it ignored answered everything)', async () => {
    const c = stack.client;
    const doc = await c.get('/api/bridge/v1/function-instances/openapi.json?provider_instance_id=00000000-0000-4000-8000-000000000000');
    assertError(doc, 400, 'invalid_request');
    assert.equal(doc.body.message, 'Invalid query: query.provider_instance_id is not an allowed member');
    assert.deepEqual(doc.body.data.errors, [{ path: 'query.provider_instance_id', message: 'is not an allowed member' }]);
    const created = await c.post('/api/secret/v1', { key: 'query.refused', raw_value: 'v' });
    assert.equal(created.status, 201, created.text);
    const deleted = await c.delete(`/api/secret/v1/${created.body.id}?force=1`);
    assertError(deleted, 400, 'invalid_request');
    assert.deepEqual(deleted.body.data.errors, [{ path: 'query.force', message: 'is not an allowed member' }]);
    assert.equal((await c.get(`/api/secret/v1/${created.body.id}`)).status, 200, 'nothing was deleted');
    // The JSON-RPC endpoints' clients read only JSON-RPC answers: a parameter on their URL is ignored.
    const mcp = await c.request('POST', '/api/bridge/v1/mcp?sessionId=abc', { jsonrpc: '2.0', id: 1, method: 'tools/list' }, { headers: { accept: 'application/json' } });
    assert.equal(mcp.status, 200, mcp.text);
    assert.ok(Array.isArray(mcp.body.result.tools), mcp.text);
    // Published documents and probes take any (a cache buster, a CDN's, a probe's): there is nothing to filter in them.
    for (const url of ['/api/openapi.json?v=2', '/.well-known/agent-card.json?v=2', '/api/a2a/v1/.well-known/agent.json?v=2', '/api/a2a/v1/.well-known/agent-card.json?v=2', '/_internal/v1/health?probe=1', '/_internal/v1/ready?probe=1']) {
      assert.equal((await c.as(undefined).get(url)).status, 200, url);
    }
    assert.equal((await c.get('/metrics?format=prometheus')).status, 200, 'a scraper configured with params');
    assert.equal((await c.get('/api/a2a/v1/agent/authenticatedExtendedCard?v=2')).status, 200, 'the extended card, as the public ones');
    assert.equal((await c.get('/api/bridge/v1/function-instances/openapi.json')).status, 200);
  });

  it('never answers 500 to odd requests: undecodable paths, repeated or odd query parameters', async () => {
    const auth = { authorization: `Bearer ${stack.client.key}` };
    // An absolute-form target that is no URL: Koa's ctx.path threw, and every route answered a bare 500.
    for (const path of ['/api/task/v1/%E0%A4%A', '/api/task/v1/%ZZ/timeline', '/%', 'http://[::1/api/task/v1', 'http://[::1/api/bridge/v1/mcp', 'http://u:target-secret-5c1a@[::1/api/task/v1?token=target-secret-7e0b']) {
      const r = await raw(stack.api.url, { method: 'GET', path, headers: auth });
      assert.ok(r.status >= 400 && r.status < 500, `${path}: ${r.status}`);
      assert.equal(typeof r.body?.data?.code, 'string', path);
      if (path.startsWith('http:')) assert.equal(r.body.message, 'The request target is not a valid URL (send a path, /api/...)');
    }
    // The request line names such a target without its user info or query.
    await waitFor(async () => stack.api.logs.some((l) => l.includes('"path":"http://[::1/api/task/v1"') && l.includes('"status":400')), 'the refused target\'s request line');
    assert.ok(!stack.api.logs.some((l) => l.includes('target-secret')), 'a credential of a refused target in the log');
    for (const q of ['page_size=1&page_size=2', 'next_page_token=a&next_page_token=b', 'status=submitted&status=failed', `next_page_token=${'A'.repeat(5000)}`]) {
      const r = await stack.client.get(`/api/task/v1?${q}`);
      assertError(r, 400, 'invalid_request');
    }
    const ctx = await stack.client.get('/api/task/v1/context?page_size=1&page_size=1');
    assertError(ctx, 400, 'invalid_request');
  });

  it('every error body has the shape {message, data: {code}}', async () => {
    const cases: [Promise<Response>, number][] = [
      [stack.client.as('').get('/api/task/v1'), 401],
      [stack.client.get('/api/task/v1/context'), 400],
      [stack.client.get('/api/task/v1/00000000-0000-4000-8000-000000000000'), 404],
    ];
    for (const [p, status] of cases) {
      const r = await p;
      assert.equal(r.status, status);
      assert.equal(typeof r.body.message, 'string');
      assert.equal(typeof r.body.data.code, 'string');
      assert.deepEqual(Object.keys(r.body).sort(), ['data', 'message']);
    }
  });
});

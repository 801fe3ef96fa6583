// GET /api/openapi.json: a valid OpenAPI 3.1 document covering every route, whose schemas are
// the ones responses actually follow.
import assert from 'node:assert/strict';
import { Validator } from '@seriousme/openapi-schema-validator';
import { Ajv } from 'ajv';
import addFormats from 'ajv-formats';
import { allRoutes } from '../api/app.ts';
import { textMessage, useStack, type Response } from './helpers/stack.ts';

describe('OpenAPI document', () => {
  const stack = useStack({}, { workers: 0 });
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
      assert.equal(!!op.requestBody, !!spec.body, `${spec.operationId}: requestBody`);
    }
    // Statuses the shared layers answer are listed even where a route does not name them.
    const statuses = (path: string, method: string) => Object.keys(doc.paths[path][method].responses).sort();
    assert.deepEqual(statuses('/_internal/v1/trigger_codegen', 'post'), ['200', '400', '401', '403', '413', '415', '429', '500', '503']);
    assert.deepEqual(statuses('/api/bridge/v1/available-providers/{provider_controller_type_id}/available-credentials/{credential_controller_type_id}/credential/resource-server', 'post'),
      ['201', '400', '401', '403', '404', '413', '415', '429', '500', '502', '503']);
    assert.deepEqual(statuses('/_internal/v1/health', 'get'), ['200']);
    // The seed's list-contexts answers: 500 among its errors; no 404, which a list never answers.
    assert.deepEqual(statuses('/api/task/v1/context', 'get'), ['200', '400', '401', '403', '429', '500', '503']);
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
    assert.deepEqual(statuses('/api/bridge/v1/generic-oauth-callback', 'get'), ['200', '303', '400', '404', '405', '410', '500', '502', '503']);
    // 409s that only races give are listed too: a task naming the context that retention is deleting
    // (README, Operating), a secret moving between aliases while written, a rotation's job id taken.
    assert.ok(statuses('/api/task/v1', 'post').includes('409'));
    assert.ok(statuses('/api/secret/v1/{secret_id}', 'put').includes('409'));
    assert.ok(statuses('/api/encryption/v1/dek/alias/{alias}/rotate', 'post').includes('409'));
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

  it('every $ref points at a component that exists', () => {
    const refs = JSON.stringify(doc).match(/"\$ref":"[^"]+"/g) ?? [];
    assert.ok(refs.length > 0);
    for (const ref of new Set(refs)) {
      const name = /#\/components\/schemas\/(.+)"$/.exec(ref)?.[1];
      assert.ok(name && doc.components.schemas[name], `dangling ${ref}`);
    }
  });

  it('task responses and errors follow the documented schemas', async () => {
    const ajv = addFormats.default(new Ajv({ strict: false, discriminator: true }));
    ajv.addSchema(doc, 'openapi');
    const check = (r: Response, path: string, method: string) => {
      const schema = doc.paths[path][method].responses[String(r.status)]?.content?.['application/json']?.schema;
      assert.ok(schema, `${method} ${path} does not document status ${r.status}`);
      // Resolve component refs against the served document.
      const rebased = JSON.parse(JSON.stringify(schema).replace(/"#\/components/g, '"openapi#/components'));
      const validate = ajv.compile(rebased);
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
});

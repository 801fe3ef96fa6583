import assert from 'node:assert/strict';
import { resetDb, startStack, textMessage, type Stack } from './helpers/stack.ts';

describe('GET /metrics', () => {
  let stack: Stack;
  before(async () => {
    await resetDb();
    stack = await startStack({}, { workers: 0 });
  });
  after(async () => stack?.stop());

  it('needs a key with scope internal', async () => {
    assert.equal((await stack.client.as(undefined).get('/metrics')).status, 401);
    const key = await stack.client.post('/api/auth/v1/api-key', { name: 'reader', scopes: ['task:read'] });
    assert.equal((await stack.client.as(key.body.key).get('/metrics')).status, 403);
  });

  it('reports request latency by route pattern and status, queue depths and the outbox backlog', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('count me') });
    assert.equal(created.status, 201);
    assert.equal((await stack.client.get('/api/task/v1/00000000-0000-4000-8000-000000000000')).status, 404);
    const res = await stack.client.get('/metrics');
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain/);
    assert.match(res.text, /taskbridge_http_request_duration_seconds_count\{method="POST",route="\/api\/task\/v1",status="201"\} 1/);
    assert.match(res.text, /taskbridge_http_request_duration_seconds_count\{method="GET",route="\/api\/task\/v1\/:task_id",status="404"\} 1/);
    // No worker runs here, so the created task's job waits in the queue.
    assert.match(res.text, /taskbridge_queue_jobs\{queue="agent-tasks",state="waiting"\} 1/);
    assert.match(res.text, /taskbridge_outbox_pending 0/);
  });

  it('reports the progress of key jobs under way', async () => {
    const target = await stack.client.post('/api/encryption/v1/envelope', { type: 'local', file_name: 'metrics-target.key' });
    assert.equal(target.status, 201);
    const job = await stack.client.post('/api/encryption/v1/envelope/default-envelope.key/migrate', { to_envelope_encryption_key_id: 'metrics-target.key' });
    assert.equal(job.status, 202);
    const res = await stack.client.get('/metrics');
    assert.match(res.text, new RegExp(`taskbridge_key_job_items\\{job_id="${job.body.id}",kind="migrate-deks",count="done"\\} 0`));
  });
});

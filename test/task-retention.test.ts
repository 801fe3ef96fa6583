// TASK_RETENTION_DAYS: a worker's housekeeping pass deletes tasks that ended longer ago than that,
// with their messages and timelines, and contexts left without tasks; tasks that have not ended,
// or ended recently, stay. Tasks are aged by moving their times back in Postgres.
import assert from 'node:assert/strict';
import { lockWaits, startWorker, testDb, textMessage, useStack, waitFor, type Proc, type Stack } from './helpers/stack.ts';

const T = '/api/task/v1';
const DAY_MS = 24 * 60 * 60 * 1000;

// A task with an agent's first message (no run is started), moved to `status` through the API.
async function taskIn(stack: Stack, status: string, contextId?: string): Promise<{ id: string; context_id: string }> {
  const created = await stack.client.post(T, { ...(contextId ? { context_id: contextId } : {}), message: textMessage(`a ${status} task`, 'agent') });
  assert.equal(created.status, 201, created.text);
  const { id, context_id } = created.body.task;
  const path = ['submitted', 'canceled', 'rejected'].includes(status) ? [status] : ['working', status];
  for (const to of path.filter((s) => s !== 'submitted')) {
    const r = await stack.client.put(`${T}/${id}`, { status: to, message: textMessage(`now ${to}`, 'agent') });
    assert.equal(r.status, 200, r.text);
  }
  return { id, context_id };
}

async function age(id: string, createdDaysAgo: number, endedDaysAgo = createdDaysAgo): Promise<void> {
  const updated = await testDb()('tasks').where({ id }).update({
    created_at: new Date(Date.now() - createdDaysAgo * DAY_MS), status_timestamp: new Date(Date.now() - endedDaysAgo * DAY_MS),
  });
  assert.equal(updated, 1);
}

const rowsOf = async (table: string, taskId: string) => Number((await testDb()(table).where({ task_id: taskId }).count({ n: '*' }))[0].n);
const contextExists = async (id: string) => !!(await testDb()('contexts').where({ id }).first());

describe('task retention (TASK_RETENTION_DAYS)', function () {
  this.timeout(60_000);
  const stack = useStack({ TASK_RETENTION_DAYS: '7', JOB_RECOVERY_MS: '300' });

  it('deletes tasks that ended before the retention with all they hold, and keeps the rest', async () => {
    const c = stack.client;
    const oldCompleted = await taskIn(stack, 'completed');
    const oldFailed = await taskIn(stack, 'failed');
    const oldCanceled = await taskIn(stack, 'canceled');
    const oldRejected = await taskIn(stack, 'rejected');
    const recentInSameContext = await taskIn(stack, 'completed', oldCanceled.context_id);
    const oldWaiting = await taskIn(stack, 'input-required');
    const oldSubmitted = await taskIn(stack, 'submitted');
    const longRunEndedRecently = await taskIn(stack, 'completed');
    const recent = await taskIn(stack, 'rejected');
    const gone = [oldCompleted, oldFailed, oldCanceled, oldRejected];
    // What else a task may hold: a push config, and (AGENT_KIND=remote) the remote task it mirrors.
    // Written, and the rows counted, before the tasks are aged: a pass may delete them right after.
    await testDb()('push_configs').insert({ task_id: oldCompleted.id, id: 'hook', url: 'https://example.com/hook' });
    await testDb()('remote_agent_tasks').insert({ task_id: oldCompleted.id, remote_task_id: 'remote-1' });
    for (const t of gone) {
      assert.ok(await rowsOf('messages', t.id) >= 2 && await rowsOf('timeline_items', t.id) >= 3, 'the task holds messages and a timeline before');
    }
    for (const t of [...gone, oldWaiting, oldSubmitted]) await age(t.id, 8);
    // Its context was made with its first task, now aged.
    const contextMadeAt = new Date(Date.now() - 8 * DAY_MS);
    await testDb()('contexts').where({ id: oldCanceled.context_id }).update({ created_at: contextMadeAt });
    await age(longRunEndedRecently.id, 30, 6);
    await age(recent.id, 1);

    await waitFor(async () => (await c.get(`${T}/${oldRejected.id}`)).status === 404, 'the old rejected task to be deleted', 20000, 100);
    for (const t of gone) {
      assert.equal((await c.get(`${T}/${t.id}`)).status, 404);
      assert.equal((await c.get(`${T}/${t.id}/timeline`)).status, 404);
      for (const table of ['messages', 'timeline_items', 'push_configs', 'remote_agent_tasks']) assert.equal(await rowsOf(table, t.id), 0, table);
    }
    // A context goes with its last task; one that still has a task stays, listed once.
    assert.equal(await contextExists(oldCompleted.context_id), false);
    assert.equal(await contextExists(oldFailed.context_id), false);
    const contexts = await c.get(`${T}/context?page_size=100`);
    assert.equal(contexts.status, 200);
    const listed = contexts.body.items.map((x: { context_id: string }) => x.context_id);
    assert.ok(!listed.includes(oldCompleted.context_id));
    assert.equal(listed.filter((id: string) => id === oldCanceled.context_id).length, 1);
    // ... with the created_at it was made with (its first task's, deleted), which list-contexts pages on.
    const kept = contexts.body.items.find((x: { context_id: string }) => x.context_id === oldCanceled.context_id);
    assert.equal(kept.created_at, contextMadeAt.toISOString());
    const inContext = await c.get(`${T}/context/${oldCanceled.context_id}/task?page_size=10`);
    assert.deepEqual(inContext.body.items.map((t: { id: string }) => t.id), [recentInSameContext.id]);

    for (const t of [recentInSameContext, oldWaiting, oldSubmitted, longRunEndedRecently, recent]) {
      const r = await c.get(`${T}/${t.id}`);
      assert.equal(r.status, 200, `${t.id} kept`);
      assert.ok(r.body.messages.length >= 1);
    }
    const logged = stack.workers.flatMap((w) => w.logs).filter((l) => l.includes('ended tasks past their retention deleted'));
    assert.equal(logged.reduce((n, l) => n + JSON.parse(l).tasks, 0), 4, logged.join('\n'));
  });

  it('a client paging list-contexts while the purge deletes a context\'s first task sees each context once', async () => {
    const c = stack.client;
    const page = async (token?: string) => {
      const r = await c.get(`${T}/context?page_size=2${token ? `&next_page_token=${encodeURIComponent(token)}` : ''}`);
      assert.equal(r.status, 200, r.text);
      return r.body as { items: { context_id: string }[]; next_page_token?: string };
    };
    // A context opened 8 days ago by a task that has ended since, then contexts opened after it, one
    // of its tasks still kept among them: newest first, [z, y, x, opened].
    const first = await taskIn(stack, 'completed');
    await testDb()('contexts').where({ id: first.context_id }).update({ created_at: new Date(Date.now() - 8 * DAY_MS) });
    const x = await taskIn(stack, 'submitted');
    const y = await taskIn(stack, 'submitted');
    await taskIn(stack, 'submitted', first.context_id);
    const z = await taskIn(stack, 'submitted');
    // Earlier tests' contexts are older than these and follow them.
    const seen: string[] = [];
    let body = await page();
    seen.push(...body.items.map((i) => i.context_id));
    assert.deepEqual(seen, [z.context_id, y.context_id]);
    // The purge deletes the context's first task between two pages; the context keeps a task.
    await age(first.id, 8);
    await waitFor(async () => (await c.get(`${T}/${first.id}`)).status === 404, 'the first task to be deleted', 20000, 100);
    while (body.next_page_token) {
      body = await page(body.next_page_token);
      seen.push(...body.items.map((i) => i.context_id));
    }
    assert.deepEqual(seen.filter((id) => [x.context_id, first.context_id].includes(id)), [x.context_id, first.context_id]);
    assert.equal(new Set(seen).size, seen.length, `no context twice: ${seen.join(', ')}`);
  });

  it('a client may start a new task in the context of a deleted one', async () => {
    const c = stack.client;
    const old = await taskIn(stack, 'completed');
    await age(old.id, 8);
    await waitFor(async () => !(await contextExists(old.context_id)), 'the context to be deleted with its task', 20000, 100);
    const again = await c.post(T, { context_id: old.context_id, message: textMessage('hello again') });
    assert.equal(again.status, 201, again.text);
    assert.equal(again.body.task.context_id, old.context_id);
    const listed = await c.get(`${T}/context/${old.context_id}/task?page_size=10`);
    assert.deepEqual(listed.body.items.map((t: { id: string }) => t.id), [again.body.task.id]);
  });
});

// 1,100 ended tasks of 300 timeline items each, 10 days old: deleting 1,000 of them takes over a
// second, far beyond the statement timeout of the worker started with `env`.
async function purgesHeavyTasksInSmallerBatches(stack: Stack, env: Record<string, string>): Promise<void> {
  const db = testDb();
  await db.raw(`insert into contexts (id, created_at) select gen_random_uuid(), now() - interval '10 days' from generate_series(1, 1100)`);
  await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
                select gen_random_uuid(), c.id, 'completed', c.created_at, '{}', c.created_at, c.created_at from contexts c`);
  await db.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                select gen_random_uuid(), t.id, '{"type":"task-status-update","status":"working"}', t.created_at from tasks t, generate_series(1, 300)`);
  const worker = await startWorker({ ...stack.env, TASK_RETENTION_DAYS: '7', JOB_RECOVERY_MS: '500', ...env });
  stack.workers.push(worker);
  await waitFor(async () => Number((await db('tasks').count({ n: '*' }))[0].n) === 0, 'every heavy task to be deleted', 90_000, 500);
  assert.equal(Number((await db('timeline_items').count({ n: '*' }))[0].n), 0);
  assert.equal(Number((await db('contexts').count({ n: '*' }))[0].n), 0);
  assert.ok(worker.logs.some((l) => l.includes('a batch took too long; trying fewer tasks at a time')), worker.logs.slice(-20).join('\n'));
}

describe('task retention with tasks that hold many rows', function () {
  this.timeout(120_000);
  const stack = useStack({}, { workers: 0 });

  it('deletes them in smaller batches when a batch of 1,000 outlasts DB_QUERY_TIMEOUT_MS', async () => {
    await purgesHeavyTasksInSmallerBatches(stack, { DB_QUERY_TIMEOUT_MS: '100' });
  });

  it('thins first a single task too large to delete within DB_QUERY_TIMEOUT_MS, and goes on past it', async () => {
    // The same worker (100 ms statements): one old task of 400,000 timeline items, then lighter ones.
    const db = testDb();
    await db.transaction(async (trx) => {
      const heavy = await trx.raw(`with c as (insert into contexts (id, created_at) values (gen_random_uuid(), now() - interval '20 days') returning id, created_at)
        insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
        select gen_random_uuid(), c.id, 'completed', c.created_at, '{}', c.created_at, c.created_at from c returning id`);
      await trx.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                     select gen_random_uuid(), ?, '{"type":"task-status-update","status":"working"}', now() from generate_series(1, 400000)`, [heavy.rows[0].id]);
    });
    await db.raw(`insert into contexts (id, created_at) select gen_random_uuid(), now() - interval '10 days' from generate_series(1, 20)`);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
                  select gen_random_uuid(), c.id, 'failed', c.created_at, '{}', c.created_at, c.created_at from contexts c where not exists (select 1 from tasks t where t.context_id = c.id)`);
    await waitFor(async () => Number((await db('tasks').count({ n: '*' }))[0].n) === 0, 'the heavy task and those after it to be deleted', 90_000, 500);
    assert.equal(Number((await db('timeline_items').count({ n: '*' }))[0].n), 0);
    const worker = stack.workers.at(-1)!;
    // Written asynchronously: the line may come after the deletes.
    await waitFor(async () => worker.logs.some((l) => l.includes('a task too large to delete at once was thinned first')), 'the thinning log line', 5_000)
      .catch((err: Error) => assert.fail(`${err.message}\n${worker.logs.filter((l) => l.includes('retention') || l.includes('housekeeping')).slice(-20).join('\n')}`));
  });

  it('deletes an ended task whose context holds many tasks still kept within DB_QUERY_TIMEOUT_MS, and keeps the context\'s time', async () => {
    // The same worker (100 ms statements): a context whose first task ended 10 days ago, followed
    // by 500,000 tasks that ended a day ago (a client that sends all its tasks in one context).
    const db = testDb();
    const { old, contextId, madeAt } = await db.transaction(async (trx) => {
      const { rows: [c] } = await trx.raw(`insert into contexts (id, created_at) values (gen_random_uuid(), now() - interval '20 days') returning id, created_at`);
      const { rows: [o] } = await trx.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
        values (gen_random_uuid(), ?, 'completed', now() - interval '10 days', '{}', now() - interval '20 days', now() - interval '10 days') returning id`, [c.id]);
      await trx.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
        select gen_random_uuid(), ?, 'completed', now() - interval '1 day', '{}', now() - interval '2 days' + g * interval '1 ms', now() - interval '1 day'
          from generate_series(1, 500000) g`, [c.id]);
      return { old: o.id as string, contextId: c.id as string, madeAt: c.created_at as Date };
    });
    await db.raw('analyze tasks');
    const worker = stack.workers.at(-1)!;
    await waitFor(async () => !(await db('tasks').where({ id: old }).first()), 'the old task to be deleted', 20_000, 200)
      .catch((err: Error) => assert.fail(`${err.message}\n${worker.logs.filter((l) => l.includes('retention') || l.includes('housekeeping')).slice(-5).join('\n')}`));
    assert.equal((await db('contexts').where({ id: contextId }).first()).created_at.getTime(), madeAt.getTime());
  });
});

describe('task retention with no statement timeout (DB_QUERY_TIMEOUT_MS=0)', function () {
  this.timeout(120_000);
  const stack = useStack({}, { workers: 0 });

  it('still deletes in smaller batches when a batch of 1,000 outlasts half of JOB_RECOVERY_MS', async () => {
    await purgesHeavyTasksInSmallerBatches(stack, { DB_QUERY_TIMEOUT_MS: '0' });
  });
});

describe('a worker stopped during a retention pass', function () {
  this.timeout(90_000);
  const stack = useStack({}, { workers: 0 });

  // 1,001 ended tasks, each in its own context: two batches. The test holds the context of the
  // oldest, which the first batch locks before it commits, and gives the worker SIGTERM while its
  // purge waits on it; `releaseOnceWaited`: the test commits once the worker waits for the pass,
  // otherwise only after the worker has exited. Passes far apart: the one held is the first.
  async function stopDuringHeldBatch(env: Record<string, string>, releaseOnceWaited: boolean): Promise<{ worker: Proc; code: number | null; left: number }> {
    const db = testDb();
    await db('tasks').delete();
    await db('contexts').delete();
    await db.raw(`insert into contexts (id, created_at) select gen_random_uuid(), now() - interval '10 days' from generate_series(1, 1001)`);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
                  select gen_random_uuid(), c.id, 'completed', c.created_at, '{}', c.created_at, c.created_at from contexts c`);
    const { context_id: held } = await db('tasks').orderBy('status_timestamp').first('context_id');
    await db('tasks').where({ context_id: held }).update({ status_timestamp: new Date(Date.now() - 20 * DAY_MS) });
    const holder = await db.transaction();
    await holder.raw('select id from contexts where id = ? for update', [held]);
    try {
      const worker = await startWorker({ ...stack.env, TASK_RETENTION_DAYS: '7', ...env });
      stack.workers.push(worker);
      await waitFor(async () => (await lockWaits('select id from contexts where id = any%')) === 1, 'the purge to wait on the held context', 60_000, 50);
      worker.child.kill('SIGTERM');
      await waitFor(async () => worker.logs.some((l) => l.includes('waiting for housekeeping passes in flight')), 'the worker to wait for the pass', 20_000, 20);
      if (releaseOnceWaited) await holder.commit();
      const code = await new Promise<number | null>((resolve) => (worker.child.exitCode !== null ? resolve(worker.child.exitCode) : worker.child.once('exit', resolve)));
      return { worker, code, left: Number((await db('tasks').count({ n: '*' }))[0].n) };
    } finally {
      if (!holder.isCompleted()) await holder.rollback();
    }
  }
  const housekeepingLines = (worker: Proc) => worker.logs.filter((l) => l.includes('housekeeping') || l.includes('retention')).join('\n');

  it('commits the batch in flight, starts no further one, and exits 0', async () => {
    // The batch's own timeout (half of JOB_RECOVERY_MS: 10 s) leaves room for the steps between the
    // lock wait and the commit on a loaded machine: past it, the batch fails (57014) instead.
    const { worker, code, left } = await stopDuringHeldBatch({ JOB_RECOVERY_MS: '20000' }, true);
    assert.equal(code, 0, worker.logs.slice(-10).join('\n'));
    assert.ok(!worker.logs.some((l) => l.includes('housekeeping pass failed') || l.includes('interrupted by the shutdown')), housekeepingLines(worker));
    assert.equal(left, 1, 'the first batch committed, the second left for a later pass');
  });

  it('interrupts a batch still held after WORKER_SHUTDOWN_GRACE_MS, rolled back, and exits 0', async () => {
    // The batch's own timeout (half of JOB_RECOVERY_MS: 10 s) is far past the grace period.
    const { worker, code, left } = await stopDuringHeldBatch({ JOB_RECOVERY_MS: '20000', WORKER_SHUTDOWN_GRACE_MS: '1000' }, false);
    assert.equal(code, 0, worker.logs.slice(-10).join('\n'));
    const interrupted = worker.logs.filter((l) => l.includes('interrupted by the shutdown')).map((l) => JSON.parse(l))[0];
    assert.ok(interrupted, housekeepingLines(worker));
    assert.equal(interrupted.level, 30, JSON.stringify(interrupted));
    assert.equal(interrupted.what, 'tasks past retention');
    assert.ok(!worker.logs.some((l) => l.includes('housekeeping pass failed') || l.includes('a batch took too long')), housekeepingLines(worker));
    assert.equal(left, 1001, 'the batch rolled back');
  });
});

describe('task retention off (TASK_RETENTION_DAYS=0, the default)', function () {
  this.timeout(60_000);
  const stack = useStack({ JOB_RECOVERY_MS: '200' });

  it('keeps ended tasks however old', async () => {
    const old = await taskIn(stack, 'completed');
    await age(old.id, 3650);
    // Passes run every 200 ms: wait through several.
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal((await stack.client.get(`${T}/${old.id}`)).status, 200);
    assert.equal(await contextExists(old.context_id), true);
  });
});

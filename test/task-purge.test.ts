// The purge of ended tasks (db/task-purge.ts) against concurrent writers, driven statement by
// statement on real connections: intakes into the contexts it empties (db/tasks.ts
// insertTaskBundles, the intake statement), tasks a request holds, and a second purger; and what its
// statements read when many tasks created before the cutoff ended after it.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { lockWaits, resetDb, testDb, waitFor } from './helpers/stack.ts';
import { purgeEndedTasks, thinNextEndedTask } from '../db/task-purge.ts';
import { advisoryXactLock } from '../db/advisory-locks.ts';
import type { Knex } from 'knex';
import { createDb } from '../db/knex.ts';
import { insertTaskBundles, type TaskBundle } from '../db/tasks.ts';

const DAY = 86400_000;
const before = () => new Date(Date.now() - 7 * DAY);
// The batch timeout: far beyond what these batches take, and the locks they wait on are held.
const BATCH_TIMEOUT_MS = 30_000;

function bundle(contextId: string): TaskBundle {
  const id = randomUUID();
  const at = new Date();
  const message = { id: randomUUID(), task_id: id, role: 'user' as const, parts: [{ type: 'text-part', text: 'hi' }], reference_task_ids: [], metadata: {}, created_at: at.toISOString() };
  return {
    task: { id, context_id: contextId, status: 'submitted', status_timestamp: at, status_message_id: null, metadata: {}, created_at: at, updated_at: at },
    message: message as never,
    timeline: [{ id: randomUUID(), task_id: id, created_at: at.toISOString(), event_payload: { type: 'task-status-update', status: 'submitted' } } as never],
    opening: false,
  };
}

// An ended task, 10 days old, alone in a new context.
async function oldTask(contextId = randomUUID()): Promise<{ id: string; context_id: string }> {
  const db = testDb();
  const b = bundle(contextId);
  await insertTaskBundles(db, [b]);
  await db('tasks').where({ id: b.task.id }).update({ status: 'completed', created_at: new Date(Date.now() - 10 * DAY), status_timestamp: new Date(Date.now() - 10 * DAY) });
  return { id: b.task.id, context_id: contextId };
}

// The purge waits in its lock of the contexts (lockContexts), an intake in its one statement.
const purgeWaits = () => lockWaits('select id from contexts %');
const intakeWaits = () => lockWaits('with b as %');
const exists = async (table: string, id: string) => !!(await testDb()(table).where({ id }).first());

describe('purge of ended tasks vs concurrent writers', function () {
  this.timeout(30_000);
  beforeEach(resetDb);

  it('an intake into the context, committed while the purge waits on it, keeps the context', async () => {
    const db = testDb();
    const old = await oldTask();
    const trx = await db.transaction();
    const fresh = bundle(old.context_id);
    await insertTaskBundles(trx, [fresh]); // holds the context's row (its foreign key check) until commit
    const purge = purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS);
    await waitFor(async () => (await purgeWaits()) === 1, 'the purge to wait for the intake');
    await trx.commit();
    assert.deepEqual(await purge, { tasks: 1, contexts: 0 });
    assert.equal(await exists('tasks', old.id), false);
    assert.equal(await exists('contexts', old.context_id), true);
    assert.equal(await exists('tasks', fresh.task.id), true);
  });

  it('an intake that rolls back while the purge waits leaves the context to be deleted', async () => {
    const db = testDb();
    const old = await oldTask();
    const trx = await db.transaction();
    await insertTaskBundles(trx, [bundle(old.context_id)]);
    const purge = purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS);
    await waitFor(async () => (await purgeWaits()) === 1, 'the purge to wait for the intake');
    await trx.rollback();
    assert.deepEqual(await purge, { tasks: 1, contexts: 1 });
    assert.equal(await exists('contexts', old.context_id), false);
  });

  it('an intake that arrives while the purge holds the deleted context waits, then recreates it', async () => {
    const db = testDb();
    const old = await oldTask();
    // The purge's own steps, held open before commit (the same statements as purgeEndedTasks).
    const purge = await db.transaction();
    await purge.raw(`delete from tasks where id = ?`, [old.id]);
    await purge('contexts').where({ id: old.context_id }).delete();
    const intake = insertTaskBundles(db, [bundle(old.context_id)]);
    await waitFor(async () => (await intakeWaits()) === 1, 'the intake to wait (ON CONFLICT on a row being deleted)');
    await purge.commit();
    await intake;
    assert.equal(await exists('contexts', old.context_id), true);
  });

  it('an intake that arrives while the purge holds the context, before its delete, waits, then recreates it', async () => {
    const db = testDb();
    const old = await oldTask();
    // The purge's own steps: its ended task deleted and its contexts locked (lockContexts), the delete of
    // the emptied ones still to come. (An intake that did not lock the context wrote its task, then
    // failed its foreign key check once the purge deleted the context: 23503.)
    const purge = await db.transaction();
    await purge.raw(`delete from tasks where id = ?`, [old.id]);
    await purge.raw(`select id from contexts where id = ? for update`, [old.context_id]);
    const fresh = bundle(old.context_id);
    const intake = insertTaskBundles(db, [fresh]).then(() => 'ok', (e) => e.code as string);
    await waitFor(async () => (await intakeWaits()) === 1, 'the intake to wait for the purge');
    assert.equal(await purge('contexts').where({ id: old.context_id }).delete(), 1);
    await purge.commit();
    assert.equal(await intake, 'ok');
    assert.equal(await exists('contexts', old.context_id), true);
    assert.equal(await exists('tasks', fresh.task.id), true);
  });

  it('an intake holding a context the purge keeps, and needing one it empties, waits without a deadlock', async () => {
    // An intake locks the existing contexts it writes to in id order, each until it commits; here one
    // transaction's two intakes stand for one statement's (which takes c1, then c2). The purge takes
    // them in id order too: it waits for c1 before it holds c2. (Before db/task-purge.ts lockContexts,
    // it deleted c2 (emptied) and then waited for c1 for the intake, which waited for c2: 40P01.)
    const db = testDb();
    const [c1, c2] = [randomUUID(), randomUUID()].sort();
    await oldTask(c1);
    await oldTask(c2);
    const kept = bundle(c1);
    await insertTaskBundles(db, [kept]); // c1 keeps a task
    const c1MadeAt = (await db('contexts').where({ id: c1 }).first()).created_at.getTime();
    const intake = await db.transaction();
    const late = bundle(c2);
    try {
      await insertTaskBundles(intake, [bundle(c1)]);
      const purge = purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS).then((r) => r, (e) => e.code as string);
      await waitFor(async () => (await purgeWaits()) === 1, 'the purge to wait for the intake');
      assert.equal(await insertTaskBundles(intake, [late]).then(() => 'ok', (e) => e.code as string), 'ok');
      await intake.commit();
      assert.deepEqual(await purge, { tasks: 2, contexts: 0 });
    } finally {
      if (!intake.isCompleted()) await intake.rollback();
    }
    assert.equal(await exists('contexts', c2), true);
    assert.equal(await exists('tasks', late.task.id), true);
    assert.equal((await db('contexts').where({ id: c1 }).first()).created_at.getTime(), c1MadeAt);
  });

  it('a locked expired task is skipped, not waited for; a second purger gets null while one runs', async () => {
    const db = testDb();
    const a = await oldTask();
    const b = await oldTask();
    const holder = await db.transaction();
    await holder('tasks').where({ id: a.id }).forUpdate();
    assert.deepEqual(await purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS), { tasks: 1, contexts: 1 });
    assert.equal(await exists('tasks', a.id), true);
    assert.equal(await exists('tasks', b.id), false);
    await advisoryXactLock(holder, 'taskbridge:purge-ended-tasks');
    assert.equal(await purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS), null);
    await holder.rollback();
    assert.deepEqual(await purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS), { tasks: 1, contexts: 1 });
  });
});

// A pool's own counts (tarn): what a test waits on to order the acquires of a pool of its own.
type PoolCounts = { numPendingAcquires(): number; numUsed(): number };
const poolOf = (db: ReturnType<typeof createDb>) => (db.client as unknown as { pool: PoolCounts }).pool;

// An ended task holding `rows` timeline items more than its first.
async function heavyTask(rows: number): Promise<{ id: string; context_id: string }> {
  const t = await oldTask();
  await testDb().raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                      select gen_random_uuid(), ?, '{"type":"task-status-update","status":"working"}', now() from generate_series(1, ?::int)`, [t.id, rows]);
  return t;
}
const itemsOf = async (taskId: string) => Number((await testDb()('timeline_items').where({ task_id: taskId }).count({ n: '*' }))[0].n);

describe('purge of ended tasks: a worker\'s stop', function () {
  this.timeout(30_000);
  beforeEach(resetDb);

  it('an interrupt whose end runs after the batch committed leaves the batch\'s connection, serving another caller by then, alone', async () => {
    // A pool of two: the end (pg_terminate_backend) waits for a connection behind another caller,
    // which gets the batch's once it commits. Ending the backend by its pid alone, it killed that caller.
    const pool = createDb(process.env.DATABASE_URL!, { min: 0, max: 2 });
    const counts = poolOf(pool);
    const lock = await testDb().transaction();
    let other: Knex.Transaction | undefined;
    let held: Knex.Transaction | undefined;
    try {
      const old = await oldTask();
      await lock.raw('select id from contexts where id = ? for update', [old.context_id]);
      const interrupt = new AbortController();
      const purge = purgeEndedTasks(pool, before(), 1000, BATCH_TIMEOUT_MS, interrupt.signal);
      await waitFor(async () => (await purgeWaits()) === 1, 'the purge to wait on the held context');
      other = await pool.transaction();
      const heldNext = pool.transaction();
      await waitFor(async () => counts.numPendingAcquires() === 1, 'the caller to wait for a connection');
      interrupt.abort();
      await waitFor(async () => counts.numPendingAcquires() === 2, 'the end to wait for a connection');
      await lock.commit();
      assert.deepEqual(await purge, { tasks: 1, contexts: 1 });
      held = await heldNext;
      await other.commit();
      await waitFor(async () => counts.numPendingAcquires() === 0 && counts.numUsed() === 1, 'the end to run');
      assert.deepEqual((await held.raw('select 1 as one')).rows, [{ one: 1 }]);
      await held.commit();
    } finally {
      if (!lock.isCompleted()) await lock.rollback();
      if (other && !other.isCompleted()) await other.rollback();
      if (held && !held.isCompleted()) await held.rollback().catch(() => undefined);
      await pool.destroy();
    }
  });

  it('an interrupt that fired before the batch began: the batch deletes nothing and fails', async () => {
    const old = await oldTask();
    const interrupt = new AbortController();
    interrupt.abort();
    await assert.rejects(purgeEndedTasks(testDb(), before(), 1000, BATCH_TIMEOUT_MS, interrupt.signal), { name: 'AbortError' });
    assert.equal(await exists('tasks', old.id), true);
  });

  it('the thinning times out at its own timeout, the connection having none', async () => {
    // The test database's connections have no statement_timeout (as with DB_QUERY_TIMEOUT_MS=0).
    const t = await heavyTask(50_000);
    await assert.rejects(thinNextEndedTask(testDb(), before(), 50_000, 1), { code: '57014' });
    assert.equal(await itemsOf(t.id), 50_001);
  });

  it('the thinning starts no further chunk once the worker stops', async () => {
    const t = await heavyTask(300);
    const stopping = new AbortController();
    stopping.abort();
    assert.equal(await thinNextEndedTask(testDb(), before(), 100, BATCH_TIMEOUT_MS, { stopping: stopping.signal, interrupt: new AbortController().signal }), 0);
    assert.equal(await itemsOf(t.id), 301);
  });

  it('an interrupt ends the thinning\'s chunk in flight, which rolls back', async () => {
    const t = await heavyTask(300);
    const lock = await testDb().transaction();
    try {
      await lock.raw('select id from timeline_items where task_id = ? limit 1 for update', [t.id]);
      const interrupt = new AbortController();
      const thin = thinNextEndedTask(testDb(), before(), 1000, BATCH_TIMEOUT_MS, { stopping: new AbortController().signal, interrupt: interrupt.signal })
        .then(() => 'went on', (e: Error) => e.message);
      await waitFor(async () => (await lockWaits('delete from "timeline_items"%')) === 1, 'the chunk to wait on the held row');
      interrupt.abort();
      assert.match(await thin, /Connection terminated unexpectedly/);
      assert.deepEqual((await lock.raw('select 1 as one')).rows, [{ one: 1 }]);
    } finally {
      await lock.rollback();
    }
    assert.equal(await itemsOf(t.id), 301);
  });
});

// The rows of `tasks` a statement read to find the tasks it takes (EXPLAIN ANALYZE, in a transaction
// rolled back): those the scans under its row locking (FOR UPDATE) returned and those their filters
// dropped, over all their loops. Not the delete's own read of the tasks found, by their ids: a
// statement that expects up to its limit of them may as well read the table then, if it is small.
async function tasksRead(sql: string, bindings: unknown[]): Promise<number> {
  const trx = await testDb().transaction();
  try {
    const { rows: [row] } = await trx.raw(`explain (analyze, format json) ${sql.replace(/\$\d+/g, '?')}`, bindings as never[]);
    let read = 0;
    const walk = (node: Record<string, unknown>, locking: boolean) => {
      if (locking && node['Relation Name'] === 'tasks') {
        const n = (k: string) => Number(node[k] ?? 0);
        read += (n('Actual Rows') + n('Rows Removed by Filter') + n('Rows Removed by Index Recheck')) * n('Actual Loops');
      }
      for (const child of (node.Plans ?? []) as Record<string, unknown>[]) walk(child, locking || node['Node Type'] === 'LockRows');
    };
    walk(row['QUERY PLAN'][0].Plan, false);
    return read;
  } finally {
    await trx.rollback();
  }
}

// The statements sent through the test database while `run` runs (knex's query events).
async function statementsOf(run: () => Promise<unknown>): Promise<{ sql: string; bindings: unknown[] }[]> {
  const seen: { sql: string; bindings: unknown[] }[] = [];
  const listen = (q: { sql: string; bindings?: unknown[] }) => seen.push({ sql: q.sql, bindings: q.bindings ?? [] });
  testDb().on('query', listen);
  try {
    await run();
  } finally {
    testDb().off('query', listen);
  }
  return seen;
}

describe('purge of ended tasks: what a batch reads', function () {
  this.timeout(60_000);
  beforeEach(resetDb);

  it('reaches the tasks due directly, past those created before the cutoff that ended after it or have not ended', async () => {
    // 20,000 tasks created 30 days ago that ended a day ago (long runs), 5,000 created as long ago that
    // have not ended, then 10 created 20 days ago that ended 10 days ago, the only ones due. Read by
    // created_at, a batch and the thinning's look-up read all 20,000 with nothing due, and those of a
    // status before its due ones otherwise; the counts are the plans' rows, not times.
    const db = testDb();
    const late = 20_000;
    const due = 10;
    const { rows: [c] } = await db.raw(`insert into contexts (id, created_at) values (gen_random_uuid(), now() - interval '30 days') returning id`);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
      select gen_random_uuid(), ?, (array['completed', 'canceled', 'failed', 'rejected'])[1 + g % 4], now() - interval '1 day', '{}',
             now() - interval '30 days' + g * interval '1 ms', now() - interval '1 day'
        from generate_series(1, ?::int) g`, [c.id, late]);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
      select gen_random_uuid(), ?, (array['submitted', 'working', 'input-required'])[1 + g % 3], now() - interval '30 days', '{}',
             now() - interval '30 days' + g * interval '1 ms', now() - interval '30 days'
        from generate_series(1, 5000) g`, [c.id]);
    const seedDue = () => db.raw(`with c as (insert into contexts (id, created_at) select gen_random_uuid(), now() - interval '20 days' from generate_series(1, ?::int) returning id)
      insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
      select gen_random_uuid(), c.id, 'completed', now() - interval '10 days', '{}', now() - interval '20 days', now() - interval '10 days' from c`, [due]);
    await seedDue();
    await db.raw('analyze tasks');

    const purged = await statementsOf(async () => assert.deepEqual(await purgeEndedTasks(db, before(), 1000, BATCH_TIMEOUT_MS), { tasks: due, contexts: due }));
    const batch = purged.find((q) => /^\s*delete from tasks\b/i.test(q.sql));
    assert.ok(batch, purged.map((q) => q.sql).join('\n'));
    const thinned = await statementsOf(async () => assert.equal(await thinNextEndedTask(db, before(), 2000, BATCH_TIMEOUT_MS), 0));
    const next = thinned.find((q) => /for update skip locked/i.test(q.sql));
    assert.ok(next, thinned.map((q) => q.sql).join('\n'));
    assert.equal(Number((await db('tasks').count({ n: '*' }))[0].n), late + 5000);

    // Nothing due: the batch and the thinning's look-up read (next to) nothing.
    const idle = { batch: await tasksRead(batch.sql, batch.bindings), next: await tasksRead(next.sql, next.bindings) };
    assert.ok(idle.batch < 100 && idle.next < 100, `tasks read with nothing due: ${JSON.stringify(idle)}`);
    // Due tasks again: a batch reads them, not the others.
    await seedDue();
    await db.raw('analyze tasks');
    const busy = { batch: await tasksRead(batch.sql, batch.bindings), next: await tasksRead(next.sql, next.bindings) };
    assert.ok(busy.batch >= due && busy.batch < 100 && busy.next < 100, `tasks read with ${due} due: ${JSON.stringify(busy)}`);
  });
});

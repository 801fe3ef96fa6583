// The purge of ended tasks (db/task-purge.ts) against concurrent writers, driven statement by
// statement on real connections: intakes into the contexts it empties (db/tasks.ts
// insertTaskBundles, the intake statement), tasks a request holds, and a second purger.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, testDb, waitFor } from './helpers/stack.ts';
import { purgeEndedTasks } from '../db/task-purge.ts';
import { insertTaskBundles, type TaskBundle } from '../db/tasks.ts';

const DAY = 86400_000;
const before = () => new Date(Date.now() - 7 * DAY);

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

const waitingOnLock = async () => Number((await testDb().raw(`select count(*) n from pg_stat_activity where wait_event_type = 'Lock'`)).rows[0].n);
const exists = async (table: string, id: string) => !!(await testDb()(table).where({ id }).first());

describe('purge of ended tasks vs concurrent writers', function () {
  this.timeout(30_000);
  beforeEach(resetDb);

  it('an intake into the context, committed while the purge waits on it, keeps the context', async () => {
    const db = testDb();
    const old = await oldTask();
    const trx = await db.transaction();
    const fresh = bundle(old.context_id);
    await insertTaskBundles(trx, [fresh]); // holds the context's row (its on conflict update) until commit
    const purge = purgeEndedTasks(db, before(), 1000);
    await waitFor(async () => (await waitingOnLock()) === 1, 'the purge to wait for the intake');
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
    const purge = purgeEndedTasks(db, before(), 1000);
    await waitFor(async () => (await waitingOnLock()) === 1, 'the purge to wait for the intake');
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
    await waitFor(async () => (await waitingOnLock()) === 1, 'the intake to wait (ON CONFLICT on a row being deleted)');
    await purge.commit();
    await intake;
    assert.equal(await exists('contexts', old.context_id), true);
  });

  it('an intake holding a context the purge restamps, and needing one it empties, waits without a deadlock', async () => {
    // An intake locks the existing contexts it writes to in id order, each until it commits; here one
    // transaction's two intakes stand for one statement's (which takes c1, then c2). Before, the purge
    // deleted c2 (emptied) and then waited at its restamp of c1 for the intake, which waited for c2:
    // 40P01 for one of them.
    const db = testDb();
    const [c1, c2] = [randomUUID(), randomUUID()].sort();
    await oldTask(c1);
    await oldTask(c2);
    const kept = bundle(c1);
    await insertTaskBundles(db, [kept]); // c1 keeps a task, and is restamped to it
    const intake = await db.transaction();
    const late = bundle(c2);
    try {
      await insertTaskBundles(intake, [bundle(c1)]);
      const purge = purgeEndedTasks(db, before(), 1000).then((r) => r, (e) => e.code as string);
      await waitFor(async () => (await waitingOnLock()) === 1, 'the purge to wait for the intake');
      assert.equal(await insertTaskBundles(intake, [late]).then(() => 'ok', (e) => e.code as string), 'ok');
      await intake.commit();
      assert.deepEqual(await purge, { tasks: 2, contexts: 0 });
    } finally {
      if (!intake.isCompleted()) await intake.rollback();
    }
    assert.equal(await exists('contexts', c2), true);
    assert.equal(await exists('tasks', late.task.id), true);
    assert.equal((await db('contexts').where({ id: c1 }).first()).created_at.getTime(), kept.task.created_at.getTime());
  });

  it('a locked expired task is skipped, not waited for; a second purger gets null while one runs', async () => {
    const db = testDb();
    const a = await oldTask();
    const b = await oldTask();
    const holder = await db.transaction();
    await holder('tasks').where({ id: a.id }).forUpdate();
    assert.deepEqual(await purgeEndedTasks(db, before(), 1000), { tasks: 1, contexts: 1 });
    assert.equal(await exists('tasks', a.id), true);
    assert.equal(await exists('tasks', b.id), false);
    await holder.raw(`select pg_advisory_xact_lock(hashtext('taskbridge:purge-ended-tasks'))`);
    assert.equal(await purgeEndedTasks(db, before(), 1000), null);
    await holder.rollback();
    assert.deepEqual(await purgeEndedTasks(db, before(), 1000), { tasks: 1, contexts: 1 });
  });
});

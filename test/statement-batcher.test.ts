// db/statement-batcher.ts with the task intake statement, against the real database: intakes that
// share a statement succeed or fail alone.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, testDb } from './helpers/stack.ts';
import { StatementBatcher } from '../db/statement-batcher.ts';
import { applyStatusChanges, beginRuns, insertTaskBundles, type TaskBundle } from '../db/tasks.ts';

function bundle(text: string, id: string = randomUUID()): TaskBundle {
  const at = new Date();
  const iso = at.toISOString();
  const message = { id: randomUUID(), task_id: id, role: 'user' as const, parts: [{ type: 'text-part' as const, text }], reference_task_ids: [], metadata: {}, created_at: iso };
  return {
    task: { id, context_id: randomUUID(), status: 'submitted', status_timestamp: at, status_message_id: null, metadata: {}, created_at: at, updated_at: at },
    message,
    timeline: [
      { id: randomUUID(), task_id: id, created_at: iso, event_payload: { type: 'task-status-update', status: 'submitted' } },
      { id: randomUUID(), task_id: id, created_at: iso, event_payload: { type: 'message', message } },
    ],
    opening: false,
  };
}

describe('statement batcher (task intake)', () => {
  before(resetDb);

  it('writes bundles queued behind a running statement together, each with its own timeline seqs in order', async () => {
    const statements: number[] = [];
    const writer = new StatementBatcher((b: TaskBundle[]) => { statements.push(b.length); return insertTaskBundles(testDb(), b); }, { maxInFlight: 1 });
    const bundles = Array.from({ length: 20 }, (_, i) => bundle(`b${i}`));
    const seqs = await Promise.all(bundles.map((b) => writer.execute(b)));
    // The first runs at once; the 19 queued behind it share the next statement.
    assert.deepEqual(statements, [1, 19]);
    for (const [i, b] of bundles.entries()) {
      assert.ok(seqs[i]);
      assert.equal(seqs[i].length, 2);
      assert.ok(seqs[i][0] < seqs[i][1]);
      const items = await testDb()('timeline_items').where({ task_id: b.task.id }).orderBy('seq');
      assert.deepEqual(items.map((r) => Number(r.seq)), seqs[i]);
      assert.deepEqual(items.map((r) => r.event_payload.type), ['task-status-update', 'message']);
    }
  });

  it('fails only the bad bundle of a batch: the others are written', async () => {
    const statements: string[][] = [];
    const writer = new StatementBatcher((b: TaskBundle[]) => {
      statements.push(b.map((x) => (x.message.parts[0] as { text: string }).text));
      return insertTaskBundles(testDb(), b);
    }, { maxInFlight: 1 });
    const first = bundle('first');
    await writer.execute(first);
    const blocker = writer.execute(bundle('runs alone'));
    // Queued while the first statement still counts as running, these three go into one statement
    // (with `blocker`), which the duplicate task id fails.
    const results = await Promise.allSettled([writer.execute(bundle('ok 1')), writer.execute(bundle('duplicate', first.task.id)), writer.execute(bundle('ok 2'))]);
    await blocker;
    assert.deepEqual(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
    assert.match(String((results[1] as PromiseRejectedResult).reason), /duplicate key/);
    // The three did share a statement, which failed; then each was written alone.
    const shared = statements.findIndex((st) => ['ok 1', 'duplicate', 'ok 2'].every((t) => st.includes(t)));
    assert.ok(shared >= 0, JSON.stringify(statements));
    assert.deepEqual(statements.slice(shared + 1), statements[shared].map((t) => [t]), JSON.stringify(statements));
    const texts = (await testDb()('messages').select('parts')).map((r) => r.parts[0].text).sort();
    assert.deepEqual(texts, ['first', 'ok 1', 'ok 2', 'runs alone'].concat(Array.from({ length: 20 }, (_, i) => `b${i}`)).sort());
  });
});

describe('task intake and contexts', () => {
  it('a context keeps the time it was made with: a task of it stamped earlier (another API\'s clock) and written later does not move it', async () => {
    const first = bundle('first');
    const later = bundle('later');
    later.task.context_id = first.task.context_id;
    for (const [b, ms] of [[first, 0], [later, 50]] as const) {
      const at = new Date(Date.parse('2026-01-01T00:00:00Z') + ms);
      Object.assign(b.task, { created_at: at, status_timestamp: at, updated_at: at });
    }
    // The later-stamped statement commits first, as it may when two intakes open one context: it made
    // the context. list-contexts pages on that time, so it never moves (back, or forward).
    await insertTaskBundles(testDb(), [later]);
    await insertTaskBundles(testDb(), [first]);
    const row = await testDb()('contexts').where({ id: first.task.context_id }).first();
    assert.equal(row.created_at.toISOString(), '2026-01-01T00:00:00.050Z');
    const last = bundle('last');
    last.task.context_id = first.task.context_id;
    await insertTaskBundles(testDb(), [last]);
    assert.equal((await testDb()('contexts').where({ id: first.task.context_id }).first()).created_at.toISOString(), '2026-01-01T00:00:00.050Z');
  });
});

describe('batched task statements', () => {
  const statusItem = (taskId: string, status: 'working' | 'canceled' | 'input-required') =>
    ({ id: randomUUID(), task_id: taskId, created_at: new Date().toISOString(), event_payload: { type: 'task-status-update' as const, status } });
  const start = (b?: TaskBundle) => {
    const taskId = b?.task.id ?? randomUUID();
    return { taskId, messageId: b?.message.id ?? randomUUID(), historyLimit: 10, historyMaxBytes: 1024 * 1024, at: new Date(), from: ['submitted', 'input-required', 'auth-required'] as const, timelineItem: statusItem(taskId, 'working') };
  };

  it('beginRuns starts a submitted task once and reports, without changing them, terminal, answered and unknown tasks', async () => {
    const [a, canceled, asked] = [bundle('run a'), bundle('canceled'), bundle('asked')];
    await insertTaskBundles(testDb(), [a, canceled, asked]);
    const reply = { id: randomUUID(), task_id: asked.task.id, role: 'agent' as const, parts: [{ type: 'text-part' as const, text: 'which one?' }], reference_task_ids: [], metadata: {}, created_at: new Date(Date.now() + 5).toISOString() };
    await applyStatusChanges(testDb(), [
      { taskId: canceled.task.id, to: 'canceled', from: ['submitted'], at: new Date(), timeline: [statusItem(canceled.task.id, 'canceled')] },
      { taskId: asked.task.id, to: 'input-required', from: ['submitted'], at: new Date(Date.now() + 5), message: reply, timeline: [statusItem(asked.task.id, 'input-required')] },
    ]);
    const [ra, rc, rq, unknown] = await beginRuns(testDb(), [start(a), start(canceled), start(asked), start()]);
    assert.equal(ra?.started, true);
    assert.equal(ra?.task.status, 'working');
    assert.equal(ra?.trigger?.id, a.message.id);
    assert.deepEqual(ra?.history.map((m) => m.id), [a.message.id]);
    const items = await testDb()('timeline_items').where({ task_id: a.task.id }).orderBy('seq');
    assert.deepEqual(items.map((i) => i.event_payload), [{ type: 'task-status-update', status: 'submitted' }, { type: 'message', message: a.message }, { type: 'task-status-update', status: 'working' }]);
    assert.equal(Number(items[2].seq), ra?.seq);
    assert.deepEqual([rc?.started, rc?.task.status], [false, 'canceled']);
    assert.deepEqual([rq?.started, rq?.answered, rq?.task.status], [false, true, 'input-required']);
    assert.equal(unknown, undefined);
    // A second start of the same run (a re-run after a crash) finds it working and writes nothing.
    const [again] = await beginRuns(testDb(), [start(a)]);
    assert.deepEqual([again?.started, again?.task.status], [false, 'working']);
    assert.equal(Number((await testDb()('timeline_items').where({ task_id: a.task.id }).count({ n: '*' }))[0].n), 3);
  });

  it('two statements changing the same tasks in opposite orders do not deadlock', async () => {
    const bundles = Array.from({ length: 20 }, (_, i) => bundle(`d${i}`));
    await insertTaskBundles(testDb(), bundles);
    const change = (taskId: string) => ({
      taskId, to: 'working' as const, from: ['submitted', 'working'] as const, at: new Date(),
      timeline: [{ id: randomUUID(), task_id: taskId, created_at: new Date().toISOString(), event_payload: { type: 'task-status-update' as const, status: 'working' as const } }],
    });
    const ids = bundles.map((b) => b.task.id);
    for (let round = 0; round < 10; round++) {
      const [a, b] = await Promise.all([applyStatusChanges(testDb(), ids.map(change)), applyStatusChanges(testDb(), [...ids].reverse().map(change))]);
      assert.ok([...a, ...b].every((r) => r.task?.status === 'working'));
    }
    const items = await testDb()('timeline_items').whereIn('task_id', ids).where('event_payload', '@>', JSON.stringify({ status: 'working' })).count({ n: '*' });
    assert.equal(Number(items[0].n), 20 * 2 * 10);
  });

  it('a change with maxMessageBytes applies per task in a batch: within the cap, over it, not counted yet, no cap', async () => {
    const bundles = Array.from({ length: 8 }, (_, i) => bundle(`m${i}`));
    await insertTaskBundles(testDb(), bundles);
    // Held: 0, 100, ..., 600 bytes; the last task not counted yet.
    for (const [i, b] of bundles.entries()) await testDb()('tasks').where({ id: b.task.id }).update({ message_bytes: i === 7 ? null : i * 100 });
    const change = (b: TaskBundle, max?: number) => {
      const at = new Date();
      const message = { id: randomUUID(), task_id: b.task.id, role: 'agent' as const, parts: [{ type: 'text-part' as const, text: 'x'.repeat(100) }], reference_task_ids: [], metadata: {}, created_at: at.toISOString() };
      return { taskId: b.task.id, to: 'input-required' as const, from: ['submitted'] as const, at, message, timeline: [statusItem(b.task.id, 'input-required')], maxMessageBytes: max };
    };
    const adding = Buffer.byteLength(JSON.stringify([{ type: 'text-part', text: 'x'.repeat(100) }]));
    const order = [5, 2, 7, 0, 6, 3, 1, 4];
    const results = await applyStatusChanges(testDb(), order.map((i) => change(bundles[i], i === 6 ? undefined : 400)));
    const fits = (i: number) => i === 6 || i === 7 || i * 100 + adding <= 400;
    for (const [k, i] of order.entries()) {
      assert.equal(results[k].task?.status, fits(i) ? 'input-required' : undefined, `task ${i}`);
      const row = await testDb()('tasks').where({ id: bundles[i].task.id }).first();
      assert.equal(row.status, fits(i) ? 'input-required' : 'submitted', `task ${i}`);
      assert.equal(row.message_bytes === null ? null : Number(row.message_bytes), i === 7 ? null : i * 100 + (fits(i) ? adding : 0), `task ${i}`);
      const agentMessages = await testDb()('messages').where({ task_id: bundles[i].task.id, role: 'agent' }).count({ n: '*' });
      assert.equal(Number(agentMessages[0].n), fits(i) ? 1 : 0, `task ${i}`);
    }
  });
});

describe('statement batcher (rules)', () => {
  const pause = (ms = 5) => new Promise((r) => setTimeout(r, ms));
  const dataError = Object.assign(new Error('duplicate key value violates unique constraint'), { code: '23505' });

  it('never writes two items with the same key at the same time, and keeps each key\'s items in order', async () => {
    const batches: string[][] = [];
    const running = new Set<string>();
    const batcher = new StatementBatcher(async (items: string[]) => {
      for (const i of items) {
        assert.ok(!running.has(i[0]), `${i[0]} written twice at once`);
        running.add(i[0]);
      }
      batches.push(items);
      await pause();
      for (const i of items) running.delete(i[0]);
      return items.map((i) => i.toUpperCase());
    }, { maxInFlight: 2, key: (i) => i[0] });
    const out = await Promise.all(['a1', 'b1', 'a2', 'c1', 'a3', 'b2'].map((i) => batcher.execute(i)));
    assert.deepEqual(out, ['A1', 'B1', 'A2', 'C1', 'A3', 'B2']);
    const order = batches.flat();
    for (const k of 'abc') assert.deepEqual(order.filter((i) => i[0] === k), ['a1', 'b1', 'a2', 'c1', 'a3', 'b2'].filter((i) => i[0] === k));
    assert.deepEqual(batches[0], ['a1']);
    assert.deepEqual(batches[1], ['b1']);
  });

  it('caps a statement at maxBatch items and at maxBatchBytes (but always takes one item)', async () => {
    const sizes: number[][] = [];
    const batcher = new StatementBatcher(async (items: number[]) => { sizes.push(items); await pause(); return items; }, { maxInFlight: 1, maxBatch: 4, size: (n) => n, maxBatchBytes: 10 });
    await Promise.all([1, 1, 1, 1, 1, 1, 8, 3, 20, 1].map((i) => batcher.execute(i)));
    assert.deepEqual(sizes, [[1], [1, 1, 1, 1], [1, 8], [3], [20], [1]]);
  });

  it('retries alone only on a data error (one bad item); other errors fail the batch without re-running it', async () => {
    let calls = 0;
    const batcher = new StatementBatcher(async (items: string[]) => {
      calls += 1;
      await pause();
      if (items.includes('bad')) throw dataError;
      if (items.includes('down')) throw Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
      return items;
    }, { maxInFlight: 1 });
    await batcher.execute('first');
    const first = batcher.execute('runs alone');
    const mixed = await Promise.allSettled(['ok 1', 'bad', 'ok 2'].map((i) => batcher.execute(i)));
    await first;
    assert.deepEqual(mixed.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
    calls = 0;
    const blocker = batcher.execute('runs alone');
    const down = await Promise.allSettled(['x', 'down', 'y'].map((i) => batcher.execute(i)));
    await blocker;
    assert.deepEqual(down.map((r) => r.status), ['rejected', 'rejected', 'rejected']);
    assert.equal(calls, 2, 'the failed batch ran once');
  });

  it('fails every item of a batch whose statement returns the wrong number of results', async () => {
    const batcher = new StatementBatcher(async (items: number[]) => items.slice(1), { maxInFlight: 1 });
    await assert.rejects(batcher.execute(1), /0 results for 1 items/);
  });

  it('refuses with 503 when too many items wait, and items that waited too long', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => { release = r; });
    const batcher = new StatementBatcher(async (items: number[]) => { await gate; return items; }, { maxInFlight: 1, maxQueued: 2, queueTimeoutMs: 50 });
    const running = batcher.execute(0);
    const waiting = [batcher.execute(1), batcher.execute(2)];
    await assert.rejects(batcher.execute(3), (err: { status?: number }) => err.status === 503);
    await pause(80);
    release();
    assert.equal(await running, 0);
    for (const w of waiting) await assert.rejects(w, (err: { status?: number }) => err.status === 503);
  });
});

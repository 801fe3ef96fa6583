// db/statement-batcher.ts with the task intake statement, against the real database: intakes that
// share a statement succeed or fail alone.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, testDb } from './helpers/stack.ts';
import { StatementBatcher } from '../db/statement-batcher.ts';
import { insertTaskBundles, type TaskBundle } from '../db/tasks.ts';

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
  };
}

describe('statement batcher (task intake)', () => {
  before(resetDb);

  it('writes bundles queued behind a running statement together, each with its own timeline seqs in order', async () => {
    const writer = new StatementBatcher((b: TaskBundle[]) => insertTaskBundles(testDb(), b), { maxInFlight: 1 });
    const bundles = Array.from({ length: 20 }, (_, i) => bundle(`b${i}`));
    const seqs = await Promise.all(bundles.map((b) => writer.execute(b)));
    for (const [i, b] of bundles.entries()) {
      assert.equal(seqs[i].length, 2);
      assert.ok(seqs[i][0] < seqs[i][1]);
      const items = await testDb()('timeline_items').where({ task_id: b.task.id }).orderBy('seq');
      assert.deepEqual(items.map((r) => Number(r.seq)), seqs[i]);
      assert.deepEqual(items.map((r) => r.event_payload.type), ['task-status-update', 'message']);
    }
  });

  it('fails only the bad bundle of a batch: the others are written', async () => {
    const writer = new StatementBatcher((b: TaskBundle[]) => insertTaskBundles(testDb(), b), { maxInFlight: 1 });
    const first = bundle('first');
    await writer.execute(first);
    const blocker = writer.execute(bundle('runs alone'));
    // Queued behind `blocker`, these three go into one statement, which the duplicate task id fails.
    const results = await Promise.allSettled([writer.execute(bundle('ok 1')), writer.execute(bundle('duplicate', first.task.id)), writer.execute(bundle('ok 2'))]);
    await blocker;
    assert.deepEqual(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
    assert.match(String((results[1] as PromiseRejectedResult).reason), /duplicate key/);
    const texts = (await testDb()('messages').select('parts')).map((r) => r.parts[0].text).sort();
    assert.deepEqual(texts, ['first', 'ok 1', 'ok 2', 'runs alone'].concat(Array.from({ length: 20 }, (_, i) => `b${i}`)).sort());
  });
});

describe('statement batcher (rules)', () => {
  it('never puts two items with the same key in one statement, and keeps each key\'s items in order', async () => {
    const batches: string[][] = [];
    const batcher = new StatementBatcher(async (items: string[]) => {
      batches.push(items);
      await new Promise((r) => setTimeout(r, 5));
      return items.map((i) => i.toUpperCase());
    }, { maxInFlight: 1, key: (i) => i[0] });
    const out = await Promise.all(['a1', 'b1', 'a2', 'c1', 'a3', 'b2'].map((i) => batcher.execute(i)));
    assert.deepEqual(out, ['A1', 'B1', 'A2', 'C1', 'A3', 'B2']);
    assert.deepEqual(batches, [['a1'], ['b1', 'a2', 'c1'], ['a3', 'b2']]);
  });

  it('caps a statement at maxBatch items', async () => {
    const sizes: number[] = [];
    const batcher = new StatementBatcher(async (items: number[]) => { sizes.push(items.length); await new Promise((r) => setTimeout(r, 5)); return items; }, { maxInFlight: 1, maxBatch: 4 });
    await Promise.all(Array.from({ length: 10 }, (_, i) => batcher.execute(i)));
    assert.deepEqual(sizes, [1, 4, 4, 1]);
  });
});

// A task's first send sent again (domain/tasks.ts findOpeningRetry): the races task-api and a2a-sdk
// cannot arrange through the API. Intake statements that hold the same opening ids, and a streamed
// retry while the task changes (an update is written at the moment the retry looks for its original).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { Task } from '@a2a-js/sdk';
import { lockWaits, resetDb, testDb, testEnv, waitFor } from './helpers/stack.ts';
import { insertTaskBundles, type TaskBundle } from '../db/tasks.ts';
import { loadConfig } from '../domain/config.ts';
import { createServices, type Services } from '../domain/services.ts';
import { TaskWaiter } from '../domain/task-waiter.ts';
import { sendMessage, streamMessage } from '../domain/a2a/methods.ts';

function opening(cmId: string): TaskBundle {
  const id = randomUUID();
  const at = new Date();
  const iso = at.toISOString();
  const message = { id: randomUUID(), client_message_id: cmId, task_id: id, role: 'user' as const, parts: [{ type: 'text-part' as const, text: cmId }], reference_task_ids: [], metadata: {}, created_at: iso };
  return {
    task: { id, context_id: randomUUID(), status: 'submitted', status_timestamp: at, status_message_id: null, metadata: {}, created_at: at, updated_at: at },
    message,
    timeline: [
      { id: randomUUID(), task_id: id, created_at: iso, event_payload: { type: 'message', message } },
      { id: randomUUID(), task_id: id, created_at: iso, event_payload: { type: 'task-status-update', status: 'submitted' } },
    ],
    opening: true,
  };
}

describe('retried first sends: races', () => {
  before(resetDb);

  // Two intake statements (two API processes, or maxInFlight 2 in one) carrying the same opening
  // ids in other orders take the unique index entries in other orders: Postgres aborts one (40P01)
  // after deadlock_timeout. The batcher retries once; a second deadlock fails all of that batch's
  // clients (up to 100, most of them unrelated) with a 500.
  it('two intake statements with the same opening ids in other orders do not deadlock', async () => {
    const db = testDb();
    const [x, y, w] = ['x', 'y', 'w'].map((s) => `dl-${s}-${randomUUID()}`);
    const trx = await db.transaction();
    await insertTaskBundles(trx, [opening(w)]); // holds w until it ends
    const a = insertTaskBundles(db, [opening(x), opening(w), opening(y)]).then(() => 'ok', (e) => e.code);
    const b = insertTaskBundles(db, [opening(y), opening(w), opening(x)]).then(() => 'ok', (e) => e.code);
    await waitFor(async () => (await lockWaits('with b as%')) === 2, 'both to have taken their first id and to wait for w');
    await trx.commit();
    assert.deepEqual(await Promise.all([a, b]), ['ok', 'ok']);
  });

  describe('A2A message/stream retry of a new task', () => {
    let services: Services;
    let waiter: TaskWaiter;
    const origQuery = pg.Client.prototype.query;
    let hook: (() => Promise<unknown>) | undefined;

    before(() => {
      services = createServices(loadConfig({ ...testEnv(), LOG_LEVEL: 'silent' }), 'api');
      waiter = new TaskWaiter(services.bus, services.log);
      // Runs `hook` once, before the statement findRetried uses to find the original message.
      (pg.Client.prototype as any).query = function (this: unknown, config: any, ...rest: any[]) {
        const text = typeof config === 'string' ? config : config?.text;
        if (hook && typeof text === 'string' && text.includes('to_jsonb(reference_task_ids)')) {
          const h = hook;
          hook = undefined;
          const p = h().then(() => (origQuery as any).call(this, config, ...rest));
          return rest.some((r) => typeof r === 'function') ? undefined : p;
        }
        return (origQuery as any).call(this, config, ...rest);
      };
    });
    after(async () => {
      (pg.Client.prototype as any).query = origQuery;
      await services?.close();
    });

    // The snapshot is read after accept() read lastSeq, outside any common snapshot: an update the
    // agent writes in between is in the snapshot AND streamed again (an appended chunk twice).
    it('does not stream again what its snapshot already holds', async () => {
      const call = { services, waiter, signal: new AbortController().signal };
      const message = { kind: 'message' as const, messageId: `stream-${randomUUID()}`, role: 'user' as const, parts: [{ kind: 'text' as const, text: 'chunks' }] };
      const first = await sendMessage(call, { message, configuration: { blocking: false } });
      const taskId = first.id;
      hook = () => testDb()('timeline_items').insert({
        id: randomUUID(), task_id: taskId, created_at: new Date(),
        event_payload: { type: 'artifact-update', artifact: { artifactId: 'a1', parts: [{ kind: 'text', text: 'chunk-1' }], append: true } },
      });
      const stream = await streamMessage(call, { message });
      const snapshot = (await stream.next()).value as Task;
      assert.equal(snapshot.id, taskId);
      assert.equal(hook, undefined, 'the update was written during the retry');
      assert.deepEqual(snapshot.artifacts?.map((a) => a.parts.length), [1], 'the snapshot holds the chunk');
      // End the task so the stream ends.
      await testDb()('timeline_items').insert({ id: randomUUID(), task_id: taskId, created_at: new Date(), event_payload: { type: 'task-status-update', status: 'completed' } });
      const after = [];
      for await (const e of stream) after.push(e);
      const again = after.filter((e) => (e as { kind: string }).kind === 'artifact-update');
      assert.equal(again.length, 0, `streamed again: ${JSON.stringify(again)}`);
    });
  });
});

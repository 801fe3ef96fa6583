// What looking for a sent message's earlier copy costs on a long task: the rows of messages its plan
// reads (EXPLAIN ANALYZE), not times. POST /api/task/v1/{id}/message and A2A message/send to a task
// look for it under the task's row lock, so a read of all the task's messages holds up every writer.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, testDb } from './helpers/stack.ts';
import { rowsRead, statementsOn } from './helpers/plans.ts';
import { findSameMessage } from '../db/messages.ts';

describe('a retried send to a long task (findSameMessage)', function () {
  this.timeout(60_000);

  it('reads the task\'s messages with that sender id, not all of them', async () => {
    await resetDb();
    const db = testDb();
    const contextId = randomUUID();
    const taskId = randomUUID();
    await db.raw(`insert into contexts (id, created_at) values (?, now())`, [contextId]);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
                  values (?, ?, 'working', now(), '{}', now(), now())`, [taskId, contextId]);
    // 5,000 messages, each with a sender id of its own, and one more copy of message 2,500 with
    // other content: a look-up reads the two messages of that id.
    await db.raw(`insert into messages (id, client_message_id, task_id, role, parts, created_at)
                  select gen_random_uuid(), 'c' || g, ?, 'user', jsonb_build_array(jsonb_build_object('type', 'text-part', 'text', 'm' || g)), now()
                    from generate_series(1, 5000) g`, [taskId]);
    await db.raw(`insert into messages (id, client_message_id, task_id, role, parts, created_at)
                  values (gen_random_uuid(), 'c2500', ?, 'user', '[{"type":"text-part","text":"other"}]', now())`, [taskId]);
    await db.raw('analyze messages');
    const sent = { id: randomUUID(), client_message_id: 'c2500', task_id: taskId, role: 'user' as const,
      parts: [{ type: 'text-part' as const, text: 'm2500' }], reference_task_ids: [], metadata: {}, created_at: new Date().toISOString() };
    let found: Awaited<ReturnType<typeof findSameMessage>>;
    const statements = await statementsOn('messages', async () => { found = await findSameMessage(db, sent); });
    assert.deepEqual(found!.parts, sent.parts);
    assert.equal(await rowsRead('messages', statements), 2);
  });
});

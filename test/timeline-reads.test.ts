// What the reads of one task's timeline cost on a long task: the rows of timeline_items their plans
// read (EXPLAIN ANALYZE of the statements db/ sends), not times. A task may hold any number of
// progress status updates, so a read of a few of its items must not walk all of them.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { resetDb, testDb } from './helpers/stack.ts';
import { getTaskView } from '../db/tasks.ts';
import { listArtifactItems } from '../db/timeline-views.ts';
import { messageItem, statusChangedAfter } from '../db/timeline.ts';
import { timelineAt } from '../db/push-configs.ts';
import { plansOn, rowsRead, statementsOn, type Sent } from './helpers/plans.ts';

const statementsOf = (run: () => Promise<unknown>) => statementsOn('timeline_items', run);
const timelineRowsRead = (statements: Sent[]) => rowsRead('timeline_items', statements);
const timelinePlans = (statements: Sent[]) => plansOn('timeline_items', statements);

describe('reads of a long task\'s timeline', function () {
  this.timeout(60_000);
  const taskId = randomUUID();
  const progress = 5_000;
  const artifacts = 3;

  before(async () => {
    await resetDb();
    const db = testDb();
    const contextId = randomUUID();
    await db.raw(`insert into contexts (id, created_at) values (?, now())`, [contextId]);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
                  values (?, ?, 'working', now(), '{}', now(), now())`, [taskId, contextId]);
    await db.raw(`insert into messages (id, task_id, role, parts, created_at) values (gen_random_uuid(), ?, 'user', '[{"type":"text-part","text":"go"}]', now())`, [taskId]);
    // An artifact first, then the progress updates, the other artifacts among them near the end, and
    // the task's one message halfway: neither a scan of the table nor one of the task's items in seq
    // order comes on it without reading half the progress updates first.
    const items = (from: number, to: number) => db.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                  select gen_random_uuid(), ?, case when g in (1, ${progress - 10}, ${progress - 5})
                    then jsonb_build_object('type', 'artifact-update', 'artifact', jsonb_build_object('artifactId', 'a' || g, 'parts', '[]'::jsonb))
                    else '{"type":"task-status-update","status":"working"}'::jsonb end, now()
                    from generate_series(?::int, ?::int) g`, [taskId, from, to]);
    await items(1, progress / 2);
    await db.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                  values (gen_random_uuid(), ?, '{"type":"message","message":{"id":"m1","role":"user","parts":[]}}', now())`, [taskId]);
    await items(progress / 2 + 1, progress);
    await db.raw('analyze timeline_items');
  });

  it('A2A tasks/get (getTaskView) reads the task\'s artifact updates, not its progress updates', async () => {
    let view: Awaited<ReturnType<typeof getTaskView>>;
    const sent = await statementsOf(async () => { view = await getTaskView(testDb(), taskId, 10); });
    assert.equal(view!.artifactItems.length, artifacts);
    assert.equal(await timelineRowsRead(sent), artifacts);
  });

  it('a remote agent run (listArtifactItems) and a push snapshot (timelineAt) read the artifact updates alone', async () => {
    let items: unknown[] = [];
    const listed = await statementsOf(async () => { items = await listArtifactItems(testDb(), taskId); });
    assert.equal(items.length, artifacts);
    assert.equal(await timelineRowsRead(listed), artifacts);
    // At the task's newest item: seq numbers are shared by all tasks and go on across resetDb.
    const [{ newest }] = await testDb()('timeline_items').where({ task_id: taskId }).max({ newest: 'seq' });
    let at: Awaited<ReturnType<typeof timelineAt>>;
    const pushed = await statementsOf(async () => { at = await timelineAt(testDb(), taskId, Number(newest), { limit: 100, maxBytes: 1 << 20 }); });
    assert.equal(at!.artifacts.length, artifacts);
    const artifactStatement = pushed.filter((s) => s.text.includes('artifact-update'));
    assert.equal(artifactStatement.length, 1);
    assert.equal(await timelineRowsRead(artifactStatement), artifacts);
  });

  it('a push snapshot (timelineAt) reads the task\'s message items alone, not the progress updates after them', async () => {
    const [{ newest }] = await testDb()('timeline_items').where({ task_id: taskId }).max({ newest: 'seq' });
    let at: Awaited<ReturnType<typeof timelineAt>>;
    const pushed = await statementsOf(async () => { at = await timelineAt(testDb(), taskId, Number(newest), { limit: 100, maxBytes: 1 << 20 }); });
    assert.deepEqual(at!.messages.map((m) => (m.event_payload as { message: { id: string } }).message.id), ['m1']);
    const messageStatement = pushed.filter((s) => s.text.includes(`'message'`));
    assert.equal(messageStatement.length, 1);
    assert.equal(await timelineRowsRead(messageStatement), 1);
  });

  it('a retried send finding its message\'s item (messageItem) reads the task\'s message items alone', async () => {
    const [{ created_at }] = await testDb()('timeline_items').where({ task_id: taskId }).whereRaw(`event_payload->>'type' = 'message'`).select('created_at');
    let item: Awaited<ReturnType<typeof messageItem>>;
    const sent = await statementsOf(async () => { item = await messageItem(testDb(), taskId, { id: 'm1', created_at }); });
    assert.equal((item!.event_payload as { message: { id: string } }).message.id, 'm1');
    assert.equal(await timelineRowsRead(sent), 1);
  });
});

describe('whether a long task\'s status changed after a timeline position (a retried A2A send)', function () {
  this.timeout(60_000);

  it('reads the task\'s items from that position, not the whole table', async () => {
    // 300 one-turn tasks, then one of 20,000 progress updates: the planner, counting that task's many
    // items and few of any one type, took the first status update anywhere in the table as near and
    // scanned the table for it (every item of every other task first).
    await resetDb();
    const db = testDb();
    const contextId = randomUUID();
    await db.raw(`insert into contexts (id, created_at) values (?, now())`, [contextId]);
    await db.raw(`insert into tasks (id, context_id, status, status_timestamp, metadata, created_at, updated_at)
                  select gen_random_uuid(), ?, 'completed', now(), '{}', now(), now() from generate_series(1, 301)`, [contextId]);
    const [first, ...others] = (await db('tasks').select('id')).map((r: { id: string }) => r.id);
    await db.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                  select gen_random_uuid(), t, jsonb_build_object('type', 'message', 'n', g), now() from unnest(?::uuid[]) t, generate_series(1, 100) g`, [others]);
    await db.raw(`insert into timeline_items (id, task_id, event_payload, created_at)
                  select gen_random_uuid(), ?, '{"type":"task-status-update","status":"working"}'::jsonb, now() from generate_series(1, 20000)`, [first]);
    await db.raw('analyze timeline_items');
    const [{ seq }] = await db('timeline_items').where({ task_id: first }).min({ seq: 'seq' });
    let changed = false;
    const sent = await statementsOf(async () => { changed = await statusChangedAfter(db, first, Number(seq)); });
    assert.equal(changed, true);
    const nodes = await timelinePlans(sent);
    assert.deepEqual(nodes.map((n) => n['Node Type']).filter((t) => t === 'Seq Scan'), []);
    assert.equal(await timelineRowsRead(sent), 1);
  });
});

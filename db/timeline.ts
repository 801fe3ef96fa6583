import type { Tx } from './knex.ts';
import { keysetPage, PAGE_MAX_BYTES, type Keyset, type Page } from './pagination.ts';
import { itemWeightSql } from './messages.ts';
import { parsedWeight } from '../domain/storable-json.ts';
import type { TimelineItem } from '../domain/shapes/task.ts';

export interface TimelineRow extends TimelineItem { seq: number }
const COLUMNS = ['id', 'seq', 'task_id', 'event_payload', 'created_at'];
const strip = ({ seq: _seq, ...t }: TimelineRow) => t as TimelineItem;

export async function insertTimelineItem(db: Tx, item: TimelineItem): Promise<TimelineRow> {
  const [out] = await db('timeline_items').insert({ ...item, weight: parsedWeight(item.event_payload) }).returning(COLUMNS);
  return out;
}

// A task's timeline in seq order, pages within PAGE_MAX_BYTES as parsed.
const timelineKeyset = (db: Tx, taskId: string, order: 'asc' | 'desc'): Keyset<TimelineRow> => ({
  list: ['timeline', taskId], columns: ['seq'], kinds: ['int'], direction: order, cursorOf: (r) => [r.seq], bytes: { db, size: itemWeightSql('timeline_items'), max: PAGE_MAX_BYTES },
});

export async function listTimeline(db: Tx, taskId: string, order: 'asc' | 'desc', pageSize: number, token?: string): Promise<Page<TimelineItem>> {
  const q = db('timeline_items').select(COLUMNS).where({ task_id: taskId });
  const page = await keysetPage<TimelineRow>(q, timelineKeyset(db, taskId, order), pageSize, token);
  return { ...page, items: page.items.map(strip) };
}

// Items after a sequence number, oldest first: what a stream subscriber has not seen yet. At most
// `limit` of them and PAGE_MAX_BYTES as parsed (always the first); `more` when items were left.
export async function timelineSince(db: Tx, taskId: string, afterSeq: number, limit: number): Promise<{ rows: TimelineRow[]; more: boolean }> {
  const q = db('timeline_items').select(COLUMNS).where({ task_id: taskId }).where('seq', '>', afterSeq);
  const page = await keysetPage<TimelineRow>(q, timelineKeyset(db, taskId, 'asc'), limit, undefined);
  return { rows: page.items, more: page.next_page_token !== undefined };
}

// The `message` item a message of a task was recorded with. Every writer stamps the two with one
// instant: matching it first spares unpacking the payload of each of the task's items (up to 16 MiB
// of messages), under the task's lock (a retry, domain/tasks.ts).
export async function messageItem(db: Tx, taskId: string, message: { id: string; created_at: string | Date }): Promise<TimelineRow | undefined> {
  return db('timeline_items').select(COLUMNS).where({ task_id: taskId, created_at: message.created_at })
    .whereRaw(`event_payload->>'type' = 'message' and event_payload->'message'->>'id' = ?`, [message.id]).first();
}

// Whether a task's status changed after timeline seq `seq` (to one of `states`, when given). Read in
// seq order: unordered, the planner took a status update of a task with many items to be near
// anywhere and scanned the table.
export async function statusChangedAfter(db: Tx, taskId: string, seq: number, states?: readonly string[]): Promise<boolean> {
  const q = db('timeline_items').where({ task_id: taskId }).where('seq', '>', seq).whereRaw(`event_payload->>'type' = 'task-status-update'`);
  if (states) q.whereRaw(`event_payload->>'status' in (${states.map(() => '?').join(', ')})`, [...states]);
  const row = await q.orderBy('seq').select(db.raw('1')).first();
  return row !== undefined;
}

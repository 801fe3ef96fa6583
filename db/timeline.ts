import type { Tx } from './knex.ts';
import { keysetPage, type Page } from './pagination.ts';
import type { TimelineItem } from '../api/schemas/task.ts';

export interface TimelineRow extends TimelineItem { seq: number }
const COLUMNS = ['id', 'seq', 'task_id', 'event_payload', 'created_at'];
const strip = ({ seq: _seq, ...t }: TimelineRow) => t as TimelineItem;

export async function insertTimelineItem(db: Tx, item: TimelineItem): Promise<TimelineRow> {
  const [out] = await db('timeline_items').insert(item).returning(COLUMNS);
  return out;
}

export async function listTimeline(db: Tx, taskId: string, order: 'asc' | 'desc', pageSize: number, token?: string): Promise<Page<TimelineItem>> {
  const q = db('timeline_items').select(COLUMNS).where({ task_id: taskId });
  const page = await keysetPage<TimelineRow>(q, { columns: ['seq'], kinds: ['int'], direction: order, cursorOf: (r) => [r.seq] }, pageSize, token);
  return { ...page, items: page.items.map(strip) };
}

// Items after a sequence number, oldest first: what a stream subscriber has not seen yet.
export async function timelineSince(db: Tx, taskId: string, afterSeq: number, limit = 1000): Promise<TimelineRow[]> {
  return db('timeline_items').select(COLUMNS).where({ task_id: taskId }).where('seq', '>', afterSeq).orderBy('seq', 'asc').limit(limit);
}

// The `message` item a message of a task was recorded with. Every writer stamps the two with one
// instant: matching it first spares unpacking the payload of each of the task's items (up to 16 MiB
// of messages), under the task's lock (a retry, domain/tasks.ts).
export async function messageItem(db: Tx, taskId: string, message: { id: string; created_at: string | Date }): Promise<TimelineRow | undefined> {
  return db('timeline_items').select(COLUMNS).where({ task_id: taskId, created_at: message.created_at })
    .whereRaw(`event_payload->>'type' = 'message' and event_payload->'message'->>'id' = ?`, [message.id]).first();
}

// Whether a task's status changed after timeline seq `seq`.
export async function statusChangedAfter(db: Tx, taskId: string, seq: number): Promise<boolean> {
  const row = await db('timeline_items').where({ task_id: taskId }).where('seq', '>', seq)
    .whereRaw(`event_payload->>'type' = 'task-status-update'`).select(db.raw('1')).first();
  return row !== undefined;
}

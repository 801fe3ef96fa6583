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

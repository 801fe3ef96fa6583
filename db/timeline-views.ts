// Narrow reads of the timeline for the A2A views of a task.
import type { Tx } from './knex.ts';
import type { TimelineItem } from '../domain/shapes/task.ts';

// The artifact-update items of a task, oldest first: the source of A2A Task.artifacts.
export async function listArtifactItems(db: Tx, taskId: string): Promise<Pick<TimelineItem, 'event_payload'>[]> {
  return db('timeline_items').select('event_payload').where({ task_id: taskId }).whereRaw(`event_payload->>'type' = 'artifact-update'`).orderBy('seq', 'asc');
}

// The bytes of a task's artifact updates as JSON text: how much its A2A view reads back.
export async function artifactBytes(db: Tx, taskId: string): Promise<number> {
  const [row] = await db('timeline_items').where({ task_id: taskId }).whereRaw(`event_payload->>'type' = 'artifact-update'`)
    .select(db.raw(`coalesce(sum(octet_length((event_payload->'artifact')::text)), 0)::bigint as n`));
  return Number(row.n);
}

// The newest timeline seq of a task (0 if none): a follower continues after it.
export async function lastTimelineSeq(db: Tx, taskId: string): Promise<number> {
  const row = await db('timeline_items').where({ task_id: taskId }).max({ seq: 'seq' }).first();
  return Number(row?.seq ?? 0);
}

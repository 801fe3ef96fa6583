import type { Tx } from './knex.ts';
import type { TimelineItem } from '../api/schemas/task.ts';

// The artifact-update timeline items of a task, oldest first: the source of A2A Task.artifacts.
export async function listArtifactItems(db: Tx, taskId: string): Promise<Pick<TimelineItem, 'event_payload'>[]> {
  return db('timeline_items').select('event_payload').where({ task_id: taskId }).whereRaw(`event_payload->>'type' = 'artifact-update'`).orderBy('seq', 'asc');
}

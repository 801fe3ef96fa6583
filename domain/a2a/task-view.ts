// Reads a task with what its A2A view needs (history, status message, artifacts) from Postgres.
import type { Task as A2ATask } from '@a2a-js/sdk';
import type { Tx } from '../../db/knex.ts';
import * as tasks from '../../db/tasks.ts';
import * as messages from '../../db/messages.ts';
import { listArtifactItems } from '../../db/timeline-views.ts';
import { TaskNotFoundError } from './errors.ts';
import { artifactsFromTimeline, toA2ATask } from './mapping.ts';

// Without historyLength, or with a larger one, the newest HISTORY_CAP messages are returned: a task's
// A2A view stays bounded (all messages page through GET /api/task/v1/{id}/message).
export const HISTORY_CAP = 1000;

export async function loadA2ATask(db: Tx, taskId: string, historyLength?: number, row?: tasks.TaskRow): Promise<A2ATask> {
  const task = row ?? (await tasks.getTask(db, taskId));
  if (!task) throw new TaskNotFoundError(taskId);
  const limit = Math.min(historyLength ?? HISTORY_CAP, HISTORY_CAP);
  const [recent, artifactItems] = await Promise.all([
    limit > 0 ? messages.recentMessages(db, taskId, limit) : Promise.resolve([]),
    listArtifactItems(db, taskId),
  ]);
  const history = recent.map(({ seq: _s, ...m }) => m);
  let statusMessage = task.status_message_id ? history.find((m) => m.id === task.status_message_id) : undefined;
  if (task.status_message_id && !statusMessage) statusMessage = await messages.getMessage(db, task.status_message_id);
  return toA2ATask(task, { messages: history, statusMessage, artifacts: artifactsFromTimeline(artifactItems) });
}

// Reads a task with what its A2A view needs (history, status message, artifacts) from Postgres.
import type { Task as A2ATask } from '@a2a-js/sdk';
import type { Tx } from '../../db/knex.ts';
import * as tasks from '../../db/tasks.ts';
import { TaskNotFoundError } from './errors.ts';
import { artifactsFromTimeline, toA2ATask } from './mapping.ts';

// Without historyLength, or with a larger one, the newest HISTORY_CAP messages are returned: a task's
// A2A view stays bounded (all messages page through GET /api/task/v1/{id}/message).
export const HISTORY_CAP = 1000;

export async function loadA2ATask(db: Tx, taskId: string, historyLength?: number): Promise<A2ATask> {
  const view = await tasks.getTaskView(db, taskId, Math.min(historyLength ?? HISTORY_CAP, HISTORY_CAP));
  if (!view) throw new TaskNotFoundError(taskId);
  return toA2ATask(view.task, { messages: view.messages, statusMessage: view.statusMessage, artifacts: artifactsFromTimeline(view.artifactItems) });
}

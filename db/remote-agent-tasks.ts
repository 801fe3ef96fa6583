import type { Tx } from './knex.ts';

export interface RemoteAgentTaskRow { task_id: string; remote_task_id: string; remote_context_id: string | null }

export async function getRemoteAgentTask(db: Tx, taskId: string): Promise<RemoteAgentTaskRow | undefined> {
  return db('remote_agent_tasks').select('task_id', 'remote_task_id', 'remote_context_id').where({ task_id: taskId }).first();
}

export async function saveRemoteAgentTask(db: Tx, row: RemoteAgentTaskRow): Promise<void> {
  await db('remote_agent_tasks').insert(row).onConflict('task_id').merge(['remote_task_id', 'remote_context_id']);
}

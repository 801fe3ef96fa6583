import type { Tx } from './knex.ts';

export interface RemoteAgentTaskRow { task_id: string; remote_task_id: string; remote_context_id: string | null; last_message_id?: string | null }

export async function getRemoteAgentTask(db: Tx, taskId: string): Promise<RemoteAgentTaskRow | undefined> {
  return db('remote_agent_tasks').select('task_id', 'remote_task_id', 'remote_context_id', 'last_message_id').where({ task_id: taskId }).first();
}

export async function saveRemoteAgentTask(db: Tx, row: RemoteAgentTaskRow): Promise<void> {
  await db('remote_agent_tasks').insert(row).onConflict('task_id').merge(['remote_task_id', 'remote_context_id', 'last_message_id']);
}

// Remote tasks whose local task was canceled in the last `withinHours` (a run cancels its remote task
// itself; these were canceled between runs, waiting for input, or their run's cancel did not get
// through), the latest first: a remote that keeps refusing some is given up on after that.
export async function remoteTasksOfCanceled(db: Tx, withinHours: number, limit: number): Promise<RemoteAgentTaskRow[]> {
  return db('remote_agent_tasks as r').join('tasks as t', 't.id', 'r.task_id')
    .where('t.status', 'canceled').where('t.status_timestamp', '>', db.raw(`now() - make_interval(hours => ?)`, [withinHours]))
    .select('r.task_id', 'r.remote_task_id', 'r.remote_context_id').orderBy('t.status_timestamp', 'desc').limit(limit);
}

export async function forgetRemoteAgentTask(db: Tx, taskId: string): Promise<void> {
  await db('remote_agent_tasks').where({ task_id: taskId }).delete();
}

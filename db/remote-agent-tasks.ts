import type { Knex } from 'knex';
import type { Tx } from './knex.ts';
import { getTask } from './tasks.ts';
import { heldByTake, workingUnder } from '../domain/task-states.ts';

/** A remote task's interruption as the remote showed it. */
export interface RemoteInterruption { state: string; timestamp?: string; messageId?: string }
/** The interruption a later turn's message (`answer`, its local id) answers (migration 0043). */
export type AnsweredInterruption = RemoteInterruption & { answer: string };

export interface RemoteAgentTaskRow {
  task_id: string; remote_task_id: string; remote_context_id: string | null; last_message_id?: string | null;
  answering?: AnsweredInterruption | null;
}

export async function getRemoteAgentTask(db: Tx, taskId: string): Promise<RemoteAgentTaskRow | undefined> {
  return db('remote_agent_tasks').select('task_id', 'remote_task_id', 'remote_context_id', 'last_message_id', 'answering').where({ task_id: taskId }).first();
}

// The remote task ids of local tasks (of those that have one).
export async function remoteTaskIdsOf(db: Tx, taskIds: readonly string[]): Promise<string[]> {
  if (!taskIds.length) return [];
  return db('remote_agent_tasks').whereIn('task_id', taskIds).pluck('remote_task_id');
}

export async function saveRemoteAgentTask(db: Tx, row: Omit<RemoteAgentTaskRow, 'answering'>): Promise<void> {
  await db('remote_agent_tasks').insert(row).onConflict('task_id').merge(['remote_task_id', 'remote_context_id', 'last_message_id']);
}

// The interruption a later turn's message answers, written before it is sent. Named by the message:
// one written for another (a take of an earlier turn that stalled and wrote late, an older worker's
// turn that wrote none) is no evidence about this one.
export async function recordAnswering(db: Tx, taskId: string, remoteTaskId: string, answering: AnsweredInterruption): Promise<void> {
  await db('remote_agent_tasks').where({ task_id: taskId, remote_task_id: remoteTaskId }).update({ answering: JSON.stringify(answering) });
}

// A first turn's remote task, saved unless another take of the same run's job holds the task now
// (false): that take found no row, sent the message again and saves its own. Under the task row's
// lock, so a take's claim of the task (an update of that row) either came first and is seen here,
// or waits for this save and then finds the row. A task a client took from the run is saved for, for
// the run that takes over to follow.
export async function saveFirstRemoteAgentTask(db: Knex, row: Omit<RemoteAgentTaskRow, 'answering'>, take: number): Promise<boolean> {
  return db.transaction(async (trx) => {
    const task = await getTask(trx, row.task_id, true);
    const messageId = row.last_message_id ?? '';
    if (task && workingUnder(task, messageId) && !heldByTake(task, { messageId, attempt: take })) return false;
    await saveRemoteAgentTask(trx, row);
    return true;
  });
}

// The remote context of the latest other task of a local context that has one: a new task of the
// context continues the remote's conversation there (the (context_id, created_at, id) index).
export async function remoteContextOf(db: Tx, contextId: string, exceptTaskId: string): Promise<string | undefined> {
  const row = await db('tasks as t').join('remote_agent_tasks as r', 'r.task_id', 't.id')
    .where('t.context_id', contextId).whereNot('t.id', exceptTaskId).whereNotNull('r.remote_context_id')
    .orderBy([{ column: 't.created_at', order: 'desc' }, { column: 't.id', order: 'desc' }]).first('r.remote_context_id');
  return row?.remote_context_id ?? undefined;
}

// Takes remote tasks to cancel: those whose local task was canceled or failed in the last
// `withinHours` (a run cancels its remote task itself when it can; these were canceled between runs,
// waiting for input, their run's cancel did not get through, or the run failed after the remote's
// last word), the latest first, and that no worker took in the last `retryAfterMs`. Taking marks
// them, rows another worker is taking are skipped: workers of a fleet each cancel different ones,
// and a remote that keeps refusing is asked again once per interval, then given up on after
// `withinHours`. The status list is the partial index's (migration 0017).
export async function takeRemoteTasksToCancel(db: Tx, withinHours: number, retryAfterMs: number, limit: number): Promise<(RemoteAgentTaskRow & { status: 'canceled' | 'failed' })[]> {
  const { rows } = await db.raw(
    `update remote_agent_tasks r set cancel_tried_at = now()
       from (select r2.task_id, t.status from remote_agent_tasks r2 join tasks t on t.id = r2.task_id
              where t.status in ('canceled', 'failed') and t.status_timestamp > now() - make_interval(hours => ?)
                and (r2.cancel_tried_at is null or r2.cancel_tried_at < now() - make_interval(secs => ?))
              order by t.status_timestamp desc limit ? for update of r2 skip locked) c
      where r.task_id = c.task_id
      returning r.task_id, r.remote_task_id, r.remote_context_id, c.status`,
    [withinHours, retryAfterMs / 1000, limit],
  );
  return rows;
}

// Only while the row names that remote task: a run of the task may have recorded another since.
export async function forgetRemoteAgentTask(db: Tx, taskId: string, remoteTaskId: string): Promise<void> {
  await db('remote_agent_tasks').where({ task_id: taskId, remote_task_id: remoteTaskId }).delete();
}

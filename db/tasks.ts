import type { Tx } from './knex.ts';
import { keysetPage, type Page } from './pagination.ts';
import type { ContextInfo, Task } from '../api/schemas/task.ts';
import type { TaskState } from '../domain/task-states.ts';

export interface TaskRow {
  id: string; context_id: string; status: TaskState; status_timestamp: Date; status_message_id: string | null;
  metadata: Record<string, unknown>; created_at: Date; updated_at: Date;
}

// Dates serialise to RFC 3339 with milliseconds in JSON responses.
export const toTask = (r: TaskRow) => r as unknown as Task;

export async function ensureContext(db: Tx, id: string, createdAt: Date): Promise<void> {
  await db('contexts').insert({ id, created_at: createdAt }).onConflict('id').ignore();
}

export async function insertTask(db: Tx, row: TaskRow): Promise<TaskRow> {
  const [out] = await db('tasks').insert(row).returning('*');
  return out;
}

export async function getTask(db: Tx, id: string, lock = false): Promise<TaskRow | undefined> {
  const q = db('tasks').where({ id }).first();
  return lock ? q.forUpdate() : q;
}

export async function setTaskStatus(db: Tx, id: string, status: TaskState, statusMessageId: string | null, at: Date): Promise<TaskRow> {
  const [out] = await db('tasks').where({ id }).update({ status, status_message_id: statusMessageId, status_timestamp: at, updated_at: at }).returning('*');
  return out;
}

export async function listTasks(db: Tx, filter: { status?: string; context_id?: string }, pageSize: number, token?: string): Promise<Page<TaskRow>> {
  const q = db('tasks').select('*');
  if (filter.status) q.where('status', filter.status);
  if (filter.context_id) q.where('context_id', filter.context_id);
  return keysetPage<TaskRow>(q, { columns: ['created_at', 'id'], kinds: ['timestamp', 'uuid'], direction: 'desc', cursorOf: (r) => [r.created_at, r.id] }, pageSize, token);
}

export async function listContexts(db: Tx, pageSize: number, token?: string): Promise<Page<ContextInfo>> {
  const q = db('contexts').select({ context_id: 'id', created_at: 'created_at' });
  return keysetPage<ContextInfo>(q, { columns: ['created_at', 'id'], kinds: ['timestamp', 'uuid'], direction: 'desc', cursorOf: (r) => [r.created_at, r.context_id] }, pageSize, token);
}

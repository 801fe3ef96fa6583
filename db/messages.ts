import type { Tx } from './knex.ts';
import { keysetPage, PAGE_MAX_BYTES, type Page } from './pagination.ts';
import type { Message } from '../domain/shapes/task.ts';
import { parsedWeight } from '../domain/storable-json.ts';

export interface MessageRow extends Message { seq: number }

// SQL for the most a JSON text weighs once parsed: 12 bytes a byte ('0, ' is 3 bytes, the number 35).
export const textWeightBound = (text: string) => `12::bigint * octet_length(${text})`;
// SQL for what a stored message (row `m`), timeline item (row `i`) or task's metadata weighs once
// parsed: the weight its writer stored in `column` (migrations 0025, 0042), or for a row from before,
// the bound from its text. Reads that hand out a budget of rows (a run's history, a notification's, a
// page, a task's A2A view) count with it.
export const storedWeight = (column: string, text: string) => `coalesce(${column}, ${textWeightBound(text)})`;
export const messageWeightSql = (m: string) => storedWeight(`${m}.weight`, `concat(${m}.parts, ${m}.metadata, ${m}.extensions, ${m}.accepted_output_modes, ${m}.reference_task_ids)`);
export const itemWeightSql = (i: string) => storedWeight(`${i}.weight`, `${i}.event_payload::text`);

// What a message weighs once parsed, as its writer stores it: its parts, metadata and lists.
export const messageWeight = (m: Pick<Message, 'parts' | 'metadata' | 'extensions' | 'accepted_output_modes' | 'reference_task_ids'>) =>
  parsedWeight(m.parts) + (m.metadata && Object.keys(m.metadata).length ? parsedWeight(m.metadata) : 0)
  + (m.extensions ? parsedWeight(m.extensions) : 0) + (m.accepted_output_modes ? parsedWeight(m.accepted_output_modes) : 0)
  + (m.reference_task_ids?.length ? parsedWeight(m.reference_task_ids) : 0);

export const COLUMNS = ['id', 'client_message_id', 'seq', 'task_id', 'role', 'parts', 'reference_task_ids', 'extensions', 'accepted_output_modes', 'metadata', 'created_at'];

// A message's members the sender may leave out: null columns when it did.
const OPTIONAL = ['client_message_id', 'extensions', 'accepted_output_modes'] as const;
type Optional = (typeof OPTIONAL)[number];
// A stored message as the API shows it: its optional members only when the sender gave them.
export function messageFromRow<R extends { [K in Optional]?: unknown }>(row: R): R & { [K in Optional]?: NonNullable<R[K]> } {
  const out = { ...row };
  for (const k of OPTIONAL) if (out[k] == null) delete out[k];
  return out as R & { [K in Optional]?: NonNullable<R[K]> };
}
const strip = ({ seq: _seq, ...m }: MessageRow) => messageFromRow(m) as Message;
// A message row Postgres sent as JSON (row_to_json, json_agg of COLUMNS): as getMessage gives it.
export const messageFromJson = (row: Record<string, unknown>) => strip({ ...(row as unknown as MessageRow), created_at: new Date(row.created_at as string) as unknown as string });

export async function insertMessage(db: Tx, m: Message): Promise<MessageRow> {
  const [out] = await db('messages').insert({ ...m, parts: JSON.stringify(m.parts), weight: messageWeight(m) }).returning(COLUMNS);
  return messageFromRow(out);
}

export async function getMessage(db: Tx, id: string): Promise<Message | undefined> {
  const row = await db('messages').select(COLUMNS).where({ id }).first();
  return row && strip(row);
}

export async function listMessages(db: Tx, taskId: string, pageSize: number, token?: string): Promise<Page<Message>> {
  const q = db('messages').select(COLUMNS).where({ task_id: taskId });
  const page = await keysetPage<MessageRow>(q, {
    list: ['messages', taskId], columns: ['seq'], kinds: ['int'], direction: 'asc', cursorOf: (r) => [r.seq], bytes: { db, size: messageWeightSql('messages'), max: PAGE_MAX_BYTES },
  }, pageSize, token);
  return { ...page, items: page.items.map(strip) };
}

// The size of a task's messages as JSON text, as tasks.messageBytes counts each (jsonb's text is close
// to compact JSON, not the same): how a task from before migration 0016 is counted.
export async function messageBytes(db: Tx, taskId: string): Promise<number> {
  const [row] = await db('messages').where({ task_id: taskId }).select(db.raw(`coalesce(sum(octet_length(parts::text)
    + case when coalesce(metadata, '{}'::jsonb) <> '{}'::jsonb then octet_length(metadata::text) else 0 end
    + case when cardinality(extensions) > 0 then octet_length(array_to_json(extensions)::text) else 0 end
    + case when cardinality(accepted_output_modes) > 0 then octet_length(array_to_json(accepted_output_modes)::text) else 0 end), 0)::bigint as n`));
  return Number(row.n);
}

// The task whose opening message (migration 0024) has this sender id, if one has.
export async function taskOpenedBy(db: Tx, clientMessageId: string): Promise<string | undefined> {
  const row = await db('messages').select('task_id').where({ client_message_id: clientMessageId, opens_task: true }).first();
  return row?.task_id;
}

// The first message of a task with `m`'s sender id, role and content (parts, metadata, extensions,
// reference ids as stored), if it holds one: a retried send (domain/tasks.ts). jsonb and array
// equality, so key order does not matter. Read through the index of sender ids (migration 0039): that
// task's messages with that id only (callers hold the task's row lock while it runs).
// `opening`: only the message that opened the task (a retried first send); a later message of the
// task that reuses the sender id did not create it.
export async function findSameMessage(db: Tx, m: Message, opening = false): Promise<MessageRow | undefined> {
  const row = await db('messages').select(COLUMNS)
    .where({ task_id: m.task_id, client_message_id: m.client_message_id, role: m.role, ...(opening ? { opens_task: true } : {}) })
    .whereRaw('parts = ?::jsonb', [JSON.stringify(m.parts)])
    .whereRaw('metadata = ?::jsonb', [JSON.stringify(m.metadata)])
    .whereRaw(`coalesce(to_jsonb(extensions), '[]'::jsonb) = ?::jsonb`, [JSON.stringify(m.extensions ?? [])])
    .whereRaw('to_jsonb(reference_task_ids) = ?::jsonb', [JSON.stringify(m.reference_task_ids)])
    .orderBy('seq').first();
  return row && messageFromRow(row);
}


import type { Tx } from './knex.ts';
import { keysetPage, type Page } from './pagination.ts';
import { KEY_JOB_OPEN, MIGRATE_DEKS } from '../domain/key-job-states.ts';

export type EnvelopeKeyType = 'local' | 'aws_kms';
export interface EnvelopeKeyRow {
  id: string;
  type: EnvelopeKeyType;
  file_name: string | null;
  arn: string | null;
  region: string | null;
  created_at: Date;
}

export async function insertEnvelopeKey(db: Tx, row: Omit<EnvelopeKeyRow, 'created_at'>): Promise<EnvelopeKeyRow | undefined> {
  const [out] = await db('envelope_keys').insert(row).onConflict('id').ignore().returning('*');
  return out as EnvelopeKeyRow | undefined;
}

export async function getEnvelopeKey(db: Tx, id: string): Promise<EnvelopeKeyRow | undefined> {
  return db('envelope_keys').where({ id }).first();
}

export async function localKeyFileNames(db: Tx): Promise<string[]> {
  return (await db('envelope_keys').where({ type: 'local' }).select('file_name')).map((r: { file_name: string }) => r.file_name);
}

export async function anyEnvelopeKeys(db: Tx): Promise<boolean> {
  return !!(await db('envelope_keys').first(db.raw('1')));
}

export async function listEnvelopeKeys(db: Tx, pageSize: number, token?: string): Promise<Page<EnvelopeKeyRow>> {
  return keysetPage<EnvelopeKeyRow>(db('envelope_keys'), {
    list: ['envelope-keys'], columns: ['created_at', 'id'], kinds: ['timestamp', 'text'], direction: 'desc',
    cursorOf: (r) => [r.created_at, r.id],
  }, pageSize, token);
}

export async function countDeksOf(db: Tx, envelopeKeyId: string): Promise<number> {
  const [{ n }] = await db('deks').where({ envelope_key_id: envelopeKeyId }).count({ n: '*' });
  return Number(n);
}

// Deletes only while no DEK uses the key; the row lock keeps a DEK insert from racing in.
// Locked FOR SHARE until the transaction ends: a key a new migration targets cannot be deleted
// meanwhile (deleteUnusedEnvelopeKey locks FOR UPDATE).
export async function lockEnvelopeKeyShared(db: Tx, id: string): Promise<EnvelopeKeyRow | undefined> {
  return db('envelope_keys').where({ id }).forShare().first();
}

// Exclusive: waits for every transaction writing DEKs under the key to end (the foreign key check
// of each DEK insert or move under it holds the row FOR KEY SHARE), and holds back new ones.
export async function lockEnvelopeKeyExclusive(db: Tx, id: string): Promise<EnvelopeKeyRow | undefined> {
  return db('envelope_keys').where({ id }).forUpdate().first();
}

export async function deleteUnusedEnvelopeKey(db: Tx, id: string): Promise<'deleted' | 'missing' | 'in_use' | 'migration_target'> {
  const row = await lockEnvelopeKeyExclusive(db, id);
  if (!row) return 'missing';
  const used = await db('deks').where({ envelope_key_id: id }).first('id');
  if (used) return 'in_use';
  const target = await db('key_jobs').where({ kind: MIGRATE_DEKS }).whereIn('status', KEY_JOB_OPEN)
    .whereRaw(`params->>'to_envelope_encryption_key_id' = ?`, [id]).first('id');
  if (target) return 'migration_target';
  await db('envelope_keys').where({ id }).delete();
  return 'deleted';
}

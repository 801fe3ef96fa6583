import type { Tx } from './knex.ts';
import { keysetPage, type Page } from './pagination.ts';

export interface ApiKeyRow { id: string; name: string; scopes: string[]; key_hash: Buffer; created_at: Date; last_used_at: Date | null; revoked_at: Date | null }
const PUBLIC_COLUMNS = ['id', 'name', 'scopes', 'created_at', 'last_used_at'] as const;

export async function insertApiKey(db: Tx, row: { id: string; name: string; scopes: string[]; key_hash: Buffer }) {
  const [out] = await db('api_keys').insert(row).returning(['id', 'name', 'scopes', 'created_at']);
  return out as { id: string; name: string; scopes: string[]; created_at: Date };
}

export async function findActiveByHash(db: Tx, hash: Buffer): Promise<ApiKeyRow | undefined> {
  return db('api_keys').where({ key_hash: hash }).whereNull('revoked_at').first();
}

export async function listActive(db: Tx, pageSize: number, token?: string): Promise<Page<Omit<ApiKeyRow, 'key_hash' | 'revoked_at'>>> {
  return keysetPage(db('api_keys').select(PUBLIC_COLUMNS).whereNull('revoked_at'),
    { list: ['api-keys'], columns: ['created_at', 'id'], kinds: ['timestamp', 'uuid'], direction: 'desc', cursorOf: (r: ApiKeyRow) => [r.created_at, r.id] }, pageSize, token);
}

export async function revokeApiKey(db: Tx, id: string): Promise<boolean> {
  const n = await db('api_keys').where({ id }).whereNull('revoked_at').update({ revoked_at: db.fn.now() });
  return n > 0;
}

/** Of `ids`, those of keys that exist and are not revoked. */
export async function activeIds(db: Tx, ids: string[]): Promise<Set<string>> {
  const rows: { id: string }[] = await db('api_keys').select('id').whereIn('id', ids).whereNull('revoked_at');
  return new Set(rows.map((r) => r.id));
}

/** Ids of keys revoked within the last `ms` (by the database's clock). */
export async function revokedWithin(db: Tx, ms: number): Promise<string[]> {
  const rows: { id: string }[] = await db('api_keys').select('id').whereRaw('revoked_at > now() - make_interval(secs => ?)', [ms / 1000]);
  return rows.map((r) => r.id);
}

export async function touchLastUsed(db: Tx, id: string): Promise<void> {
  await db('api_keys').where({ id }).update({ last_used_at: db.fn.now() });
}

// Whether any key was ever created, revoked ones too. Not a count: that reads every key (25 ms at 100k).
export async function anyKeys(db: Tx): Promise<boolean> {
  const { rows: [row] } = await db.raw('select exists (select 1 from api_keys) as any');
  return row.any;
}

import { createHash, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import type { Tx } from '../db/knex.ts';
import * as repo from '../db/api-keys.ts';
import { InvalidRequest, NotFound } from './errors.ts';

export const SCOPES = [
  'task:read', 'task:write', 'secret:read', 'secret:write', 'secret:decrypt', 'encryption:read', 'encryption:write',
  'bridge:read', 'bridge:write', 'bridge:invoke', 'a2a', 'internal', 'admin',
] as const;
export type Scope = (typeof SCOPES)[number];

export interface Principal { id: string; name: string; scopes: Scope[] }

const PREFIX = 'tb_';
export const hashKey = (key: string) => createHash('sha256').update(key).digest();

export function hasScope(p: Principal, scope: Scope): boolean {
  return p.scopes.includes('admin') || p.scopes.includes(scope);
}

export async function createApiKey(db: Tx, name: string, scopes: Scope[]) {
  // A name a person reads back, as `keys create --name` requires (the schema's pattern refuses control characters).
  if (!name.trim()) throw new InvalidRequest('Invalid body: body.name must not be blank', [{ path: 'body.name', message: 'must not be blank' }]);
  const key = PREFIX + randomBytes(32).toString('base64url');
  const row = await repo.insertApiKey(db, { id: randomUUID(), name, scopes: [...new Set(scopes)], key_hash: hashKey(key) });
  return { ...row, key };
}

export async function revokeApiKey(db: Tx, id: string): Promise<void> {
  if (!(await repo.revokeApiKey(db, id))) throw new NotFound('api_key', id);
}

// The env admin key is compared in constant time; stored keys are found by the SHA-256 of a
// 256-bit random key, so the lookup reveals nothing an attacker can use.
export async function resolveApiKey(db: Tx, presented: string, adminKey: string | undefined): Promise<Principal | null> {
  const hash = hashKey(presented);
  if (adminKey) {
    const adminHash = hashKey(adminKey);
    if (timingSafeEqual(hash, adminHash)) return { id: 'env:ADMIN_API_KEY', name: 'ADMIN_API_KEY', scopes: ['admin'] };
  }
  const row = await repo.findActiveByHash(db, hash);
  if (!row || !timingSafeEqual(row.key_hash, hash)) return null;
  return { id: row.id, name: row.name, scopes: row.scopes as Scope[] };
}

import type { Knex } from 'knex';
import type { Tx } from './knex.ts';
import { keysetPage, PAGE_MAX_BYTES, batchWithinBytes, type Page, type Budget } from './pagination.ts';

export interface SecretRow {
  id: string;
  key: string;
  encrypted_secret: string;
  dek_id: string;
  dek_alias: string;
  created_at: Date;
  updated_at: Date;
}

export type SecretWrite = Pick<SecretRow, 'encrypted_secret' | 'dek_id' | 'dek_alias'>;

// Secret writes stamp updated_at with the statement's clock, not the transaction start, so a
// write is never dated before a rotation that began while it waited (see domain/alias-rotation.ts).

// Returns undefined when the key (or the id) is already taken.
export async function insertSecret(db: Tx, row: SecretWrite & { id: string; key: string }): Promise<SecretRow | undefined> {
  const res = await db.raw(
    `insert into secrets (id, key, encrypted_secret, dek_id, dek_alias, created_at, updated_at)
     select ?, ?, ?, ?, ?, t, t from (select clock_timestamp() as t) as c
     on conflict do nothing
     returning *`,
    [row.id, row.key, row.encrypted_secret, row.dek_id, row.dek_alias],
  );
  return res.rows[0] as SecretRow | undefined;
}

export async function getSecret(db: Tx, id: string, forUpdate = false): Promise<SecretRow | undefined> {
  const q = db('secrets').where({ id });
  return (forUpdate ? q.forUpdate() : q).first();
}

export async function getSecretByKey(db: Tx, key: string): Promise<SecretRow | undefined> {
  return db('secrets').where({ key }).first();
}

export async function listSecrets(db: Tx, pageSize: number, token?: string): Promise<Page<SecretRow>> {
  return keysetPage<SecretRow>(db('secrets').select('*'), {
    list: ['secrets'], columns: ['created_at', 'id'], kinds: ['timestamp', 'uuid'], direction: 'desc',
    cursorOf: (r) => [r.created_at, r.id], bytes: { db, size: 'octet_length(encrypted_secret)', max: PAGE_MAX_BYTES },
  }, pageSize, token);
}

export async function updateSecret(db: Tx, id: string, write: SecretWrite): Promise<SecretRow | undefined> {
  const [out] = await db('secrets').where({ id }).update({ ...write, updated_at: db.raw('clock_timestamp()') }).returning('*');
  return out as SecretRow | undefined;
}

export async function deleteSecret(db: Tx, id: string): Promise<boolean> {
  return (await db('secrets').where({ id }).delete()) > 0;
}

// --- alias rotation ---------------------------------------------------------------------------

export interface RotationCandidate { id: string; dek_id: string; encrypted_secret: string }

// Which secrets of `alias` a rotation pass takes: those after `afterId` in id order, last written
// before or since a time (a rotation's walk and its final sweep).
export interface RotationPass { afterId: string | null; written: { before: Date } | { since: Date } }

function inPass(q: Knex.QueryBuilder, pass: RotationPass): Knex.QueryBuilder {
  if (pass.afterId !== null) q.where('id', '>', pass.afterId);
  if ('before' in pass.written) q.where('updated_at', '<', pass.written.before);
  else q.where('updated_at', '>=', pass.written.since);
  return q;
}

// The next secrets of `alias` not yet under `newDekId` in a pass, in id order.
export async function secretsToRotate(db: Tx, alias: string, newDekId: string, pass: RotationPass, batch: Budget): Promise<RotationCandidate[]> {
  const q = inPass(db('secrets').select('id', 'dek_id', 'encrypted_secret').where({ dek_alias: alias }).whereNot({ dek_id: newDekId }).orderBy('id'), pass);
  return batchWithinBytes(db, q, ['id'], 'octet_length(encrypted_secret)', batch);
}

// Without `newDekId` (a rotation not started yet, with no new DEK): every secret of the alias;
// with `pass`, only those the pass has still to take.
export async function countSecretsToRotate(db: Tx, alias: string, newDekId?: string, pass?: RotationPass): Promise<number> {
  const q = db('secrets').where({ dek_alias: alias });
  if (newDekId) q.whereNot({ dek_id: newDekId });
  if (pass) inPass(q, pass);
  const [{ n }] = await q.count({ n: '*' });
  return Number(n);
}

// Batched compare-and-set: a secret is rewritten only if it still holds exactly the ciphertext
// that was re-encrypted (same DEK, same alias), so a concurrent PUT is never overwritten with
// the old value. Returns the ids actually rewritten.
export async function reencryptSecrets(
  db: Tx, alias: string, newDekId: string,
  rows: { id: string; old_dek_id: string; old_ciphertext: string; ciphertext: string }[],
): Promise<string[]> {
  if (!rows.length) return [];
  const res = await db.raw(
    `update secrets set encrypted_secret = v.c, dek_id = ?, updated_at = now()
       from unnest(?::uuid[], ?::text[], ?::text[], ?::text[]) as v(id, old_dek, old_c, c)
      where secrets.id = v.id and secrets.dek_id = v.old_dek and secrets.encrypted_secret = v.old_c
        and secrets.dek_alias = ?
      returning secrets.id`,
    [newDekId, rows.map((r) => r.id), rows.map((r) => r.old_dek_id), rows.map((r) => r.old_ciphertext), rows.map((r) => r.ciphertext), alias],
  );
  return (res.rows as { id: string }[]).map((r) => r.id);
}

import type { Knex } from 'knex';
import type { Tx } from './knex.ts';
import { keysetPage, type Page } from './pagination.ts';

export interface DekRow { id: string; envelope_key_id: string; encrypted_dek: string; created_at: Date; updated_at: Date }
export type DekListRow = Omit<DekRow, 'encrypted_dek'>;
export interface AliasRow { alias: string; dek_id: string; created_at: Date; updated_at: Date }

// Undefined when the id is taken or the envelope key is gone. The envelope key row is locked as
// the DEK goes in: a delete of the key that runs meanwhile waits and then finds the DEK (409), and
// one that ran first leaves no row to insert under (rather than a foreign key violation).
export async function insertDek(db: Tx, row: { id: string; envelope_key_id: string; encrypted_dek: string }): Promise<DekRow | undefined> {
  const res = await db.raw(
    `insert into deks (id, envelope_key_id, encrypted_dek)
     select ?, e.id, ? from envelope_keys e where e.id = ? for key share
     on conflict (id) do nothing
     returning *`,
    [row.id, row.encrypted_dek, row.envelope_key_id],
  );
  return res.rows[0] as DekRow | undefined;
}

// Bulk insert for seeding large key sets (bench, tests): one statement per call.
export async function insertDeks(db: Tx, rows: { id: string; envelope_key_id: string; encrypted_dek: string }[]): Promise<void> {
  if (rows.length) await db.raw(
    `insert into deks (id, envelope_key_id, encrypted_dek) select * from unnest(?::text[], ?::text[], ?::text[])`,
    [rows.map((r) => r.id), rows.map((r) => r.envelope_key_id), rows.map((r) => r.encrypted_dek)],
  );
}

// When the DEK of this id was deleted; undefined if none was.
export async function dekDeletedAt(db: Tx, id: string): Promise<Date | undefined> {
  return (await db('deleted_deks').where({ id }).first('deleted_at'))?.deleted_at;
}

export async function getDek(db: Tx, id: string): Promise<DekRow | undefined> {
  return db('deks').where({ id }).first();
}

export async function listDeksOf(db: Tx, envelopeKeyId: string, pageSize: number, token?: string): Promise<Page<DekListRow>> {
  const q = db('deks').select('id', 'envelope_key_id', 'created_at', 'updated_at').where({ envelope_key_id: envelopeKeyId });
  return keysetPage<DekListRow>(q, {
    list: ['deks', envelopeKeyId], columns: ['created_at', 'id'], kinds: ['timestamp', 'text'], direction: 'desc',
    cursorOf: (r) => [r.created_at, r.id],
  }, pageSize, token);
}

// Compare-and-set re-wrap of one DEK: only applies while it is still under `fromEnvelope`.
export async function rewrapDek(db: Tx, id: string, fromEnvelope: string, toEnvelope: string, encryptedDek: string): Promise<DekRow | undefined> {
  const [out] = await db('deks').where({ id, envelope_key_id: fromEnvelope })
    .update({ envelope_key_id: toEnvelope, encrypted_dek: encryptedDek, updated_at: db.fn.now() }).returning('*');
  return out as DekRow | undefined;
}

/**
 * Which DEKs under an envelope key a migration pass takes, in id order: those after `after` (a
 * cursor); with `since`, only those created or moved there since then; never those the key job
 * `notFailedIn` failed on.
 */
export interface DekFilter { after?: string | null; since?: Date; notFailedIn?: string }

function filtered(db: Tx, envelopeKeyId: string, f: DekFilter) {
  const q = db('deks').where({ envelope_key_id: envelopeKeyId });
  if (f.after) q.where('id', '>', f.after);
  if (f.since) q.where('updated_at', '>=', f.since);
  if (f.notFailedIn) q.whereNotExists(db('key_job_failures').where({ job_id: f.notFailedIn }).whereRaw('item_id = deks.id').select(db.raw('1')));
  return q;
}

export async function deksUnder(db: Tx, envelopeKeyId: string, filter: DekFilter, limit: number): Promise<{ id: string; encrypted_dek: string }[]> {
  return filtered(db, envelopeKeyId, filter).select('id', 'encrypted_dek').orderBy('id').limit(limit);
}

export async function countDeksUnder(db: Tx, envelopeKeyId: string, filter: DekFilter): Promise<number> {
  const [{ n }] = await filtered(db, envelopeKeyId, filter).count({ n: '*' });
  return Number(n);
}

// Batched compare-and-set re-wrap: a DEK no longer under `fromEnvelope` is left alone, so a
// repeated batch never wraps twice. Returns the ids actually re-wrapped.
export async function rewrapDeks(db: Tx, fromEnvelope: string, toEnvelope: string, ids: string[], wrapped: string[]): Promise<string[]> {
  if (!ids.length) return [];
  const res = await db.raw(
    `update deks set envelope_key_id = ?, encrypted_dek = v.w, updated_at = now()
       from unnest(?::text[], ?::text[]) as v(id, w)
      where deks.id = v.id and deks.envelope_key_id = ?
      returning deks.id`,
    [toEnvelope, ids, wrapped, fromEnvelope],
  );
  return (res.rows as { id: string }[]).map((r) => r.id);
}

// Deletes a DEK if nothing refers to it (an alias, a secret, a credential, a push config: their
// foreign keys refuse the delete, 23503, and the DEK stays); whether it was deleted. Its id is
// recorded as deleted with it, in the same transaction, and is never given to a DEK again.
export async function deleteUnusedDek(trx: Tx, id: string): Promise<boolean> {
  try {
    return await trx.transaction(async (sp) => {
      if (!(await sp('deks').where({ id }).delete())) return false;
      await sp('deleted_deks').insert({ id });
      return true;
    });
  } catch (err) {
    if ((err as { code?: string }).code === '23503') return false;
    throw err;
  }
}

export async function insertAlias(db: Tx, alias: string, dekId: string): Promise<AliasRow | undefined> {
  const [out] = await db('dek_aliases').insert({ alias, dek_id: dekId }).onConflict('alias').ignore().returning('*');
  return out as AliasRow | undefined;
}

export async function getAlias(db: Tx, alias: string): Promise<AliasRow | undefined> {
  return db('dek_aliases').where({ alias }).first();
}

export async function updateAlias(db: Tx, alias: string, dekId: string): Promise<AliasRow | undefined> {
  const [out] = await db('dek_aliases').where({ alias }).update({ dek_id: dekId, updated_at: db.fn.now() }).returning('*');
  return out as AliasRow | undefined;
}

export async function deleteAlias(db: Tx, alias: string): Promise<boolean> {
  return (await db('dek_aliases').where({ alias }).delete()) > 0;
}

// Whether secrets or bridge credentials still name the alias. Their tables belong to later
// migrations; before they exist nothing can use an alias.
export async function aliasInUse(db: Tx, alias: string): Promise<boolean> {
  const res = await db.raw(`select to_regclass('secrets') is not null as secrets, to_regclass('bridge_credentials') is not null as credentials`);
  const { secrets, credentials } = res.rows[0];
  if (secrets && await db('secrets').where({ dek_alias: alias }).first(db.raw('1'))) return true;
  return Boolean(credentials && await db('bridge_credentials').where({ dek_alias: alias }).first(db.raw('1')));
}

// The DEK an alias names, held (FOR SHARE) until `trx` ends: a value written under the alias
// commits before the alias can move or be removed, so a rotation never misses a write made with the old DEK.
export async function aliasDekForWrite(trx: Knex.Transaction, alias: string): Promise<string | undefined> {
  const row = await trx('dek_aliases').where({ alias }).forShare().first('dek_id');
  return row?.dek_id;
}

// Locks an alias row for the rest of `trx`: serialises rotation requests for one alias and
// keeps the alias from moving while a rotation starts or repoints it, or while it is deleted.
export async function lockAlias(trx: Knex.Transaction, alias: string): Promise<AliasRow | undefined> {
  return trx('dek_aliases').where({ alias }).forUpdate().first();
}

// Bridge tables: credentials, provider instances and their enabled functions.
import type { Knex } from 'knex';
import type { Tx } from './knex.ts';
import { firstWithinBytes, keysetPage, PAGE_MAX_BYTES, batchWithinBytes, type Keyset, type Page, type Budget } from './pagination.ts';
import { textWeightBound } from './messages.ts';
import type { ProviderStatus } from '../domain/bridge/types.ts';

export type CredentialKind = 'resource_server' | 'user';

export interface CredentialRow {
  id: string;
  kind: CredentialKind;
  provider_controller_type_id: string;
  type_id: string;
  value: Record<string, unknown>;
  metadata: Record<string, unknown>;
  dek_id: string;
  dek_alias: string;
  next_rotation_time: Date | null;
  /** Until when the refresh scan skips it: a refresh it queued may be under way (markDueCredentialRefreshes). */
  refresh_queued_until: Date | null;
  created_at: Date;
  updated_at: Date;
}

export interface ProviderInstanceRow {
  id: string;
  display_name: string;
  provider_controller_type_id: string;
  credential_controller_type_id: string;
  status: ProviderStatus;
  /** An admin set it disabled (and not active since); outlives a refresh_failed status. */
  disabled_by_admin: boolean;
  /** When a refresh gave up on it (refresh_failed); null once usable again. */
  refresh_failed_at: Date | null;
  resource_server_credential_id: string | null;
  user_credential_id: string | null;
  return_on_successful_brokering: { type: 'url'; url: string } | null;
  created_at: Date;
  updated_at: Date;
}

export interface FunctionInstanceRow {
  provider_instance_id: string;
  function_controller_type_id: string;
  provider_controller_type_id: string;
  created_at: Date;
  updated_at: Date;
}

// Undefined when the id is taken (an imported credential keeps its exported id).
export async function insertCredential(db: Tx, row: Omit<CredentialRow, 'refresh_queued_until' | 'created_at' | 'updated_at'>): Promise<CredentialRow | undefined> {
  const [out] = await db('bridge_credentials').insert({ ...row, value: JSON.stringify(row.value), metadata: JSON.stringify(row.metadata) })
    .onConflict('id').ignore().returning('*');
  return out as CredentialRow | undefined;
}

// FOR SHARE: a credential an instance is being created with cannot be deleted meanwhile.
export async function getCredentialForShare(db: Tx, id: string): Promise<CredentialRow | undefined> {
  return db('bridge_credentials').where({ id }).forShare().first();
}

// FOR NO KEY UPDATE: two instances created at once with one user credential see each other (the
// second waits for the first), and it cannot be deleted meanwhile.
export async function getUserCredentialForInstance(db: Tx, id: string): Promise<CredentialRow | undefined> {
  return db('bridge_credentials').where({ id }).forNoKeyUpdate().first();
}

// An instance that uses this user credential with another resource server credential (or none).
export async function instanceOfUserCredentialWithOtherClient(db: Tx, userCredentialId: string, resourceServerCredentialId: string | null): Promise<Pick<ProviderInstanceRow, 'id' | 'resource_server_credential_id'> | undefined> {
  return db('provider_instances').where({ user_credential_id: userCredentialId })
    .whereRaw('resource_server_credential_id is distinct from ?', [resourceServerCredentialId]).orderBy('id').first('id', 'resource_server_credential_id');
}

export async function getCredentials(db: Tx, ids: string[]): Promise<CredentialRow[]> {
  if (!ids.length) return [];
  return db('bridge_credentials').whereIn('id', [...new Set(ids)]);
}

// SQL: the provider instances (table or alias `p`) that use the credential whose id is `c`.
const usesCredential = (p: string, c: string) => `(${p}.resource_server_credential_id = ${c} or ${p}.user_credential_id = ${c})`;

// Credentials no provider instance refers to any more (after a delete).
// The credentials are locked first: an instance created meanwhile with one of them holds it (its
// foreign key check) until it commits, and the check below, a fresh snapshot after the wait, then
// sees it and keeps the credential. Judged on the first snapshot, the delete broke that foreign key.
export async function deleteOrphanCredentials(db: Tx, ids: string[]): Promise<void> {
  if (!ids.length) return;
  await db('bridge_credentials').whereIn('id', ids).orderBy('id').forUpdate().select('id');
  await db('bridge_credentials').whereIn('id', ids)
    .whereNotExists((q) => q.select(db.raw('1')).from('provider_instances').whereRaw(usesCredential('provider_instances', 'bridge_credentials.id')))
    .delete();
}

// The user credential `id`, locked FOR UPDATE, when no provider instance but `instanceId` uses it;
// undefined when another does, or it is gone. Locked before its use is read, as deleteOrphanCredentials
// does: an instance being created with it holds it until it commits, and is then seen.
export async function lockedUserCredentialOnlyOf(trx: Knex.Transaction, id: string, instanceId: string): Promise<CredentialRow | undefined> {
  const row: CredentialRow | undefined = await trx('bridge_credentials').where({ id }).forUpdate().first();
  if (!row) return undefined;
  const other = await trx('provider_instances').whereRaw(usesCredential('provider_instances', '?'), [id, id]).whereNot({ id: instanceId }).first('id');
  return other ? undefined : row;
}

// What a credential list or a refused delete names of the instances that use a credential: any
// number may share one, so the first this many in id order, and how many there are.
export const CREDENTIAL_USERS_SHOWN = 100;
export interface CredentialUse { provider_instance_ids: string[]; provider_instance_count: number }
export type ListedCredentialRow = CredentialRow & CredentialUse;
// SQL: a row of the CredentialUse of the credential whose id is `c` (for a lateral join).
const credentialUseSql = (c: string) => `select array(select p.id from provider_instances p where ${usesCredential('p', c)} order by p.id limit ${CREDENTIAL_USERS_SHOWN}) as provider_instance_ids,
  (select count(*)::int from provider_instances p where ${usesCredential('p', c)}) as provider_instance_count`;

// Credentials with the instances that use them, as the credential list and look-up show them.
const listedCredentials = (db: Tx) => db('bridge_credentials').joinRaw(`cross join lateral (${credentialUseSql('bridge_credentials.id')}) u`)
  .select('bridge_credentials.*', 'u.provider_instance_ids', 'u.provider_instance_count');

export async function getListedCredential(db: Tx, id: string): Promise<ListedCredentialRow | undefined> {
  return listedCredentials(db).where('bridge_credentials.id', id).first();
}

// Newest first, each with its use; `unused`: only those no instance uses (true) or only those in use (false).
export async function listCredentials(
  db: Tx, filter: { unused?: boolean; provider_controller_type_id?: string }, pageSize: number, token?: string,
): Promise<Page<ListedCredentialRow>> {
  const q = listedCredentials(db);
  if (filter.unused !== undefined) q.where('u.provider_instance_count', filter.unused ? '=' : '>', 0);
  if (filter.provider_controller_type_id) q.where({ 'bridge_credentials.provider_controller_type_id': filter.provider_controller_type_id });
  return keysetPage<ListedCredentialRow>(q, {
    list: ['credentials', filter.unused, filter.provider_controller_type_id], columns: ['bridge_credentials.created_at', 'bridge_credentials.id'], kinds: ['timestamp', 'uuid'], direction: 'desc',
    cursorOf: (r) => [r.created_at, r.id],
    bytes: { db, size: `bridge_credentials.weight + ${textWeightBound('array_to_json(u.provider_instance_ids)::text')}`, max: PAGE_MAX_BYTES },
  }, pageSize, token);
}

// The use of a credential about to be deleted (undefined: there is none), locked FOR UPDATE first:
// an instance being created with it holds it (FOR SHARE, FOR NO KEY UPDATE or its foreign key check)
// until it commits, and the use read next, a fresh snapshot after the wait, counts it; an instance
// created after waits for the delete, then finds no credential (404).
export async function lockedCredentialUse(trx: Knex.Transaction, id: string): Promise<CredentialUse | undefined> {
  if (!await trx('bridge_credentials').where({ id }).forUpdate().first('id')) return undefined;
  const { rows } = await trx.raw(`select u.* from (select ?::uuid as id) c cross join lateral (${credentialUseSql('c.id')}) u`, [id]);
  return rows[0] as CredentialUse;
}

export async function deleteCredential(trx: Knex.Transaction, id: string): Promise<void> {
  await trx('bridge_credentials').where({ id }).delete();
}

// The status of an instance made usable: active, unless an admin disabled it (that stays their
// call, through a refresh_failed meanwhile).
const USABLE_STATUS = `case when disabled_by_admin then 'disabled' else 'active' end`;

// A brokered user credential replaces the instance's and makes it usable.
export async function setUserCredential(db: Tx, instanceId: string, credentialId: string): Promise<void> {
  await db('provider_instances').where({ id: instanceId }).update({
    user_credential_id: credentialId, status: db.raw(USABLE_STATUS), refresh_failed_at: null, updated_at: db.fn.now(),
  });
}

// Returns undefined when the id is taken.
export async function insertProviderInstance(db: Tx, row: Omit<ProviderInstanceRow, 'created_at' | 'updated_at' | 'disabled_by_admin' | 'refresh_failed_at'>): Promise<ProviderInstanceRow | undefined> {
  const [out] = await db('provider_instances')
    .insert({ ...row, return_on_successful_brokering: row.return_on_successful_brokering ? JSON.stringify(row.return_on_successful_brokering) : null })
    .onConflict('id').ignore().returning('*');
  return out as ProviderInstanceRow | undefined;
}

export async function getProviderInstance(db: Tx, id: string, lock?: 'share' | 'update'): Promise<ProviderInstanceRow | undefined> {
  const q = db('provider_instances').where({ id });
  if (lock === 'share') q.forShare();
  if (lock === 'update') q.forUpdate();
  return q.first();
}

// What an instance (`p`: its table's name or alias) weighs in an answer that shows its credentials:
// its own text, and each credential it names at the most its JSON can weigh parsed (`weight`, migration
// 0026). A credential is counted at every instance naming it, as the answer repeats it there: one
// credential of a megabyte shared by a thousand instances is a gigabyte of answer.
export function instanceWeightSql(p: string): string {
  const credential = (column: string) => `coalesce((select c.weight from bridge_credentials c where c.id = ${p}.${column}), 0)`;
  return `octet_length(${p}.id) + octet_length(${p}.display_name) + coalesce(${textWeightBound(`${p}.return_on_successful_brokering::text`)}, 0)
    + ${credential('resource_server_credential_id')} + ${credential('user_credential_id')}`;
}

export async function listProviderInstances(
  db: Tx, filter: { status?: string; provider_controller_type_id?: string }, pageSize: number, token?: string,
): Promise<Page<ProviderInstanceRow>> {
  const q = db('provider_instances').select('*');
  if (filter.status) q.where({ status: filter.status });
  if (filter.provider_controller_type_id) q.where({ provider_controller_type_id: filter.provider_controller_type_id });
  return keysetPage<ProviderInstanceRow>(q, {
    list: ['provider-instances', filter.status, filter.provider_controller_type_id], columns: ['created_at', 'id'], kinds: ['timestamp', 'text'], direction: 'desc',
    cursorOf: (r) => [r.created_at, r.id], bytes: { db, size: instanceWeightSql('provider_instances'), max: PAGE_MAX_BYTES },
  }, pageSize, token);
}

export async function updateProviderInstance(db: Tx, id: string, patch: Partial<Pick<ProviderInstanceRow, 'display_name' | 'status' | 'disabled_by_admin'>>): Promise<ProviderInstanceRow | undefined> {
  const [out] = await db('provider_instances').where({ id }).update({ ...patch, updated_at: db.fn.now() }).returning('*');
  return out as ProviderInstanceRow | undefined;
}

export async function deleteProviderInstance(trx: Knex.Transaction, id: string): Promise<ProviderInstanceRow | undefined> {
  const [out] = await trx('provider_instances').where({ id }).delete().returning('*');
  return out as ProviderInstanceRow | undefined;
}

export async function insertFunctionInstance(db: Tx, row: Omit<FunctionInstanceRow, 'created_at' | 'updated_at'>): Promise<FunctionInstanceRow | undefined> {
  const [out] = await db('function_instances').insert(row).onConflict(['provider_instance_id', 'function_controller_type_id']).ignore().returning('*');
  return out as FunctionInstanceRow | undefined;
}

export async function deleteFunctionInstance(db: Tx, providerInstanceId: string, functionTypeId: string): Promise<boolean> {
  return (await db('function_instances').where({ provider_instance_id: providerInstanceId, function_controller_type_id: functionTypeId }).delete()) > 0;
}

export async function getFunctionInstance(db: Tx, providerInstanceId: string, functionTypeId: string): Promise<FunctionInstanceRow | undefined> {
  return db('function_instances').where({ provider_instance_id: providerInstanceId, function_controller_type_id: functionTypeId }).first();
}

// The enabled functions of one type whose instance id starts with `idPrefix` (MCP resolves a
// shortened tool name through them).
export async function functionInstancesByIdPrefix(db: Tx, providerTypeId: string, functionTypeId: string, idPrefix: string): Promise<FunctionInstanceRow[]> {
  return db('function_instances')
    .where({ provider_controller_type_id: providerTypeId, function_controller_type_id: functionTypeId })
    .whereRaw('starts_with(provider_instance_id, ?)', [idPrefix]);
}

export async function functionInstancesOf(db: Tx, providerInstanceIds: string[]): Promise<FunctionInstanceRow[]> {
  if (!providerInstanceIds.length) return [];
  return db('function_instances').whereIn('provider_instance_id', providerInstanceIds).orderBy(['provider_instance_id', 'function_controller_type_id']);
}

// Enabled functions newest first; `list` as Keyset.list; `table` names function_instances' columns where a join makes them ambiguous.
const newestFunctionInstances = (list: unknown[], table?: string): Keyset<FunctionInstanceRow> => ({
  list, columns: ['created_at', 'provider_instance_id', 'function_controller_type_id'].map((c) => (table ? `${table}.${c}` : c)), kinds: ['timestamp', 'text', 'text'], direction: 'desc',
  cursorOf: (r) => [r.created_at, r.provider_instance_id, r.function_controller_type_id],
});

export async function listFunctionInstances(db: Tx, filter: { provider_instance_id?: string }, pageSize: number, token?: string): Promise<Page<FunctionInstanceRow>> {
  const q = db('function_instances').select('*');
  if (filter.provider_instance_id) q.where({ provider_instance_id: filter.provider_instance_id });
  return keysetPage<FunctionInstanceRow>(q, newestFunctionInstances(['function-instances', filter.provider_instance_id]), pageSize, token);
}

// The (provider, function) and (provider, credential controller) type id pairs a release's catalog has.
export interface CatalogPairs { functions: [string, string][]; credentials: [string, string][] }

// The enabled functions a call can run, paged as listFunctionInstances: of an active provider
// instance (its credentials ready) of the same provider, whose function and credential controller
// the catalog has. Left out here, not from a page read, so that a page is never short for them.
export async function listRunnableFunctionInstances(db: Tx, catalog: CatalogPairs, pageSize: number, token?: string): Promise<Page<FunctionInstanceRow>> {
  const q = db('function_instances').select('function_instances.*')
    .join('provider_instances', (on) => on.on('provider_instances.id', 'function_instances.provider_instance_id')
      .andOn('provider_instances.provider_controller_type_id', 'function_instances.provider_controller_type_id'))
    .where('provider_instances.status', 'active')
    .whereIn(['function_instances.provider_controller_type_id', 'function_instances.function_controller_type_id'], catalog.functions)
    .whereIn(['provider_instances.provider_controller_type_id', 'provider_instances.credential_controller_type_id'], catalog.credentials);
  // Its catalog is the release's, not a filter of the caller's: a cursor holds across a release that changes it.
  return keysetPage<FunctionInstanceRow>(q, newestFunctionInstances(['runnable-function-instances'], 'function_instances'), pageSize, token);
}

// The (provider, function) pairs the enabled functions name, each with its number of instances, in
// the order of its first instance in key order (that of functionInstancesAfter).
export interface FunctionTypeInUse { provider_controller_type_id: string; function_controller_type_id: string; instances: number }
export async function functionTypesInUse(db: Tx): Promise<FunctionTypeInUse[]> {
  return db('function_instances').select('provider_controller_type_id', 'function_controller_type_id', db.raw('count(*)::int as instances'))
    .groupBy('provider_controller_type_id', 'function_controller_type_id')
    .orderByRaw('min(provider_instance_id), function_controller_type_id');
}

// The enabled functions whose (provider_instance_id, function_controller_type_id) hold the same ASCII
// letters and digits as another's, case aside: only those can share a generated method name, which
// keeps those and changes only their case (domain/bridge/codegen.ts). Usually none.
export async function functionInstancesNamedAlike(db: Tx): Promise<Pick<FunctionInstanceRow, 'provider_instance_id' | 'function_controller_type_id'>[]> {
  // In the C collation, the class and lower() mean ASCII whatever the database's locale.
  const letters = `lower(regexp_replace((provider_instance_id || function_controller_type_id) collate "C", '[^0-9A-Za-z]+', '', 'g'))`;
  return db.select('provider_instance_id', 'function_controller_type_id')
    .from(db('function_instances').select('provider_instance_id', 'function_controller_type_id', db.raw(`count(*) over (partition by ${letters}) as alike`)).as('f'))
    .where('alike', '>', 1);
}

// Up to `limit` enabled functions in key order, after `after` (the last of the batch before; none: from the first).
export async function functionInstancesAfter(
  db: Tx, after: Pick<FunctionInstanceRow, 'provider_instance_id' | 'function_controller_type_id'> | undefined, limit: number,
): Promise<FunctionInstanceRow[]> {
  const q = db('function_instances').orderBy(['provider_instance_id', 'function_controller_type_id']).limit(limit);
  if (after) q.whereRaw('(provider_instance_id, function_controller_type_id) > (?, ?)', [after.provider_instance_id, after.function_controller_type_id]);
  return q;
}

// Enabled functions a batch holds, for the documents that describe them all.
export const FUNCTION_INSTANCE_BATCH = 500;

// All enabled functions in key order, batch by batch: `first` (the caller read it: a database out of
// reach fails before its answer begins), then the batches after it, until one is short.
export async function* functionInstanceBatches(db: Tx, first: FunctionInstanceRow[]): AsyncGenerator<FunctionInstanceRow[]> {
  for (let rows = first; ; rows = await functionInstancesAfter(db, rows.at(-1), FUNCTION_INSTANCE_BATCH)) {
    yield rows;
    if (rows.length < FUNCTION_INSTANCE_BATCH) return;
  }
}

// The provider instances that enabled a function (grouped-by-function lists), newest first, after
// `after`: at most `limit`, and past the first what `maxBytes` holds of their weight with credentials.
export async function instancesWithFunction(
  db: Tx, providerTypeId: string, functionTypeId: string, after: { created_at: string; id: string } | undefined, batch: Budget,
): Promise<{ rows: ProviderInstanceRow[]; cut: boolean; bytes: number }> {
  const q = db('provider_instances').join('function_instances', 'function_instances.provider_instance_id', 'provider_instances.id')
    .where({ 'function_instances.provider_controller_type_id': providerTypeId, 'function_instances.function_controller_type_id': functionTypeId })
    .orderBy([{ column: 'provider_instances.created_at', order: 'desc' }, { column: 'provider_instances.id', order: 'desc' }])
    .select('provider_instances.*');
  if (after) q.whereRaw('(provider_instances.created_at, provider_instances.id) < (?, ?)', [after.created_at, after.id]);
  return firstWithinBytes<ProviderInstanceRow>(db, q, {
    columns: ['provider_instances.created_at', 'provider_instances.id'], direction: 'desc', size: instanceWeightSql('provider_instances'), budget: batch,
  });
}

// Rotation of an alias (domain/alias-rotation.ts): its credentials not under `newDekId`, in id order after `afterId`.
export type CredentialToRotate = Pick<CredentialRow, 'id' | 'kind' | 'provider_controller_type_id' | 'type_id' | 'value' | 'dek_id'>;
export async function credentialsToRotate(db: Tx, alias: string, newDekId: string, afterId: string | null, batch: Budget): Promise<CredentialToRotate[]> {
  const q = db('bridge_credentials').select('id', 'kind', 'provider_controller_type_id', 'type_id', 'value', 'dek_id')
    .where({ dek_alias: alias }).whereNot({ dek_id: newDekId }).orderBy('id');
  if (afterId !== null) q.where('id', '>', afterId);
  return batchWithinBytes(db, q, ['id'], 'weight', batch);
}

export async function countCredentialsToRotate(db: Tx, alias: string, newDekId: string): Promise<number> {
  const [{ n }] = await db('bridge_credentials').where({ dek_alias: alias }).whereNot({ dek_id: newDekId }).count({ n: '*' });
  return Number(n);
}

// Compare-and-set: a credential is rewritten only if it still holds the value that was
// re-encrypted. Returns how many were rewritten.
export async function reencryptCredentials(
  db: Tx, newDekId: string, rows: { id: string; old_dek_id: string; old_value: Record<string, unknown>; value: Record<string, unknown> }[],
): Promise<number> {
  if (!rows.length) return 0;
  const res = await db.raw(
    `update bridge_credentials b set value = v.value, dek_id = ?, updated_at = now()
       from unnest(?::uuid[], ?::text[], ?::jsonb[], ?::jsonb[]) as v(id, old_dek, old_value, value)
      where b.id = v.id and b.dek_id = v.old_dek and b.value = v.old_value`,
    [newDekId, rows.map((r) => r.id), rows.map((r) => r.old_dek_id), rows.map((r) => JSON.stringify(r.old_value)), rows.map((r) => JSON.stringify(r.value))],
  );
  return res.rowCount ?? 0;
}

// When the refresh scan takes a user credential: its next_rotation_time, or later while the refresh
// the scan queued may still be under way (refresh_queued_until; greatest ignores a null). Migration
// 0040 indexes it for the credentials that have a next_rotation_time.
const SCAN_DUE = 'greatest(c.next_rotation_time, c.refresh_queued_until)';
// A refresh_queued_until `ms` from now.
const queuedFor = (db: Tx, ms: number) => db.raw(`now() + ?::float8 * interval '1 millisecond'`, [ms]);

// Up to `limit` user credentials due for refresh of instances that use them and are usable or merely
// disabled (a refresh_failed instance waits for brokering), the first the scan may take (SCAN_DUE)
// first, each marked as queued for `queuedForMs`, until when the scan skips it: credentials whose
// refreshes wait out a provider's outage stayed the earliest due and, more than `limit` of them, kept
// every other credential from being queued. Each once however many instances share it (a join on
// instances gave a credential one row each, and a widely shared one filled the scan). Rows locked by
// another scan or a refresh's write are left to them. Returned by next_rotation_time, the most overdue
// first (one whose mark passed, its job lost, comes before those just due), the order their jobs are queued in.
export async function markDueCredentialRefreshes(db: Tx, limit: number, queuedForMs: number): Promise<{ id: string }[]> {
  const due = db('bridge_credentials as c').select('c.id')
    .where('c.kind', 'user').whereNotNull('c.next_rotation_time').whereRaw(`${SCAN_DUE} <= now()`)
    .whereExists(db('provider_instances as p').whereRaw('p.user_credential_id = c.id').whereIn('p.status', ['active', 'disabled']))
    .orderByRaw(SCAN_DUE).limit(limit)
    .forUpdate('c').skipLocked();
  // An array, not `in`: with `in` the planner joined the marked rows with a read of the whole table.
  const rows: { id: string; next_rotation_time: Date }[] = await db('bridge_credentials').whereRaw('id = any(array(?))', [due])
    .update({ refresh_queued_until: queuedFor(db, queuedForMs) })
    .returning(['id', 'next_rotation_time']);
  return rows.sort((a, b) => a.next_rotation_time.getTime() - b.next_rotation_time.getTime()).map(({ id }) => ({ id }));
}

// A refresh attempt failed and the job is retried: the scan skips the credential for `queuedForMs`
// from now on (the backoff and the next attempt).
export async function extendCredentialRefreshMark(db: Tx, id: string, queuedForMs: number): Promise<void> {
  await db('bridge_credentials').where({ id }).update({ refresh_queued_until: queuedFor(db, queuedForMs) });
}

// The marks markDueCredentialRefreshes set, on credentials whose jobs could not be queued after all or
// whose refresh gave up.
export async function unmarkCredentialRefreshes(db: Tx, ids: string[]): Promise<void> {
  if (ids.length) await db('bridge_credentials').whereIn('id', ids).update({ refresh_queued_until: null });
}

// A user credential with the instance that uses it (active or disabled), whether it is due, and
// when it was read, by the database's clock; undefined when there is no such pair.
export async function credentialDueForRefresh(db: Tx, credentialId: string): Promise<{ row: CredentialRow; instance: ProviderInstanceRow; due: boolean; readAt: Date } | undefined> {
  const row: (CredentialRow & { due: boolean; read_at: Date }) | undefined = await db('bridge_credentials').where({ id: credentialId })
    .first('*', db.raw('coalesce(next_rotation_time <= now(), false) as due'), db.raw('now() as read_at'));
  if (!row) return undefined;
  const instance = await db('provider_instances').where({ user_credential_id: credentialId }).whereIn('status', ['active', 'disabled']).first();
  if (!instance) return undefined;
  const { due, read_at: readAt, ...credential } = row;
  return { row: credential, instance, due, readAt };
}

// The instances of a user credential, locked before the credential by the refresh's writes that then
// change them: brokering locks its instance, then the credential it replaces (deleteOrphanCredentials),
// and the other way round the two deadlocked (40P01). In id order, as any other taker of several.
async function lockInstancesOfUserCredential(trx: Knex.Transaction, credentialId: string): Promise<void> {
  await trx('provider_instances').where({ user_credential_id: credentialId }).orderBy('id').forUpdate().select('id');
}

// Compare-and-set: the refreshed value is written only over the value it was refreshed from. Its
// refresh is over: the scan takes it again at its next due time. The instances are locked first, for
// reviveRefreshFailedInstances next in `trx`.
export async function replaceCredentialValue(
  trx: Knex.Transaction, id: string, oldValue: Record<string, unknown>, next: { value: Record<string, unknown>; dek_id: string; next_rotation_time: Date | null },
): Promise<boolean> {
  await lockInstancesOfUserCredential(trx, id);
  const n = await trx('bridge_credentials').where({ id }).whereRaw('value = ?::jsonb', [JSON.stringify(oldValue)])
    .update({ value: JSON.stringify(next.value), dek_id: next.dek_id, next_rotation_time: next.next_rotation_time, refresh_queued_until: null, updated_at: trx.fn.now() });
  return n > 0;
}

// Compare-and-set, as replaceCredentialValue, when `value` is given: the instances are marked only
// while their credential still holds the value whose refresh failed (another refresh may have stored
// new tokens since). The credential row is locked for the check, as replaceCredentialValue's write
// locks it: a write under way is waited for and its value compared, not the one before it. The
// instances are locked before the credential, as that write and brokering lock them.
export async function setInstanceStatusOfUserCredential(trx: Knex.Transaction, credentialId: string, value: Record<string, unknown> | undefined, status: 'refresh_failed'): Promise<string[]> {
  await lockInstancesOfUserCredential(trx, credentialId);
  const q = trx('provider_instances').where({ user_credential_id: credentialId }).whereIn('status', ['active', 'disabled']);
  if (value) {
    q.with('unchanged', trx('bridge_credentials').where({ id: credentialId }).whereRaw('value = ?::jsonb', [JSON.stringify(value)]).forUpdate().select('id'))
      .whereIn('user_credential_id', trx('unchanged').select('id'));
  }
  const rows = await q.update({ status, refresh_failed_at: trx.fn.now(), updated_at: trx.fn.now() }).returning('id');
  return rows.map((r: { id: string }) => r.id);
}

// After a refresh stored new tokens, in its transaction: the credential's instances that another run
// of the same refresh marked refresh_failed meanwhile (refused the refresh token this run spent) are
// usable again. Meanwhile: marked (refresh_failed_at, which only the mark sets: a PATCH moves
// updated_at too) since `since`, when this run read the credential; one marked before, which shares
// the credential with an instance created since, waits for brokering. Returns their ids.
export async function reviveRefreshFailedInstances(db: Tx, credentialId: string, since: Date): Promise<string[]> {
  const rows = await db('provider_instances').where({ user_credential_id: credentialId, status: 'refresh_failed' }).where('refresh_failed_at', '>=', since)
    .update({ status: db.raw(USABLE_STATUS), refresh_failed_at: null, updated_at: db.fn.now() }).returning('id');
  return rows.map((r: { id: string }) => r.id);
}

export async function countProviderInstancesByStatus(db: Tx): Promise<Record<string, number>> {
  const rows: { status: string; n: string }[] = await db('provider_instances').select('status').count({ n: '*' }).groupBy('status');
  return Object.fromEntries(rows.map((r) => [r.status, Number(r.n)]));
}

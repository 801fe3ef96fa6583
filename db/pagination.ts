import { createHash } from 'node:crypto';
import type { Knex } from 'knex';
import { InvalidRequest } from '../domain/errors.ts';
import type { Tx } from './knex.ts';

export interface Page<T> { items: T[]; next_page_token?: string }

// What a page of a list with large rows holds at most (Keyset.bytes), past its first row: bytes of
// text, or for JSON the weight it has once parsed (db/messages.ts messageWeightSql), which is what the
// API holds in memory to answer.
export const PAGE_MAX_BYTES = 8 * 1024 * 1024;

type KeyKind = 'timestamp' | 'uuid' | 'int' | 'text';
export interface Keyset<Row> {
  // What the list is, as its tokens carry it (with `columns` and `direction`): a name of its own and
  // the values of its filters. Not the query's text: a release that selects a column more would
  // refuse every token the one before handed out (a client paging across a rolling deploy).
  list: unknown[];
  columns: string[]; // qualified column names, all ordered in `direction`
  kinds: KeyKind[];
  direction: 'asc' | 'desc';
  cursorOf: (row: Row) => unknown[];
  // Lists whose rows can be large (secret values, task metadata: up to the body limit each) also end
  // a page at `max` bytes of `size` (an SQL expression of a row's size): a page of 1,000 such rows,
  // read and answered whole, could hold a gigabyte. The first row is always taken.
  bytes?: { db: Tx; size: string; max: number };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// Only the form encodeToken writes: Date.parse also takes '1', '2026-02-30' or year +275760,
// which Postgres refuses (a 500 for a forged token); likewise NUL characters in text keys.
const TIMESTAMP = /^[1-9]\d{3}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

function checkKind(kind: KeyKind, v: unknown): boolean {
  switch (kind) {
    case 'timestamp': return typeof v === 'string' && TIMESTAMP.test(v) && new Date(v).toISOString() === v;
    case 'uuid': return typeof v === 'string' && UUID.test(v);
    case 'int': return Number.isSafeInteger(v);
    case 'text': return typeof v === 'string' && !v.includes('\u0000');
  }
}

// A token carries the list it came from: a digest of the list's name, its filters' values and its
// order. A token of another list, another filter or the other order is refused rather than read as
// a position in this one.
const listDigest = (list: unknown) => createHash('sha256').update(JSON.stringify(list)).digest('base64url').slice(0, 12);

// `shapes`: the kinds of the values a token of this list may hold, told apart by their number.
function decodeToken(token: string, shapes: KeyKind[][], list: string): unknown[] {
  // Worded as a refused query parameter is (domain/schema-check.ts), as an over-long token is.
  const bad = () => new InvalidRequest('Invalid query: query.next_page_token is not a token returned by this list', [{ path: 'query.next_page_token', message: 'is not a token returned by this list' }]);
  let decoded: unknown;
  try {
    decoded = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
  } catch {
    throw bad();
  }
  if (!Array.isArray(decoded) || decoded[0] !== list) throw bad();
  const values = decoded.slice(1);
  const kinds = shapes.find((k) => k.length === values.length);
  if (!kinds || !values.every((v, i) => checkKind(kinds[i], v))) throw bad();
  return values;
}

// Exported for bench/pagination.ts, which makes the token of a deep page without walking to it.
export function encodeToken(list: string, values: unknown[]): string {
  return Buffer.from(JSON.stringify([list, ...values.map((v) => (v instanceof Date ? v.toISOString() : v))])).toString('base64url');
}

// Keyset pagination: rows strictly after the cursor in the list's order, one extra row to
// learn whether another page exists.
export async function keysetPage<Row>(
  query: Knex.QueryBuilder,
  keyset: Keyset<Row>,
  pageSize: number,
  token: string | undefined,
): Promise<Page<Row>> {
  const { columns, direction } = keyset;
  const list = listDigest([keyset.list, columns, direction]);
  if (token !== undefined) {
    const values = decodeToken(token, [keyset.kinds], list);
    const op = direction === 'desc' ? '<' : '>';
    query.whereRaw(`(${columns.map(() => '??').join(', ')}) ${op} (${values.map(() => '?').join(', ')})`, [...columns, ...(values as Knex.Value[])]);
  }
  for (const c of columns) query.orderBy(c, direction);
  const { bytes } = keyset;
  const rows = bytes
    ? await firstWithinBytes<Row>(bytes.db, query, { columns, direction, size: bytes.size, budget: { limit: pageSize + 1, maxBytes: bytes.max } })
    : { rows: (await query.limit(pageSize + 1)) as Row[], cut: false };
  if (rows.rows.length <= pageSize && !rows.cut) return { items: rows.rows };
  const items = rows.rows.slice(0, pageSize);
  return { items, next_page_token: encodeToken(list, keyset.cursorOf(items[items.length - 1])) };
}

// The first of `query`'s rows (at most `budget.limit`, in the order of `columns`) whose `size`s before
// them stay under `budget.maxBytes`, always the first; `cut` tells whether rows were left out for the budget,
// `bytes` what the rows taken weigh.
// Only the rows taken are sent by Postgres (the others' large values are never read out), and each
// row's size is worked out once, for the limited rows only.
export async function firstWithinBytes<Row>(
  db: Tx, query: Knex.QueryBuilder, o: { columns: string[]; direction: 'asc' | 'desc'; size: string; budget: Budget },
): Promise<{ rows: Row[]; cut: boolean; bytes: number }> {
  const names = o.columns.map((c) => c.split('.').pop()!);
  const order = names.map(() => `?? ${o.direction}`).join(', ');
  const sized = query.select(db.raw(`${o.size} as _size`)).limit(o.budget.limit);
  const counted = db.select('*', db.raw(`sum(_size) over (order by ${order} rows unbounded preceding) - _size as _bytes_before`, names), db.raw('count(*) over () as _fetched'))
    .from(sized.as('l'));
  const outer = db.select('*').from(counted.as('w')).where('_bytes_before', '<', o.budget.maxBytes);
  for (const c of names) outer.orderBy(c, o.direction);
  const rows = (await outer) as (Row & { _size?: unknown; _bytes_before?: unknown; _fetched?: unknown })[];
  const fetched = rows.length ? Number(rows[0]._fetched) : 0;
  const bytes = rows.reduce((sum, r) => sum + Number(r._size), 0);
  // Copies without the three, not `delete`: a deleted property leaves a slow (dictionary) object that
  // every later step (toTask's copy, the response's JSON) reads more slowly.
  return { rows: rows.map(({ _size: _s, _bytes_before: _b, _fetched: _f, ...row }) => row as Row), cut: rows.length < fetched, bytes };
}

// What a batch of rows held in memory at once may hold: at most `limit` rows and, past the first,
// `maxBytes` of their size (a key job's batch, a list's share of a page).
export interface Budget { limit: number; maxBytes: number }

// Such a batch in ascending order of `columns`.
export async function batchWithinBytes<Row>(db: Tx, query: Knex.QueryBuilder, columns: string[], size: string, batch: Budget): Promise<Row[]> {
  return (await firstWithinBytes<Row>(db, query, { columns, direction: 'asc', size, budget: batch })).rows;
}

// Tokens of a list paged by hand, whose position takes one of several `shapes` (told apart by their
// number of values). `list` tells the list apart from others, as Keyset.list does.
export function pageTokens(list: unknown, shapes: KeyKind[][]) {
  const digest = listDigest(list);
  return {
    encode: (values: unknown[]) => encodeToken(digest, values),
    decode: (token: string): unknown[] => decodeToken(token, shapes, digest),
  };
}

// The same tokens over a short list held in memory (e.g. the provider catalog), ordered by a
// unique text key ascending. `list` tells the list apart from others (its name and filters, if any).
export function listPage<T>(list: unknown, items: readonly T[], keyOf: (item: T) => string, pageSize: number, token: string | undefined): Page<T> {
  const tokens = pageTokens(list, [['text']]);
  const after = token === undefined ? undefined : (tokens.decode(token)[0] as string);
  const rest = [...items].sort((a, b) => (keyOf(a) < keyOf(b) ? -1 : 1)).filter((i) => after === undefined || keyOf(i) > after);
  if (rest.length <= pageSize) return { items: rest };
  const page = rest.slice(0, pageSize);
  return { items: page, next_page_token: tokens.encode([keyOf(page[page.length - 1])]) };
}

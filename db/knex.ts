import knexFactory, { type Knex } from 'knex';
import pg from 'pg';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { timerMs } from '../domain/with-timeout.ts';
import { advisoryXactLock } from './advisory-locks.ts';

// int8 counts come back as numbers, not strings; counts here stay far below 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (v: string) => Number(v));

export type Db = Knex;
export type Tx = Knex | Knex.Transaction;

const migrationsDir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'migrations');
// How knex finds this release's migrations. It would refuse a database with migrations it has no
// file of; see migrationState for why those are fine.
const MIGRATION_EXTENSION = '.ts';
export const migrationConfig = { directory: migrationsDir, loadExtensions: [MIGRATION_EXTENSION], disableMigrationsListValidation: true };

// How much longer than the server's statement_timeout the client waits for an answer: Postgres
// cancels a slow statement itself; the client's own timeout is for a server that went silent.
const CLIENT_TIMEOUT_GRACE_MS = 2000;
/** How long the client waits for a statement's answer (pg's query_timeout) when statement_timeout is `queryTimeoutMs`. */
export const readTimeoutMs = (queryTimeoutMs: number) => timerMs(queryTimeoutMs + CLIENT_TIMEOUT_GRACE_MS);
// A connection attempt that gets no answer is abandoned well within the pool's acquire timeout:
// left pending, it would hold its pool slot, and the requests waiting for it, long after a
// partition has healed.
const CONNECT_TIMEOUT_MS = 5000;

// pg keeps a statement the client gave up on (query_timeout) as the connection's active query, and
// queues every later one behind it: from a silent server its answer never comes. A connection is
// taken from the pool only when it is ready for a statement; one that is not is dropped.
const readyForQuery = (connection: { readyForQuery?: boolean }) => connection.readyForQuery === true;

// Where knex's own warnings go: by default console.warn, with stacks, once per failed connection
// attempt. Failures reach callers as errors anyway; these lines only help while debugging.
export interface DbLog { debug(obj: object, msg: string): void }

export interface DbOptions {
  queryTimeoutMs?: number;
  lockTimeoutMs?: number;
  log?: DbLog;
  /** How long a connection attempt, and a wait for a free pool connection, may take (defaults: 5 s, 10 s). */
  connectTimeoutMs?: number;
  acquireTimeoutMs?: number;
  /** What pg_stat_activity shows for the pool's connections. */
  applicationName?: string;
}

export function createDb(url: string, pool = { min: 0, max: 20 }, opts: DbOptions = {}): Knex {
  const timeouts = {
    ...(opts.queryTimeoutMs ? { statement_timeout: opts.queryTimeoutMs, query_timeout: readTimeoutMs(opts.queryTimeoutMs) } : {}),
    ...(opts.lockTimeoutMs ? { lock_timeout: opts.lockTimeoutMs } : {}),
  };
  // As an object: knex's own URL parsing cannot read a socket path (?host=/dir), pg's can.
  // compileSqlOnError off: a failed query's error names its SQL with placeholders, never the values
  // (which can be ciphertexts, wrapped keys or other tasks' messages in a batched statement).
  return knexFactory({
    client: 'pg',
    connection: {
      connectionString: url, keepAlive: true, connectionTimeoutMillis: opts.connectTimeoutMs ?? CONNECT_TIMEOUT_MS, ...timeouts,
      ...(opts.applicationName ? { application_name: opts.applicationName } : {}),
    },
    pool: { ...pool, validate: readyForQuery },
    acquireConnectionTimeout: opts.acquireTimeoutMs ?? 10000, compileSqlOnError: false,
    ...(opts.log ? { log: knexLog(opts.log) } : {}),
  });
}

// The statement_timeout Postgres applies to db's statements, in milliseconds (0: none): not
// DB_QUERY_TIMEOUT_MS when something between drops the startup parameter (PgBouncer's
// ignore_startup_parameters) or, with it 0, the role, database or URL's options set one.
export async function statementTimeoutMs(db: Knex): Promise<number> {
  const { rows: [{ ms }] } = await db.raw(`select setting::int as ms from pg_settings where name = 'statement_timeout'`);
  return ms as number;
}

function knexLog(log: DbLog) {
  const line = (level: string) => (message: unknown) => log.debug({ knex: level }, String(message).split('\n')[0]);
  return { warn: line('warn'), error: line('error'), deprecate: line('deprecate'), debug: line('debug') };
}

// knex makes its own tables (knex_migrations, knex_migrations_lock and the lock's one row) before it
// takes its lock, a statement at a time: two releases at once on a database without them both
// create them, and one fails on a duplicate catalog row, or the lock table gets two rows, which no
// later release can lock. So they are made first in a transaction of their own, one release at a time.
const MIGRATION_TABLES_LOCK = 'taskbridge:migration-tables';

export async function migrateLatest(db: Knex): Promise<string[]> {
  await db.transaction(async (trx) => {
    await advisoryXactLock(trx, MIGRATION_TABLES_LOCK);
    await trx.migrate.list(migrationConfig);
  });
  const [, applied] = await db.migrate.latest(migrationConfig);
  return applied as string[];
}

// This release's migrations the database has not had (in order), and the ones it has had that this
// release does not know: a newer release's, while a deploy rolls or after the code was rolled back.
// Old code keeps working on a newer schema, so those are only reported.
// Read here, not through knex's migrate.list: that creates knex_migrations and its lock table, and
// the schema check of a web or worker process must not write to a database the release step never ran on.
export async function migrationState(db: Knex): Promise<{ unapplied: string[]; newer: string[] }> {
  const files = fs.readdirSync(migrationsDir).filter((f) => f.endsWith(MIGRATION_EXTENSION)).sort();
  const { rows: [{ table }] } = await db.raw(`select to_regclass('knex_migrations') is not null as table`);
  const applied: string[] = table ? (await db('knex_migrations').select('name')).map((r: { name: string }) => r.name) : [];
  const known = new Set(files);
  return { unapplied: files.filter((f) => !applied.includes(f)), newer: applied.filter((f) => !known.has(f)) };
}

// One statement straight through pg, on a connection of db's pool (or db's transaction), for the
// hot task statements: knex's query runner (binding rewrite, query events, wrappers) costs about
// half a millisecond a statement on an idle process, which task intake would add to start latency.
// `sql` numbers its parameters ($1, $2, ...). With `name`, the statement is prepared: Postgres
// parses it once per connection and can reuse its plan. Only for statements whose best plan does
// not depend on table sizes (task intake's inserts, one task's reads by its primary key): a plan
// cached while a table was small is kept until the table is next analysed, however large it grows. `name` must identify `sql` exactly: one name per statement shape.
export async function pgQuery<R = Record<string, unknown>>(db: Tx, sql: string, values: unknown[], name?: string): Promise<{ rows: R[] }> {
  const client = db.client as { acquireConnection(): Promise<pg.Client>; releaseConnection(c: pg.Client): Promise<void> };
  const connection = await client.acquireConnection();
  try {
    return await connection.query<R & pg.QueryResultRow>({ text: sql, values, ...(name ? { name } : {}) });
  } finally {
    await client.releaseConnection(connection);
  }
}

// `npm run migrate` / Procfile `release`: bring the schema up to date, then exit.
import { setTimeout as sleep } from 'node:timers/promises';
import { loadDatabaseConfigOrExit, warnOfLookalikeVariables } from '../domain/config.ts';
import { refuseArguments } from '../scripts/usage.ts';
import { createLogger, redactUrl } from '../domain/logger.ts';
import { connectionFailed, connectionRefused } from '../domain/errors.ts';
import { createDb, migrateLatest, migrationState } from './knex.ts';

// Tries at a lock held by a long transaction, a pause of MIGRATION_LOCK_TIMEOUT_MS apart: the API
// queues behind each wait, so it is never longer than that, and the release fails rather than
// waiting without end.
const LOCK_ATTEMPTS = 10;

// Postgres's lock_timeout; knex reports it as MigrationLocked when it hits its own lock table (another
// release migrating), with only the message kept.
const lockTimedOut = (err: unknown) => {
  const e = err as { code?: string; message?: string };
  return e.code === '55P03' || /lock timeout/.test(String(e.message));
};

refuseArguments(`Usage: npm run migrate   (Procfile: release)

Applies the pending schema migrations to the database DATABASE_URL names, all in one transaction,
then exits: 0 applied or nothing to do, 1 failed (the schema unchanged). Two at once take turns.
Environment: DATABASE_URL (required), MIGRATION_LOCK_TIMEOUT_MS (default 3000), LOG_LEVEL.
See README.md, Deploying.`);
const cfg = loadDatabaseConfigOrExit();
const log = createLogger(cfg.LOG_LEVEL, 'migrate');
warnOfLookalikeVariables(log);
const db = createDb(cfg.DATABASE_URL, { min: 0, max: 2 }, { log, lockTimeoutMs: cfg.MIGRATION_LOCK_TIMEOUT_MS });
try {
  for (let attempt = 1; ; attempt++) {
    try {
      const applied = await migrateLatest(db);
      log.info({ applied }, applied.length ? 'migrations applied' : 'schema up to date');
      const { newer } = await migrationState(db);
      if (newer.length) log.info({ newer }, 'the schema has migrations of a newer release, which this one runs on; they stay');
      break;
    } catch (err) {
      if (!lockTimedOut(err)) throw err;
      const waited = `waited ${cfg.MIGRATION_LOCK_TIMEOUT_MS} ms (MIGRATION_LOCK_TIMEOUT_MS) for a lock another transaction holds`;
      if (attempt === LOCK_ATTEMPTS) {
        log.fatal({ attempts: attempt }, `migration failed: ${waited}, ${attempt} times; the schema is unchanged. Find the long transactions in pg_stat_activity (xact_start) and run the release again`);
        process.exitCode = 1;
        break;
      }
      log.warn({ attempt }, `migration ${waited}; the schema is unchanged, trying again`);
      await sleep(cfg.MIGRATION_LOCK_TIMEOUT_MS);
    }
  }
} catch (err) {
  // Postgres out of reach, or refusing this login (a wrong password, no such database): one line
  // naming where (a release step's log is read by people). A migration that fails on its own SQL is
  // logged whole.
  const e = err as { message?: string; code?: string };
  const where = redactUrl(cfg.DATABASE_URL);
  if (connectionFailed(err)) log.fatal({ code: e.code, url: where }, `migration failed: Postgres at ${where} (DATABASE_URL) cannot be reached: ${e.message}`);
  else if (connectionRefused(err)) log.fatal({ code: e.code, url: where }, `migration failed: Postgres at ${where} (DATABASE_URL) refused the connection: ${e.message}`);
  else log.fatal({ err }, 'migration failed');
  process.exitCode = 1;
} finally {
  await db.destroy();
}

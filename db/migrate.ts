// `npm run migrate` / Procfile `release`: bring the schema up to date, then exit.
import { loadDatabaseConfigOrExit } from '../domain/config.ts';
import { createLogger, redactUrl } from '../domain/logger.ts';
import { unreachable } from '../domain/errors.ts';
import { createDb, migrateLatest } from './knex.ts';

const cfg = loadDatabaseConfigOrExit();
const log = createLogger(cfg.LOG_LEVEL, 'migrate');
const db = createDb(cfg.DATABASE_URL, { min: 0, max: 2 }, { log });
try {
  const applied = await migrateLatest(db);
  log.info({ applied }, applied.length ? 'migrations applied' : 'schema up to date');
} catch (err) {
  // Postgres out of reach: one line naming where (a release step's log is read by people). A
  // migration that fails on its own SQL is logged whole.
  const e = err as { message?: string; code?: string };
  const where = redactUrl(cfg.DATABASE_URL);
  if (unreachable(err) || /^E[A-Z]+$/.test(String(e.code))) log.fatal({ code: e.code, url: where }, `migration failed: Postgres at ${where} (DATABASE_URL) cannot be reached: ${e.message}`);
  else log.fatal({ err }, 'migration failed');
  process.exitCode = 1;
} finally {
  await db.destroy();
}

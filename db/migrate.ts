// `npm run migrate` / Procfile `release`: bring the schema up to date, then exit.
import { loadDatabaseConfigOrExit } from '../domain/config.ts';
import { createLogger, redactUrl } from '../domain/logger.ts';
import { createDb, migrateLatest } from './knex.ts';

const cfg = loadDatabaseConfigOrExit();
const log = createLogger(cfg.LOG_LEVEL, 'migrate');
const db = createDb(cfg.DATABASE_URL, { min: 0, max: 2 }, { log });
try {
  const applied = await migrateLatest(db);
  log.info({ applied }, applied.length ? 'migrations applied' : 'schema up to date');
} catch (err) {
  // One line saying what failed (a release step's log is read by people, not parsed), then exit 1.
  const e = err as { message?: string; code?: string };
  log.fatal({ code: e.code, url: redactUrl(cfg.DATABASE_URL) }, `migration failed on ${redactUrl(cfg.DATABASE_URL)} (DATABASE_URL): ${e.message}`);
  process.exitCode = 1;
} finally {
  await db.destroy();
}

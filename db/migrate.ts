// `npm run migrate` / Procfile `release`: bring the schema up to date, then exit.
import { loadDatabaseConfigOrExit } from '../domain/config.ts';
import { createLogger } from '../domain/logger.ts';
import { createDb, migrateLatest } from './knex.ts';

const cfg = loadDatabaseConfigOrExit();
const log = createLogger(cfg.LOG_LEVEL, 'migrate');
const db = createDb(cfg.DATABASE_URL, { min: 0, max: 2 });
try {
  const applied = await migrateLatest(db);
  log.info({ applied }, applied.length ? 'migrations applied' : 'schema up to date');
} finally {
  await db.destroy();
}

// A Postgres of a test's own (in TEST_DATA_DIR/<name>), migrated, which the test may stop and start
// again on the same port with the same data: outages a stack's processes must live through.
import path from 'node:path';
import { freePort, startPostgres, type LocalService } from '../../scripts/local-services.ts';
import { createDb, migrateLatest } from '../../db/knex.ts';
import { requireEnv } from './stack.ts';

export interface OwnPostgres { readonly url: string; stop(): Promise<void>; start(): Promise<void> }

export async function startOwnPostgres(name: string): Promise<OwnPostgres> {
  const dataDir = path.join(requireEnv('TEST_DATA_DIR'), name);
  const port = await freePort();
  let pg: LocalService | undefined;
  const own = {
    get url() {
      if (!pg) throw new Error(`the Postgres of ${name} is stopped`);
      return pg.url;
    },
    async start() {
      pg ??= await startPostgres({ dataDir, ephemeral: true, port });
    },
    async stop() {
      await pg?.stop();
      pg = undefined;
    },
  };
  await own.start();
  const db = createDb(own.url, { min: 0, max: 1 });
  try {
    await migrateLatest(db);
  } finally {
    await db.destroy();
  }
  return own;
}

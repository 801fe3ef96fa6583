// A database of its own on the test Postgres, for tests that migrate it to a version of their choice.
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { createDb } from '../../db/knex.ts';
import { testDb } from './stack.ts';

export interface ScratchDatabase { url: string; db: Knex; drop(): Promise<void> }

export async function scratchDatabase(prefix: string, poolMax = 2): Promise<ScratchDatabase> {
  const name = `taskbridge_${prefix}_${randomUUID().slice(0, 8)}`;
  await testDb().raw(`create database ${name}`);
  const url = new URL(process.env.DATABASE_URL!);
  url.pathname = `/${name}`;
  const db = createDb(url.toString(), { min: 0, max: poolMax });
  return {
    url: url.toString(),
    db,
    async drop() {
      await db.destroy();
      await testDb().raw(`drop database if exists ${name}`);
    },
  };
}

// Transaction-scoped advisory locks, named: held until the transaction ends, so a crash between
// taking and releasing one leaves nothing held. A name maps to Postgres's integer key by hashtext.
import type { Tx } from './knex.ts';

// Waits for the lock.
export async function advisoryXactLock(db: Tx, name: string): Promise<void> {
  await db.raw('select pg_advisory_xact_lock(hashtext(?))', [name]);
}

// Takes the lock if no other transaction holds it; whether it did.
export async function tryAdvisoryXactLock(db: Tx, name: string): Promise<boolean> {
  const { rows: [lock] } = await db.raw('select pg_try_advisory_xact_lock(hashtext(?)) as held', [name]);
  return lock.held;
}

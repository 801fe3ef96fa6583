import type { Knex } from 'knex';

// Reads of several statements that must see one state of the database (an instance and the
// credentials it names while brokering replaces them; a task and the timeline position it covers):
// one read-only repeatable-read transaction.
const SNAPSHOT: Knex.TransactionConfig = { isolationLevel: 'repeatable read', readOnly: true };

export const inSnapshot = <T>(db: Knex, read: (trx: Knex.Transaction) => Promise<T>): Promise<T> => db.transaction(read, SNAPSHOT);

export interface HeldSnapshot<T> {
  trx: Knex.Transaction;
  /** What was read first. */
  first: T;
  /** Ends the snapshot (rollback: it wrote nothing) and releases its connection; call it once no read is under way. */
  end(): Promise<void>;
}

// The same, for reads spread over a longer time than one call (the definition export and the generated
// client, read while their answer is written). It begins with the reads of `first`, so that a database
// out of reach fails before anything is answered; the caller ends it.
export async function holdSnapshot<T>(db: Knex, first: (trx: Knex.Transaction) => Promise<T>): Promise<HeldSnapshot<T>> {
  const trx = await db.transaction(SNAPSHOT);
  const end = async () => { if (!trx.isCompleted()) await trx.rollback(); };
  try {
    // knex hands over a transaction whose BEGIN failed (a statement timeout) as one already over: its
    // failure is the execution's, and the one to report (a database out of reach), not the next read's.
    if (trx.isCompleted()) await trx.executionPromise;
    return { trx, first: await first(trx), end };
  } catch (err) {
    await end().catch(() => undefined); // the first failure is the one to report
    throw err;
  }
}

import type { Knex } from 'knex';

// Reads of several statements that must see one state of the database (an instance and the
// credentials it names while brokering replaces them; a task and the timeline position it covers):
// one read-only repeatable-read transaction.
export const inSnapshot = <T>(db: Knex, read: (trx: Knex.Transaction) => Promise<T>): Promise<T> =>
  db.transaction(read, { isolationLevel: 'repeatable read', readOnly: true });

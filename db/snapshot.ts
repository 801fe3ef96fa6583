import type { Knex } from 'knex';

// Reads of several statements that must see one state of the database (an instance and the
// credentials it names while brokering replaces them; a task and the timeline position it covers):
// one read-only repeatable-read transaction.
const SNAPSHOT: Knex.TransactionConfig = { isolationLevel: 'repeatable read', readOnly: true };

export const inSnapshot = <T>(db: Knex, read: (trx: Knex.Transaction) => Promise<T>): Promise<T> => db.transaction(read, SNAPSHOT);

// The same, for reads spread over a longer time than one call (the definition export, read while its
// answer is written): the caller ends it (rollback: it wrote nothing), which releases its connection.
export const openSnapshot = (db: Knex): Promise<Knex.Transaction> => db.transaction(SNAPSHOT);

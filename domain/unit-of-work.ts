import type { Knex } from 'knex';
import type { JobsOptions } from 'bullmq';
import { addOutbox, type OutboxRow } from '../db/outbox.ts';
import { applyStatusChanges, type StatusChange, type StatusChangeResult } from '../db/tasks.ts';
import type { JobPayloads, QueueName } from '../queues/names.ts';
import type { Services } from './services.ts';

// A transaction plus what must happen only once it has committed: jobs handed to the outbox
// relay and wake-up notes published to other processes.
export interface UnitOfWork {
  trx: Knex.Transaction;
  enqueue<Q extends QueueName>(queue: Q, name: string, payload: JobPayloads[Q], options?: JobsOptions): Promise<string>;
  publish(channel: string, message: Record<string, unknown>): void;
  /** A job that job recovery can rebuild from this unit's rows: added after commit without an outbox row (queues/outbox-relay.ts send). */
  addRecoverable(row: OutboxRow): void;
  /** Applies a status change (db/tasks.ts applyStatusChanges) as part of this unit. */
  applyStatusChange(change: StatusChange): Promise<StatusChangeResult>;
}

export type UowServices = Pick<Services, 'db' | 'outbox' | 'bus' | 'log'>;

export async function inTransaction<T>(s: UowServices, fn: (uow: UnitOfWork) => Promise<T>): Promise<T> {
  let unit: Unit | undefined;
  const result = await s.db.transaction(async (trx) => {
    unit = openUnit(s, trx, async (change) => (await applyStatusChanges(trx, [change]))[0]);
    return fn(unit.uow);
  });
  unit!.committed();
  return result;
}

// For work that is ONE statement (atomic by itself): the same after-commit handling without the
// BEGIN/COMMIT round trips, and status changes share statements with concurrent ones
// (services.taskStatements). Hot paths of the agent runtime use it.
export async function inStatement<T>(s: UowServices & Pick<Services, 'taskStatements'>, fn: (uow: UnitOfWork) => Promise<T>): Promise<T> {
  const unit = openUnit(s, s.db, (change) => s.taskStatements.applyStatusChange.execute(change));
  const result = await fn(unit.uow);
  unit.committed();
  return result;
}

interface Unit { uow: UnitOfWork; committed(): void }

// A unit writing through `db` (a transaction, or the pool for one statement), collecting what is
// due once it has committed.
function openUnit(s: UowServices, db: Knex | Knex.Transaction, applyStatusChange: UnitOfWork['applyStatusChange']): Unit {
  const jobs: OutboxRow[] = [];
  const recoverable: OutboxRow[] = [];
  const notes: [string, Record<string, unknown>][] = [];
  const uow: UnitOfWork = {
    trx: db as Knex.Transaction,
    async enqueue(queue, name, payload, options) {
      const row = await addOutbox(db, queue, name, payload, options);
      jobs.push(row);
      return row.id;
    },
    publish(channel, message) { notes.push([channel, message]); },
    addRecoverable(row) { recoverable.push(row); },
    applyStatusChange,
  };
  return { uow, committed: () => afterCommit(s, jobs, notes, recoverable) };
}

export function afterCommit(s: UowServices, jobs: OutboxRow[], notes: [string, Record<string, unknown>][], recoverable: OutboxRow[] = []): void {
  if (jobs.length) s.outbox.kick(jobs);
  if (recoverable.length) s.outbox.send(recoverable);
  for (const [channel, message] of notes) {
    s.bus.publish(channel, message).catch((err) => s.log.debug({ err: { message: (err as Error).message }, channel }, 'event note not published'));
  }
}

// OAuth brokering states (migration 0007): created by the broker call, taken by the callback
// (put back, same id and expiry, when its code exchange got no answer).
import type { Tx } from './knex.ts';

export interface BrokerStateRow {
  id: string; state_hash: string; provider_instance_id: string; code_verifier: string;
  metadata: Record<string, unknown>; expires_at: Date; created_at: Date; updated_at: Date;
}

// Undefined when the instance is gone. Its row is locked as the state goes in: a delete of the
// instance that runs meanwhile waits and then takes the state with it, and one that ran first
// leaves no row to insert under (rather than a foreign key violation).
export async function insertBrokerState(db: Tx, row: Omit<BrokerStateRow, 'created_at' | 'updated_at'>): Promise<BrokerStateRow | undefined> {
  const res = await db.raw(
    `insert into broker_states (id, state_hash, provider_instance_id, code_verifier, metadata, expires_at)
     select ?, ?, p.id, ?, ?::jsonb, ? from provider_instances p where p.id = ? for key share
     returning *`,
    [row.id, row.state_hash, row.code_verifier, JSON.stringify(row.metadata), row.expires_at, row.provider_instance_id],
  );
  return res.rows[0] as BrokerStateRow | undefined;
}

// Removes and returns the state: a concurrent callback with it finds none.
export async function takeBrokerState(db: Tx, stateHash: string): Promise<BrokerStateRow | undefined> {
  const [out] = await db('broker_states').where({ state_hash: stateHash }).delete().returning('*');
  return out;
}

// Every state of the instance, in the transaction that stores a brokered credential (its own state
// is taken already): a flow begun before would otherwise still complete, replacing that credential
// with whichever account consented there.
export async function deleteBrokerStatesOf(db: Tx, providerInstanceId: string): Promise<number> {
  return db('broker_states').where({ provider_instance_id: providerInstanceId }).delete();
}

// States whose flows were abandoned long ago (kept a while so a late callback still learns it expired).
export async function deleteBrokerStatesExpiredBefore(db: Tx, before: Date): Promise<number> {
  return db('broker_states').where('expires_at', '<', before).delete();
}

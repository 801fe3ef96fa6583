// OAuth brokering states (migration 0007): created by the broker call, taken once by the callback.
import type { Tx } from './knex.ts';

export interface BrokerStateRow {
  id: string; state_hash: string; provider_instance_id: string; code_verifier: string;
  metadata: Record<string, unknown>; expires_at: Date; created_at: Date; updated_at: Date;
}

export async function insertBrokerState(db: Tx, row: Omit<BrokerStateRow, 'created_at' | 'updated_at'>): Promise<BrokerStateRow> {
  const [out] = await db('broker_states').insert({ ...row, metadata: JSON.stringify(row.metadata) }).returning('*');
  return out;
}

// Removes and returns the state: whatever the callback then finds, the state cannot be used again.
export async function takeBrokerState(db: Tx, stateHash: string): Promise<BrokerStateRow | undefined> {
  const [out] = await db('broker_states').where({ state_hash: stateHash }).delete().returning('*');
  return out;
}

// States whose flows were abandoned long ago (kept a while so a late callback still learns it expired).
export async function deleteBrokerStatesExpiredBefore(db: Tx, before: Date): Promise<number> {
  return db('broker_states').where('expires_at', '<', before).delete();
}

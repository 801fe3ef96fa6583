// OAuth brokering states (migration 0007): created by the broker call, taken by the callback
// (put back, same id and expiry, when its code exchange got no answer and no other flow of the
// instance completed meanwhile).
import type { Tx } from './knex.ts';

export interface BrokerStateRow {
  id: string; state_hash: string; provider_instance_id: string; code_verifier: string;
  metadata: Record<string, unknown>; expires_at: Date; created_at: Date; updated_at: Date;
}

// A taken state, with the user credential its instance had as it was taken: the callback's own
// snapshot, so a flow completing after the take changes it, and one completing before it had
// deleted the state (no state is taken). And the instance's created_at: ids are the client's, so an
// instance deleted during the code exchange and made again under its id is told apart by it.
export interface TakenBrokerState extends BrokerStateRow { instance_user_credential_id: string | null; instance_created_at: Date }

// Undefined when the instance is gone. Its row is locked as the state goes in: a delete of the
// instance that runs meanwhile waits and then takes the state with it, and one that ran first
// leaves no row to insert under (rather than a foreign key violation).
export async function insertBrokerState(db: Tx, row: Omit<BrokerStateRow, 'created_at' | 'updated_at'>): Promise<BrokerStateRow | undefined> {
  return insertUnder(db, row, '', []);
}

// The state back after a code exchange that got no answer: undefined also when the instance's user
// credential is no longer the one it had as the state was taken (another flow completed meanwhile),
// or the instance is another one made under its id. A completion storing one meanwhile holds the
// instance row: this waits, then reads the stored one.
export async function putBackBrokerState(db: Tx, row: TakenBrokerState): Promise<BrokerStateRow | undefined> {
  return insertUnder(db, row, 'and p.created_at = ? and p.user_credential_id is not distinct from ?', [row.instance_created_at, row.instance_user_credential_id]);
}

async function insertUnder(db: Tx, row: Omit<BrokerStateRow, 'created_at' | 'updated_at'>, condition: string, bindings: (Date | string | null)[]): Promise<BrokerStateRow | undefined> {
  const res = await db.raw(
    `insert into broker_states (id, state_hash, provider_instance_id, code_verifier, metadata, expires_at)
     select ?, ?, p.id, ?, ?::jsonb, ? from provider_instances p where p.id = ? ${condition} for key share
     returning *`,
    [row.id, row.state_hash, row.code_verifier, JSON.stringify(row.metadata), row.expires_at, row.provider_instance_id, ...bindings],
  );
  return res.rows[0] as BrokerStateRow | undefined;
}

// Removes and returns the state: a concurrent callback with it finds none.
export async function takeBrokerState(db: Tx, stateHash: string): Promise<TakenBrokerState | undefined> {
  const res = await db.raw(
    `delete from broker_states s using provider_instances p where s.state_hash = ? and p.id = s.provider_instance_id
     returning s.*, p.user_credential_id as instance_user_credential_id, p.created_at as instance_created_at`,
    [stateHash],
  );
  return res.rows[0] as TakenBrokerState | undefined;
}

// Every state of the instance, in the transaction that stores a brokered credential (its own state
// is taken already): a flow begun before would otherwise still complete, replacing that credential
// with whichever account consented there. One taken already, its code exchange under way, is
// refused by the user credential it took (TakenBrokerState).
export async function deleteBrokerStatesOf(db: Tx, providerInstanceId: string): Promise<number> {
  return db('broker_states').where({ provider_instance_id: providerInstanceId }).delete();
}

// States whose flows were abandoned long ago (kept a while so a late callback still learns it expired).
export async function deleteBrokerStatesExpiredBefore(db: Tx, before: Date): Promise<number> {
  return db('broker_states').where('expires_at', '<', before).delete();
}

// Provider instances: a provider controller configured with credentials (SPEC.md section 7).
import { randomUUID } from 'node:crypto';
import type { Knex } from 'knex';
import { Conflict, InvalidRequest, NotFound } from '../errors.ts';
import * as repo from '../../db/bridge.ts';
import type { CredentialKind, ProviderInstanceRow } from '../../db/bridge.ts';
import type { Tx } from '../../db/knex.ts';
import type {
  CreateProviderInstanceRequest, FunctionInstance, ProviderInstance, ProviderInstanceDetail, UpdateProviderInstanceRequest,
} from '../shapes/bridge.ts';
import { credentialDef, describedPage, describeStoredCredential, describeStoredProvider, providerDef, type DescribedInstance } from './catalog.ts';
import { toCredential } from './credentials.ts';
import type { CredentialControllerDef } from './types.ts';
import { inSnapshot } from '../../db/snapshot.ts';
import type { Logger } from '../logger.ts';

export function toProviderInstance(r: ProviderInstanceRow): ProviderInstance {
  const out: Record<string, unknown> = {
    id: r.id, display_name: r.display_name, provider_controller_type_id: r.provider_controller_type_id,
    credential_controller_type_id: r.credential_controller_type_id, status: r.status, disabled_by_admin: r.disabled_by_admin,
    created_at: r.created_at, updated_at: r.updated_at,
  };
  if (r.resource_server_credential_id) out.resource_server_credential_id = r.resource_server_credential_id;
  if (r.user_credential_id) out.user_credential_id = r.user_credential_id;
  if (r.return_on_successful_brokering) out.return_on_successful_brokering = r.return_on_successful_brokering;
  return out as unknown as ProviderInstance;
}

export function toFunctionInstance({ row: r, f }: DescribedInstance): FunctionInstance {
  return {
    function_controller_type_id: r.function_controller_type_id, provider_controller_type_id: r.provider_controller_type_id,
    provider_instance_id: r.provider_instance_id, controller: f, created_at: r.created_at, updated_at: r.updated_at,
  } as unknown as FunctionInstance;
}

// A resource server credential is needed unless the controller configures nothing.
const needsResourceServer = (cc: CredentialControllerDef) => Object.keys(cc.resourceServer.properties).length > 0;

// An instance is usable once it has every credential its controller needs.
function readyStatus(cc: CredentialControllerDef, row: Pick<ProviderInstanceRow, 'user_credential_id'>): 'active' | 'brokering_initiated' {
  return cc.requires_brokering && !row.user_credential_id ? 'brokering_initiated' : 'active';
}

async function checkCredential(db: Tx, id: string, kind: CredentialKind, providerTypeId: string, cc: CredentialControllerDef): Promise<void> {
  const field = kind === 'user' ? 'user_credential_id' : 'resource_server_credential_id';
  const row = kind === 'user' ? await repo.getUserCredentialForInstance(db, id) : await repo.getCredentialForShare(db, id);
  if (!row) throw new NotFound(kind === 'user' ? 'user_credential' : 'resource_server_credential', id);
  if (row.kind !== kind) {
    throw new InvalidRequest(`body.${field} is a ${row.kind === 'user' ? 'user' : 'resource server'} credential`, [{ path: `body.${field}`, message: `must be a ${kind === 'user' ? 'user' : 'resource server'} credential` }]);
  }
  if (row.provider_controller_type_id !== providerTypeId || row.type_id !== cc.type_id) {
    throw new InvalidRequest(`body.${field} is a credential of ${row.provider_controller_type_id}/${row.type_id}, not ${providerTypeId}/${cc.type_id}`,
      [{ path: `body.${field}`, message: 'belongs to another provider or credential controller' }]);
  }
}

// A refresh token works only with the OAuth client it was issued to, and a refresh of a user
// credential uses the resource server credential of an instance that has it: instances that share
// one must share that client too, or its refresh could be made with the wrong one.
async function checkSameClient(db: Tx, userCredentialId: string, resourceServerCredentialId: string | null): Promise<void> {
  const other = await repo.instanceOfUserCredentialWithOtherClient(db, userCredentialId, resourceServerCredentialId);
  if (!other) return;
  const theirs = other.resource_server_credential_id ? `resource server credential '${other.resource_server_credential_id}'` : 'no resource server credential';
  throw new Conflict(`User credential '${userCredentialId}' is used by provider instance '${other.id}' with ${theirs}: instances that share a user credential need the same resource server credential (its refresh uses that client)`,
    { resource: 'user_credential', id: userCredentialId, provider_instance_id: other.id });
}

export async function createProviderInstance(db: Knex, providerTypeId: string, credentialTypeId: string, input: CreateProviderInstanceRequest): Promise<ProviderInstance> {
  const cc = credentialDef(providerDef(providerTypeId), credentialTypeId);
  if (needsResourceServer(cc) && !input.resource_server_credential_id) {
    throw new InvalidRequest(`Credential controller '${cc.type_id}' needs resource_server_credential_id`, [{ path: 'body.resource_server_credential_id', message: 'is required' }]);
  }
  if (input.user_credential_id && !cc.userCredential) {
    throw new InvalidRequest(`Credential controller '${cc.type_id}' has no user credential`, [{ path: 'body.user_credential_id', message: 'is not allowed for this credential controller' }]);
  }
  const id = input.provider_instance_id ?? randomUUID();
  // GET /provider/grouped-by-function is routed to the list, so an instance of that id could not be read.
  if (id === 'grouped-by-function') throw new InvalidRequest(`provider_instance_id '${id}' is reserved`, [{ path: 'body.provider_instance_id', message: 'is reserved' }]);
  const row = await db.transaction(async (trx) => {
    if (input.resource_server_credential_id) await checkCredential(trx, input.resource_server_credential_id, 'resource_server', providerTypeId, cc);
    if (input.user_credential_id) {
      await checkCredential(trx, input.user_credential_id, 'user', providerTypeId, cc);
      await checkSameClient(trx, input.user_credential_id, input.resource_server_credential_id ?? null);
    }
    return repo.insertProviderInstance(trx, {
      id, display_name: input.display_name, provider_controller_type_id: providerTypeId, credential_controller_type_id: cc.type_id,
      status: readyStatus(cc, { user_credential_id: input.user_credential_id ?? null }),
      resource_server_credential_id: input.resource_server_credential_id ?? null, user_credential_id: input.user_credential_id ?? null,
      return_on_successful_brokering: input.return_on_successful_brokering ?? null,
    });
  });
  if (!row) throw new Conflict(`A provider instance with id '${id}' already exists`, { resource: 'provider_instance', id });
  return toProviderInstance(row);
}

export const credentialIds = (rows: ProviderInstanceRow[]) =>
  rows.flatMap((r) => [r.resource_server_credential_id, r.user_credential_id]).filter((c): c is string => c !== null);

// Reads the credentials of these instances in one query; the function it returns adds an
// instance's credentials (encrypted members only) to a response object.
export async function credentialAttacher(db: Tx, rows: ProviderInstanceRow[]): Promise<(target: Record<string, unknown>, row: ProviderInstanceRow) => Record<string, unknown>> {
  const byId = new Map((await repo.getCredentials(db, credentialIds(rows))).map((c) => [c.id, toCredential(c)]));
  return (target, row) => {
    const rs = row.resource_server_credential_id && byId.get(row.resource_server_credential_id);
    const user = row.user_credential_id && byId.get(row.user_credential_id);
    if (rs) target.resource_server_credential = rs;
    if (user) target.user_credential = user;
    return target;
  };
}

// Instances with their controllers, enabled functions and credentials. An instance whose provider or
// credential controller the catalog no longer has is shown with a stand-in for it; a function it
// no longer has is left out (logged, for the answer `what`).
async function withDetails(db: Tx, rows: ProviderInstanceRow[], log: Logger, what: string): Promise<ProviderInstanceDetail[]> {
  const [functions, attach] = await Promise.all([repo.functionInstancesOf(db, rows.map((r) => r.id)), credentialAttacher(db, rows)]);
  const described = describedPage(functions, log, what);
  return rows.map((r) => attach({
    ...toProviderInstance(r),
    controller: describeStoredProvider(r.provider_controller_type_id),
    credential_controller: describeStoredCredential(r.provider_controller_type_id, r.credential_controller_type_id),
    functions: described.filter((f) => f.row.provider_instance_id === r.id).map(toFunctionInstance),
  }, r) as unknown as ProviderInstanceDetail);
}

export async function listProviderInstances(
  db: Knex, log: Logger, filter: { status?: string; provider_controller_type_id?: string }, pageSize: number, token?: string,
): Promise<{ items: ProviderInstanceDetail[]; next_page_token?: string }> {
  // One snapshot: brokering again replaces the user credential and deletes the old one, so an
  // instance read before could name a credential gone by the next statement.
  return inSnapshot(db, async (trx) => {
    const page = await repo.listProviderInstances(trx, filter, pageSize, token);
    return { ...page, items: await withDetails(trx, page.items, log, 'provider instances list') };
  });
}

export async function getProviderInstance(db: Knex, log: Logger, id: string): Promise<ProviderInstanceDetail> {
  return inSnapshot(db, async (trx) => {
    const row = await repo.getProviderInstance(trx, id);
    if (!row) throw new NotFound('provider_instance', id);
    return (await withDetails(trx, [row], log, `provider instance '${id}'`))[0];
  });
}

// Status moves by PATCH only between usable states: an instance that still needs brokering, or
// whose refresh gave up, becomes active through brokering, not by being told so. An admin's disable
// is kept beside the status (disabled_by_admin): one of a refresh_failed instance is taken, and
// brokering it again makes it disabled.
export async function updateProviderInstance(db: Knex, id: string, input: UpdateProviderInstanceRequest): Promise<ProviderInstance> {
  const row = await db.transaction(async (trx) => {
    const current = await repo.getProviderInstance(trx, id, 'update');
    if (!current) throw new NotFound('provider_instance', id);
    // refresh_failed ends only by brokering again, not by PATCH.
    if (input.status === 'active' && current.status === 'refresh_failed') {
      throw new Conflict(`Provider instance '${id}' is refresh_failed: broker its user credential again`, { resource: 'provider_instance', id, status: current.status });
    }
    const patch: Partial<Pick<ProviderInstanceRow, 'display_name' | 'status' | 'disabled_by_admin'>> = {};
    if (input.display_name !== undefined) patch.display_name = input.display_name;
    if (input.status === 'disabled') {
      patch.disabled_by_admin = true;
      if (current.status !== 'refresh_failed') patch.status = 'disabled';
    }
    if (input.status === 'active' && current.status !== 'active') {
      const cc = credentialDef(providerDef(current.provider_controller_type_id), current.credential_controller_type_id);
      const ready = readyStatus(cc, current);
      if (ready !== 'active') {
        throw new Conflict(`Provider instance '${id}' is ${current.status} and needs its user credential brokered before it can be active`, { resource: 'provider_instance', id, status: current.status });
      }
      patch.status = 'active';
    }
    if (input.status === 'active') patch.disabled_by_admin = false;
    // Only what differs is written: a PATCH that changes nothing ({}, or members as they are)
    // leaves the row, and its updated_at, which clients poll for changes, as it was.
    const changes = Object.fromEntries(Object.entries(patch).filter(([k, v]) => current[k as keyof typeof patch] !== v));
    return Object.keys(changes).length ? repo.updateProviderInstance(trx, id, changes) : current;
  });
  return toProviderInstance(row!);
}

// Removes the instance, its function instances (cascade) and the credentials nothing else uses.
export async function deleteProviderInstance(db: Knex, id: string): Promise<void> {
  await db.transaction(async (trx) => {
    const row = await repo.deleteProviderInstance(trx, id);
    if (!row) throw new NotFound('provider_instance', id);
    await repo.deleteOrphanCredentials(trx, credentialIds([row]));
  });
}

// Function instances: a provider function enabled on a provider instance, and invoking it.
import type { Knex } from 'knex';
import { Type, type TObject } from '@sinclair/typebox';
import { Conflict, InvalidRequest, NotFound } from '../errors.ts';
import type { Services } from '../services.ts';
import { PAGE_MAX_BYTES, pageTokens } from '../../db/pagination.ts';
import * as repo from '../../db/bridge.ts';
import type { FunctionInstance, InvokeResult } from '../shapes/bridge.ts';
import { PROVIDERS, checkAgainst, credentialDef, describedPage, describeFunction, describeProvider, functionDef, providerDef } from './catalog.ts';
import { unsealCredential } from './credentials.ts';
import { credentialAttacher, credentialIds, toFunctionInstance, toProviderInstance } from './provider-instances.ts';
import { inSnapshot } from '../../db/snapshot.ts';
import type { Logger } from '../logger.ts';
import type { FunctionControllerDef } from './types.ts';

type InvokeServices = Pick<Services, 'db' | 'cfg' | 'log'>;

export async function enableFunction(db: Knex, providerInstanceId: string, functionTypeId: string): Promise<FunctionInstance> {
  const { row, f } = await db.transaction(async (trx) => {
    // FOR SHARE: the instance cannot be deleted between the check and the insert.
    const instance = await repo.getProviderInstance(trx, providerInstanceId, 'share');
    if (!instance) throw new NotFound('provider_instance', providerInstanceId);
    const def = functionDef(providerDef(instance.provider_controller_type_id), functionTypeId);
    return { f: def, row: await repo.insertFunctionInstance(trx, { provider_instance_id: providerInstanceId, function_controller_type_id: def.type_id, provider_controller_type_id: instance.provider_controller_type_id }) };
  });
  if (!row) throw new Conflict(`Function '${functionTypeId}' is already enabled on provider instance '${providerInstanceId}'`, { resource: 'function_instance', id: functionTypeId });
  return toFunctionInstance({ row, f: describeFunction(f) });
}

export async function disableFunction(db: Knex, providerInstanceId: string, functionTypeId: string): Promise<void> {
  if (!(await repo.getProviderInstance(db, providerInstanceId))) throw new NotFound('provider_instance', providerInstanceId);
  if (!(await repo.deleteFunctionInstance(db, providerInstanceId, functionTypeId))) {
    throw new NotFound('function_instance', functionTypeId, `on provider instance '${providerInstanceId}'`);
  }
}

// A function the catalog no longer has is left out (logged); the page's token is that of the rows read.
export async function listFunctionInstances(
  db: Knex, log: Logger, filter: { provider_instance_id?: string }, pageSize: number, token?: string,
): Promise<{ items: FunctionInstance[]; next_page_token?: string }> {
  const page = await repo.listFunctionInstances(db, filter, pageSize, token);
  return { ...page, items: describedPage(page.items, log, 'function instances list').map(toFunctionInstance) };
}

// What a client refused for an instance's status is told to do about it (a host's model too, through MCP).
const WHAT_ACTIVATES: Record<Exclude<repo.ProviderInstanceRow['status'], 'active'>, string> = {
  brokering_initiated: 'broker its user credential first',
  refresh_failed: 'its credential refresh gave up; broker its user credential again',
  disabled: 'an admin disabled it (PATCH status active enables it)',
};

// The idempotency key of an agent run's nth bridge call when the agent gives none: the same on every
// try of the run (a retry, a takeover after its worker died), so a provider that honours keys
// (Stripe) answers the repeat with the first call's answer; another for the task's next message.
// Ids, not the client's messageId (up to 256 characters), keep it within the key's 255.
export const agentCallKey = (taskId: string, messageId: string, ordinal: number) => `taskbridge-run:${taskId}:${messageId}:${ordinal}`;

// Params are checked first (400), then that the function is enabled (404) and the instance
// usable (409). A provider's refusal is an `error` result; an unreachable provider a 502.
// `paramsPath` names the params in errors: where the caller sent them; `signal` abandons the call
// to the provider (an agent run canceled); `log` is the caller's (an agent run's names its task).
export async function invokeFunction(
  s: InvokeServices, providerInstanceId: string, functionTypeId: string, params: Record<string, unknown>,
  { paramsPath = 'body.params', signal, log = s.log, idempotencyKey }: { paramsPath?: string; signal?: AbortSignal; log?: Services['log']; idempotencyKey?: string } = {},
): Promise<InvokeResult> {
  // One snapshot: brokering again replaces the user credential and deletes the old one, so an
  // instance read before could name a credential gone by the next statement.
  const { instance, creds } = await inSnapshot(s.db, async (trx) => {
    const row = await repo.getProviderInstance(trx, providerInstanceId);
    if (!row) throw new NotFound('provider_instance', providerInstanceId);
    return { instance: row, creds: await repo.getCredentials(trx, credentialIds([row])) };
  });
  const provider = providerDef(instance.provider_controller_type_id);
  const f = functionDef(provider, functionTypeId);
  checkAgainst(f.parameters, params, paramsPath);
  if (!(await repo.getFunctionInstance(s.db, providerInstanceId, functionTypeId))) {
    throw new NotFound('function_instance', functionTypeId, `on provider instance '${providerInstanceId}'`);
  }
  if (instance.status !== 'active') {
    throw new Conflict(`Provider instance '${providerInstanceId}' is ${instance.status}, not active: ${WHAT_ACTIVATES[instance.status]}`, { resource: 'provider_instance', id: providerInstanceId, status: instance.status });
  }
  const cc = credentialDef(provider, instance.credential_controller_type_id);
  const plain = async (id: string | null) => {
    if (id === null) return undefined;
    return unsealCredential(s, cc, creds.find((c) => c.id === id)!);
  };
  // One limit for the whole call: a token exchange (service account) and the provider call share it.
  const deadline = Date.now() + s.cfg.BRIDGE_TIMEOUT_MS;
  const opts = { timeoutMs: s.cfg.BRIDGE_TIMEOUT_MS, deadline, allowPrivate: s.cfg.BRIDGE_ALLOW_PRIVATE, signal };
  const authorization = await cc.authorization(await plain(instance.resource_server_credential_id), await plain(instance.user_credential_id), opts);
  const logged = { provider_instance_id: providerInstanceId, function: functionTypeId };
  const answer = await f.invoke({ params, authorization, apiBase: s.cfg[provider.apiBaseSetting].replace(/\/+$/, ''), timeoutMs: opts.timeoutMs, deadline, signal, idempotencyKey });
  const result = declaredOutput(f, answer, log, logged);
  log.info({ ...logged, result: result.type }, 'bridge function invoked');
  return result;
}

// A success is what the function declares it answers: its output's members only (a provider's
// answer may carry any others, up to 1 MiB, which MCP would then send twice), each checked against
// the output schema. One that does not fit is left out and named in a warning (never its value), and
// the rest answered: the provider acted (a refund went through), and a 502 would tell the caller it
// failed, as would a retry with the same idempotency key, answered the same.
function declaredOutput(f: FunctionControllerDef, result: InvokeResult, log: Logger, logged: Record<string, unknown>): InvokeResult {
  if (result.type !== 'success') return result;
  const members = memberSchemas(f.output);
  const output: Record<string, unknown> = {};
  const leftOut: string[] = [];
  for (const [k, schema] of members) {
    if (result[k] === undefined) continue;
    try {
      checkAgainst(schema, { [k]: result[k] }, 'answer');
      output[k] = result[k];
    } catch (err) {
      if (!(err instanceof InvalidRequest)) throw err;
      leftOut.push(k);
    }
  }
  const missing = (f.output.required ?? []).filter((k) => output[k] === undefined && !leftOut.includes(k));
  if (leftOut.length || missing.length) {
    log.warn({ ...logged, unfit_members: leftOut, missing_members: missing }, "bridge function answered a success that does not fit its output: answered without those members");
  }
  return { type: 'success', ...output };
}

// Each member of an output schema as an object schema of its own (compiled once, by checkAgainst).
const memberSchemaCache = new WeakMap<TObject, [string, TObject][]>();
function memberSchemas(output: TObject): [string, TObject][] {
  let members = memberSchemaCache.get(output);
  if (!members) {
    members = Object.entries(output.properties).map(([k, schema]) => [k, Type.Object({ [k]: schema })]);
    memberSchemaCache.set(output, members);
  }
  return members;
}

// The instances a page of the grouped list shows at most, over all its items: page_size counts
// functions, and one function may have any number of instances.
const GROUPED_INSTANCES_MAX = 1000;

// One item per function of the catalog (ordered by provider, then function), with the instances
// that enabled it, newest first. A page ends after page_size functions, or once its instances reach
// GROUPED_INSTANCES_MAX or PAGE_MAX_BYTES (credentials counted wherever they are shown): a function
// cut there goes on in the first item of the next page. The token is the last function's key, and
// the last instance's position when its function was cut.
export async function listGroupedByFunction(
  db: Knex, filter: { provider_controller_type_id?: string; function_category?: string }, pageSize: number, token?: string,
) {
  const groups = PROVIDERS.flatMap((p) => p.functions.map((f) => ({ p, f, key: `${p.type_id}/${f.type_id}` })))
    .filter(({ p, f }) => (!filter.provider_controller_type_id || p.type_id === filter.provider_controller_type_id)
      && (!filter.function_category || f.categories.includes(filter.function_category)))
    .sort((a, b) => (a.key < b.key ? -1 : 1));
  const tokens = pageTokens(['functions', filter.provider_controller_type_id, filter.function_category], [['text'], ['text', 'timestamp', 'text']]);
  const at = token === undefined ? undefined : (tokens.decode(token) as string[]);
  const first = at === undefined ? 0 : groups.findIndex(({ key }) => (at.length === 1 ? key > at[0] : key >= at[0]));
  const within = at?.length === 3 ? { key: at[0], after: { created_at: at[1], id: at[2] } } : undefined;
  // One snapshot, as listProviderInstances reads.
  return inSnapshot(db, async (trx) => {
    const items = [];
    let bytes = 0;
    let left = GROUPED_INSTANCES_MAX;
    for (let i = first < 0 ? groups.length : first; i < groups.length; i++) {
      const { p, f, key } = groups[i];
      if (items.length === pageSize || left === 0 || bytes >= PAGE_MAX_BYTES) return { items, next_page_token: tokens.encode([groups[i - 1].key]) };
      const after = within?.key === key ? within.after : undefined;
      const read = await repo.instancesWithFunction(trx, p.type_id, f.type_id, after, { limit: left + 1, maxBytes: PAGE_MAX_BYTES - bytes });
      const instances = read.rows.slice(0, left);
      const attach = await credentialAttacher(trx, instances);
      items.push({
        function_controller: describeFunction(f),
        provider_controller: describeProvider(p),
        provider_instances: instances.map((r) => attach({ provider_instance: toProviderInstance(r) }, r)),
      });
      if (read.cut || read.rows.length > left) {
        const last = instances[instances.length - 1];
        return { items, next_page_token: tokens.encode([key, last.created_at, last.id]) };
      }
      bytes += read.bytes;
      left -= instances.length;
    }
    return { items };
  });
}

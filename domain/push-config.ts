// A2A push notification configs of a task, stored in Postgres. The token and the authentication
// credentials are kept for delivery only: encrypted with the DEK aliased "default" and never
// returned.
import type { Knex } from 'knex';
import type { Tx } from '../db/knex.ts';
import * as repo from '../db/push-configs.ts';
import * as tasks from '../db/tasks.ts';
import type { Config } from './config.ts';
import { InvalidRequest, NotFound } from './errors.ts';
import { assertOutboundUrl } from './webhook-url.ts';
import { decryptWithDek, encryptWithDek, holdAliasDek } from './keyring.ts';
import { DEFAULT_ALIAS } from './crypto/key-management.ts';
import type { UnitOfWork } from './unit-of-work.ts';
import { isInterrupted, isTerminal, type TaskState } from './task-states.ts';

// The alias whose DEK seals every config's secrets.
export const PUSH_ALIAS = DEFAULT_ALIAS;

export interface PushConfigInput {
  id?: string;
  url: string;
  token?: string;
  authentication?: { schemes: string[]; credentials?: string };
}

/** A stored config as it may be shown: no token, no credentials. */
export interface PushConfig {
  id: string;
  task_id: string;
  url: string;
  authentication?: { schemes: string[] };
  created_at: Date;
  updated_at: Date;
}

// Each status update of a task is written to the outbox once per config, inside the statement that
// stores it (shared with other tasks' changes), and posted once per config: a bound keeps both small.
export const MAX_CONFIGS_PER_TASK = 100;
const MAX_ID = 256;
const MAX_URL = 2048;
const MAX_TOKEN = 4096;
// Only the first scheme is used (in the Authorization header), yet get, list and every delivery run
// read them all: unbounded, 1 MiB requests set 100 configs of 15,000 schemes, listed as 100 MB.
const MAX_SCHEMES = 32;
// Empty is none (A2A has both optional strings; clients fill them with "" where they have none).
// No space at either end: HTTP drops those from a header's value, and the receiver, comparing the
// token it was given, would be sent another.
const HEADER_SAFE = /^(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?$/;

const shown = (r: repo.PushConfigRow): PushConfig => ({
  id: r.id,
  task_id: r.task_id,
  url: r.url,
  ...(r.authentication ? { authentication: { schemes: r.authentication.schemes } } : {}),
  created_at: r.created_at,
  updated_at: r.updated_at,
});

function checkInput(input: PushConfigInput): void {
  // Characters as the request schema counts them (code points): 200 emoji pass it, and are 400 UTF-16 units.
  if (input.id !== undefined && (typeof input.id !== 'string' || input.id.length < 1 || [...input.id].length > MAX_ID)) {
    throw new InvalidRequest(`Push notification config id must be a string of 1 to ${MAX_ID} characters`);
  }
  if (typeof input.url !== 'string' || input.url.length > MAX_URL) throw new InvalidRequest(`Push notification URL must be a string of at most ${MAX_URL} characters`);
  if (input.token !== undefined && (typeof input.token !== 'string' || input.token.length > MAX_TOKEN || !HEADER_SAFE.test(input.token))) {
    throw new InvalidRequest(`Push notification token must be at most ${MAX_TOKEN} printable ASCII characters, with no space at either end (it is sent as a header)`);
  }
  const auth = input.authentication;
  if (auth !== undefined) {
    const schemesOk = Array.isArray(auth?.schemes) && auth.schemes.length > 0 && auth.schemes.length <= MAX_SCHEMES && auth.schemes.every((s) => typeof s === 'string' && /^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/.test(s));
    if (!schemesOk) throw new InvalidRequest(`Push notification authentication.schemes must be a list of 1 to ${MAX_SCHEMES} HTTP auth scheme names`);
    if (auth.credentials !== undefined && (typeof auth.credentials !== 'string' || auth.credentials.length > MAX_TOKEN || !HEADER_SAFE.test(auth.credentials))) {
      throw new InvalidRequest('Push notification authentication.credentials must be printable ASCII characters, with no space at either end (they are sent as a header)');
    }
  }
}

async function requireTask(db: Tx, taskId: string, lock: boolean): Promise<tasks.TaskRow> {
  const task = await tasks.getTask(db, taskId, lock);
  if (!task) throw new NotFound('task', taskId);
  return task;
}

const inTrx = <T>(db: Tx, fn: (trx: Knex.Transaction) => Promise<T>): Promise<T> =>
  (db as Knex.Transaction).isTransaction ? fn(db as Knex.Transaction) : (db as Knex).transaction(fn);

// Creates a config (or replaces the one with the same id). The task row is locked so the new
// config's starting point is consistent with concurrent status changes. A new config gets the
// updates from then on; on a task that has ended or waits for input, whose next update may never
// come, its current status first: a client that set one just after its task got there (a
// non-blocking send answered while the agent ran) hears of it.
export async function setPushConfig(db: Tx, taskId: string, input: PushConfigInput, cfg: Config): Promise<PushConfig> {
  // An unknown task is the answer before the URL's host is looked up (the SDK's server checks the task first).
  await requireTask(db, taskId, false);
  await checkPushConfig(input, cfg);
  return writePushConfig(db, taskId, input, cfg, 'current status if settled');
}

// A config checkPushConfig passed that comes with a task's creation, in the same transaction: the
// task's first updates were written before the config existed, so it starts at the task's beginning
// and their delivery (through `throughSeq`) is enqueued here; the fan-out trigger takes the later ones.
export async function storeCheckedPushConfigOfNewTask(uow: UnitOfWork, taskId: string, input: PushConfigInput, cfg: Config, throughSeq: number): Promise<PushConfig> {
  const config = await writePushConfig(uow.trx, taskId, input, cfg, 'beginning');
  await uow.enqueue('push-notifications', 'deliver', { task_id: taskId, config_id: config.id, timeline_seq: throughSeq });
  return config;
}

// A config's fields and its URL's host, checked before anything is stored. A message that brings a
// config (A2A) checks it before it locks its task: a host lookup can take seconds, and a task's row
// locked meanwhile would hold up every batched status change that includes the task.
export async function checkPushConfig(input: PushConfigInput, cfg: Config): Promise<void> {
  checkInput(input);
  await assertOutboundUrl(input.url, cfg.PUSH_ALLOW_PRIVATE);
}

// Stores a config checkPushConfig passed, for a task this transaction has locked.
// Its message brings the task's next update.
export async function storeCheckedPushConfig(trx: Knex.Transaction, taskId: string, input: PushConfigInput, cfg: Config): Promise<PushConfig> {
  return writePushConfig(trx, taskId, input, cfg, 'now');
}

type Start = Exclude<repo.DeliveryStart, 'current status'> | 'current status if settled';
// A task that has ended or waits for input may never have another update: a config set then starts at its current status.
const deliveryStart = (start: Start, status: TaskState): repo.DeliveryStart =>
  (start !== 'current status if settled' ? start : isTerminal(status) || isInterrupted(status) ? 'current status' : 'now');

async function writePushConfig(db: Tx, taskId: string, input: PushConfigInput, cfg: Config, start: Start): Promise<PushConfig> {
  const secrets: PushSecrets = {
    ...(input.token ? { token: input.token } : {}),
    ...(input.authentication?.credentials ? { credentials: input.authentication.credentials } : {}),
  };
  // Without an id a config is the task's own (the SDK's server does the same): setting it again replaces it.
  const id = input.id ?? taskId;
  return inTrx(db, async (trx) => {
    const task = await requireTask(trx, taskId, true);
    // Counted under the task's lock, so concurrent sets cannot pass the bound together. A task being
    // created has none yet: A2A intake with an inline config skips the count.
    if (start !== 'beginning' && await repo.countOtherPushConfigs(trx, taskId, id) >= MAX_CONFIGS_PER_TASK) {
      throw new InvalidRequest(`A task has at most ${MAX_CONFIGS_PER_TASK} push notification configs: delete one, or set one of its ids again to replace it`);
    }
    // The alias is held to commit, so a rotation of it re-encrypts this config too (domain/alias-rotation.ts).
    const dekId = Object.keys(secrets).length ? await holdAliasDek(trx, PUSH_ALIAS) : null;
    const { row, created } = await repo.upsertPushConfig(trx, {
      task_id: taskId,
      id,
      url: input.url,
      authentication: input.authentication ? { schemes: input.authentication.schemes } : null,
      encrypted_secrets: dekId ? await encryptWithDek({ db: trx, cfg }, dekId, JSON.stringify(secrets), trx) : null,
      secrets_dek_id: dekId,
    }, deliveryStart(start, task.status));
    // A new config's current status, on a task that may not change again: no status change will
    // enqueue its delivery. A config set again keeps its position, and its pending update's job may
    // wait out the old URL's backoff or Retry-After (an hour, at most): the hold is lifted, and a
    // delivery starts now, so the mended URL hears at once (a run posting to the old one goes on).
    if ((!created || start === 'current status if settled') && Number(row.delivered_seq) < Number(row.status_seq)) {
      await repo.enqueueDelivery(trx, taskId, row.id, Number(row.status_seq));
    }
    return shown(row);
  });
}

export interface PushSecrets { token?: string; credentials?: string }

// For delivery only: the config's token and credentials in clear.
export async function pushSecrets(s: { db: Knex; cfg: Config }, row: repo.PushConfigRow): Promise<PushSecrets> {
  if (!row.encrypted_secrets || !row.secrets_dek_id) return {};
  return JSON.parse(await decryptWithDek(s, row.secrets_dek_id, row.encrypted_secrets)) as PushSecrets;
}

/** One config of a task: the named one; without an id, the task's own (set without an id, as the SDK's server reads it), else the first one set. */
export async function getPushConfig(db: Tx, taskId: string, configId?: string): Promise<PushConfig> {
  await requireTask(db, taskId, false);
  const row = await repo.getPushConfig(db, taskId, configId);
  if (row) return shown(row);
  if (configId) throw new NotFound('push_notification_config', configId);
  // Asked for whichever config the task has: there is no config id to name, only the task.
  throw new NotFound('push_notification_config', { message: `task '${taskId}' has no push notification config`, data: { task_id: taskId } });
}

export async function listPushConfigs(db: Tx, taskId: string): Promise<PushConfig[]> {
  await requireTask(db, taskId, false);
  return (await repo.listPushConfigs(db, taskId)).map(shown);
}

export async function deletePushConfig(db: Tx, taskId: string, configId: string): Promise<void> {
  await requireTask(db, taskId, false);
  if (!(await repo.deletePushConfig(db, taskId, configId))) throw new NotFound('push_notification_config', configId);
}

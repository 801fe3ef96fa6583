// Push notification delivery. Every status update of a task with push configs gets one delivery
// job per config, written to the outbox by the statement that stores the update (the trigger in
// db/migrations/0004_push_notifications.ts). A delivery run POSTs every not-yet-delivered status
// update of its config in timeline order, so a webhook sees the task's states in the order they
// happened; a failed update holds back later ones until it succeeds or is given up. An answer
// that retrying cannot change (most 4xx) gives the update up at once.
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Task as A2ATask } from '@a2a-js/sdk';
import type { Knex } from 'knex';
import * as repo from '../db/push-configs.ts';
import * as tasks from '../db/tasks.ts';
import type { TimelineRow } from '../db/timeline.ts';
import type { Message } from '../api/schemas/task.ts';
import type { Config } from './config.ts';
import type { Logger } from './logger.ts';
import { artifactsFromTimeline, toA2ATask } from './a2a/mapping.ts';
import { guardedLookup, isPrivateAddress } from './webhook-url.ts';
import { pushSecrets } from './push-config.ts';

const HISTORY_IN_NOTIFICATION = 100;
// A run holds its config's lease while it posts, so it is kept short: after this many updates, or
// once this much time has passed, it hands over to a fresh run. The lease lasts one post (bounded
// by PUSH_TIMEOUT_MS) and the reads around it, and is extended with each update recorded.
const ITEMS_PER_RUN = 20;
const RUN_BUDGET_MS = 15_000;
const LEASE_MARGIN_MS = 10_000;

// The task as it stood right after one status update.
export async function notificationBody(db: Knex | Knex.Transaction, task: tasks.TaskRow, item: TimelineRow): Promise<A2ATask> {
  const status = item.event_payload as { type: 'task-status-update'; status: tasks.TaskRow['status']; status_message_id?: string };
  const { messages, artifacts } = await repo.timelineAt(db, task.id, item.seq, HISTORY_IN_NOTIFICATION);
  const history = messages.map((m) => (m.event_payload as { message: Message }).message);
  const at: tasks.TaskRow = { ...task, status: status.status, status_message_id: status.status_message_id ?? null, status_timestamp: new Date(item.created_at) };
  return toA2ATask(at, { messages: history, artifacts: artifactsFromTimeline(artifacts) });
}

export class DeliveryError extends Error {
  constructor(message: string, readonly status?: number) {
    super(message);
  }
}

// A 4xx says the request itself is refused (gone, unauthorized, too large): sending it again gets the
// same answer, so it is not retried. Timeouts (408), too early (425) and rate limits (429) pass.
export const isPermanentRefusal = (status: number | undefined) => status !== undefined && status >= 400 && status < 500 && ![408, 425, 429].includes(status);

// One POST of a notification. Internal targets are refused at connect time (see webhook-url.ts).
export function postNotification(
  url: string,
  body: unknown,
  headers: Record<string, string>,
  opts: { allowPrivate: boolean; timeoutMs: number },
): Promise<number> {
  const target = new URL(url);
  const host = target.hostname.replace(/^\[(.*)\]$/, '$1');
  if (!opts.allowPrivate && net.isIP(host) && isPrivateAddress(host)) {
    return Promise.reject(new DeliveryError(`webhook address ${host} is internal and PUSH_ALLOW_PRIVATE is off`));
  }
  const payload = Buffer.from(JSON.stringify(body));
  const send = target.protocol === 'https:' ? https.request : http.request;
  return new Promise((resolve, reject) => {
    const req = send(target, {
      method: 'POST',
      lookup: guardedLookup(opts.allowPrivate) as never,
      timeout: opts.timeoutMs,
      headers: { 'content-type': 'application/json', 'content-length': String(payload.length), 'user-agent': 'taskbridge-push/1', ...headers },
    }, (res) => {
      // Only the status matters; the body is not read, so a webhook cannot hold the run with it.
      const code = res.statusCode ?? 0;
      res.destroy();
      if (code >= 200 && code < 300) resolve(code);
      else reject(new DeliveryError(`webhook answered HTTP ${code}`, code));
    });
    // The socket timeout fires only after that long idle; this bounds the whole post, however the
    // webhook trickles its answer.
    const deadline = setTimeout(() => req.destroy(new Error(`no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    req.on('timeout', () => req.destroy(new Error(`no answer within ${opts.timeoutMs} ms`)));
    req.on('error', (err) => reject(new DeliveryError(`webhook unreachable: ${err.message}`)));
    req.on('close', () => clearTimeout(deadline));
    req.end(payload);
  });
}

async function authHeaders(deps: DeliveryDeps, config: repo.PushConfigRow): Promise<Record<string, string>> {
  const { token, credentials } = await pushSecrets(deps, config);
  const headers: Record<string, string> = {};
  if (token) headers['x-a2a-notification-token'] = token;
  if (credentials && config.authentication) headers.authorization = `${config.authentication.schemes[0]} ${credentials}`;
  return headers;
}

export interface DeliveryJob { task_id: string; config_id: string; timeline_seq: number }
export type DeliveryOutcome = 'delivered' | 'nothing to deliver' | 'config gone' | 'busy' | 'more';

interface DeliveryDeps { db: Knex; cfg: Config; log: Logger }

/**
 * Delivers the pending status updates of one config, oldest first, under a lease so runs for the
 * same config never overlap ('busy': another run holds it; try again shortly). No transaction or
 * row lock is held while posting: a config set, an alias rotation and the task's status changes go
 * on meanwhile. The job is responsible for updates up to its own timeline_seq: a failure there is
 * thrown for a retry, or, on the final attempt, the update is given up so later ones can flow. A
 * failure on a later update ends the run quietly: that update's own job retries it. A permanent
 * refusal (isPermanentRefusal) gives any update up at once. 'more': the
 * run stopped at its budget before reaching its own update; run the job again.
 */
export async function deliverPending(deps: DeliveryDeps, job: DeliveryJob, finalAttempt: boolean): Promise<DeliveryOutcome> {
  const { db, cfg, log } = deps;
  const exists = await repo.getPushConfig(db, job.task_id, job.config_id);
  if (!exists) return 'config gone';
  if (exists.delivered_seq >= job.timeline_seq) return 'nothing to deliver';
  const leaseId = randomUUID();
  const leaseMs = cfg.PUSH_TIMEOUT_MS + LEASE_MARGIN_MS;
  const started = Date.now();
  const config = await repo.leasePushConfig(db, job.task_id, job.config_id, leaseId, leaseMs);
  if (!config) return (await repo.getPushConfig(db, job.task_id, job.config_id)) ? 'busy' : 'config gone';
  try {
    if (config.delivered_seq >= job.timeline_seq) return 'nothing to deliver';
    const task = await tasks.getTask(db, job.task_id);
    if (!task) return 'config gone';
    const items = await repo.statusItemsAfter(db, job.task_id, config.delivered_seq, ITEMS_PER_RUN);
    let target = config;
    let headers = await authHeaders(deps, target);
    let reached = config.delivered_seq;
    let cut = items.length === ITEMS_PER_RUN;
    for (const item of items) {
      if (Date.now() - started > RUN_BUDGET_MS) {
        cut = true;
        break;
      }
      try {
        await postNotification(target.url, await notificationBody(db, task, item), headers, { allowPrivate: cfg.PUSH_ALLOW_PRIVATE, timeoutMs: cfg.PUSH_TIMEOUT_MS });
      } catch (err) {
        const reason = (err as Error).message;
        const status = err instanceof DeliveryError ? err.status : undefined;
        if (!isPermanentRefusal(status)) {
          if (item.seq > job.timeline_seq) break;
          if (!finalAttempt) throw new DeliveryError(`push delivery of task ${job.task_id} update ${item.seq} failed: ${reason}`, status);
        }
        log.warn({ task_id: job.task_id, config_id: job.config_id, seq: item.seq, host: new URL(target.url).host, status, reason }, 'push notification given up');
      }
      // A lease lost meanwhile (a post or a read slower than the margin) belongs to another run now.
      const now = await repo.setDeliveredSeq(db, job.task_id, job.config_id, item.seq, leaseId, leaseMs);
      if (!now) return 'busy';
      reached = item.seq;
      // The config was set again meanwhile: the rest of the run goes to its new URL, with its new token.
      if (now.url !== target.url || now.encrypted_secrets !== target.encrypted_secrets || JSON.stringify(now.authentication) !== JSON.stringify(target.authentication)) {
        target = now;
        headers = await authHeaders(deps, target);
      }
    }
    return cut && reached < job.timeline_seq ? 'more' : 'delivered';
  } finally {
    // Not released, the lease runs out by itself: the next run waits for it, no more.
    await repo.releasePushConfig(db, job.task_id, job.config_id, leaseId)
      .catch((err) => log.warn({ task_id: job.task_id, config_id: job.config_id, reason: (err as Error).message }, 'push config lease not released; it runs out by itself'));
  }
}

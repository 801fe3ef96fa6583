// Push notification delivery. Every status update of a task with push configs gets one delivery
// job per config, written to the outbox by the statement that stores the update (the trigger in
// db/migrations/0004_push_notifications.ts). A delivery run POSTs every not-yet-delivered status
// update of its config in timeline order, so a webhook sees the task's states in the order they
// happened; a failed update holds back later ones until it succeeds or is given up after
// PUSH_ATTEMPTS posts, counted per update whichever job made them. An answer that retrying cannot
// change (most 4xx, any 3xx) gives the update up at once. After a failed post the config is held for its
// backoff (or a longer Retry-After), so no job posts to it sooner. Webhook origins seen slow get
// only a few of a worker's delivery slots.
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Task as A2ATask } from '@a2a-js/sdk';
import type { Knex } from 'knex';
import * as repo from '../db/push-configs.ts';
import * as tasks from '../db/tasks.ts';
import type { TimelineRow } from '../db/timeline.ts';
import type { Message } from './shapes/task.ts';
import type { Config } from './config.ts';
import type { Logger } from './logger.ts';
import { artifactsFromTimeline, toA2ATask } from './a2a/mapping.ts';
import { guardedLookup, privateLiteralHost } from './webhook-url.ts';
import { pushSecrets } from './push-config.ts';
import { retryAfterMs } from './retry-after.ts';
import { cappedBackoffMs } from '../queues/names.ts';

// A notification's history: its newest messages up to then, within both (PUSH_CONCURRENCY bodies are
// built at once, and a task may hold TASK_MESSAGES_MAX_BYTES of messages).
const HISTORY_IN_NOTIFICATION = { limit: 100, maxBytes: 1024 * 1024 };
// A run holds its config's lease while it posts, so it is kept short: after this many updates, or
// once this much time has passed, it hands over to a fresh run. The lease lasts one post (bounded
// by PUSH_TIMEOUT_MS) and the reads around it, and is extended with each update recorded.
const ITEMS_PER_RUN = 20;
const RUN_BUDGET_MS = 15_000;
const LEASE_MARGIN_MS = 10_000;
// A post starts only while the lease surely outlasts it by this much (timers may fire late); reads
// slower than the rest of the margin (up to DB_QUERY_TIMEOUT_MS each) get the lease renewed first.
const POST_SLACK_MS = 1_000;

// The task as it stood right after one status update.
export async function notificationBody(db: Knex | Knex.Transaction, task: tasks.TaskRow, item: TimelineRow): Promise<A2ATask> {
  const status = item.event_payload as { type: 'task-status-update'; status: tasks.TaskRow['status']; status_message_id?: string };
  const { messages, artifacts } = await repo.timelineAt(db, task.id, item.seq, HISTORY_IN_NOTIFICATION);
  const history = messages.map((m) => (m.event_payload as { message: Message }).message);
  const at: tasks.TaskRow = { ...task, status: status.status, status_message_id: status.status_message_id ?? null, status_timestamp: new Date(item.created_at) };
  return toA2ATask(at, { messages: history, artifacts: artifactsFromTimeline(artifacts) });
}

export class DeliveryError extends Error {
  // retryAfterMs: how long the webhook asked us to wait (429 or 503 with Retry-After), capped.
  // permanent: no retry can pass (an internal address written as such, PUSH_ALLOW_PRIVATE off).
  constructor(message: string, readonly status?: number, readonly retryAfterMs?: number, readonly permanent = false) {
    super(message);
  }
}

// A 4xx says the request itself is refused (gone, unauthorized, too large), and a 3xx, never followed
// (it would carry the token elsewhere), is answered again whatever the retry: neither is retried.
// Timeouts (408), too early (425) and rate limits (429) pass.
const isRedirect = (status: number) => status >= 300 && status < 400;
export const isPermanentRefusal = (status: number | undefined) => status !== undefined && (isRedirect(status) || (status >= 400 && status < 500 && ![408, 425, 429].includes(status)));

// One POST of a notification. Internal targets are refused at connect time (see webhook-url.ts).
export function postNotification(
  url: string,
  body: unknown,
  headers: Record<string, string>,
  opts: { allowPrivate: boolean; timeoutMs: number },
): Promise<number> {
  const target = new URL(url);
  const host = opts.allowPrivate ? undefined : privateLiteralHost(target);
  if (host) {
    return Promise.reject(new DeliveryError(`webhook address ${host} is internal and PUSH_ALLOW_PRIVATE is off`, undefined, undefined, true));
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
      const wait = code === 429 || code === 503 ? retryAfterMs(res.headers['retry-after']) : undefined;
      res.destroy();
      if (code >= 200 && code < 300) resolve(code);
      // Location is not quoted: it may carry a signature or credentials of the receiver's.
      else if (isRedirect(code)) reject(new DeliveryError(`webhook answered HTTP ${code}: redirects are not followed; set the push config's url to the final address`, code));
      else reject(new DeliveryError(`webhook answered HTTP ${code}${wait ? ` (retry after ${wait} ms)` : ''}`, code, wait));
    });
    // The socket timeout fires only after that long idle; this bounds the whole post, however the
    // webhook trickles its answer.
    const deadline = setTimeout(() => req.destroy(new Error(`no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    req.on('timeout', () => req.destroy(new Error(`no answer within ${opts.timeoutMs} ms`)));
    req.on('error', (err) => reject(new DeliveryError(`webhook unreachable: ${err.message}`)));
    // A 101 answer (an upgrade nobody asked for) is no delivery; unheard, Node drops its socket
    // without an error. And whatever else closes the request unanswered settles the post too: an
    // unsettled post would hang its run for good, in one of the worker's delivery slots.
    req.on('upgrade', (res: http.IncomingMessage, socket: net.Socket) => {
      socket.destroy();
      reject(new DeliveryError(`webhook answered HTTP ${res.statusCode}`, res.statusCode));
    });
    req.on('close', () => {
      clearTimeout(deadline);
      reject(new DeliveryError('webhook closed the connection without an answer'));
    });
    req.end(payload);
  });
}

// A webhook origin (scheme, host, port) is slow for a minute after one of its posts took longer than
// half PUSH_TIMEOUT_MS (a timeout included).
const SLOW_FOR_MS = 60_000;
const SLOW_ORIGINS_KEPT = 10_000;
const slowPostMs = (cfg: Pick<Config, 'PUSH_TIMEOUT_MS'>) => cfg.PUSH_TIMEOUT_MS / 2;

// Delivery runs in flight per webhook origin in this worker process. A slow origin holds at most
// PUSH_CONCURRENCY_PER_HOST of the worker's slots, so that webhooks slow to answer cannot hold them
// all; a healthy one, however busy (often the only webhook there is), may use every slot.
export class OriginSlots {
  private readonly inUse = new Map<string, number>();
  // When each origin was last seen slow, oldest first: an origin seen slow again moves to the end.
  private readonly slowAt = new Map<string, number>();
  constructor(private readonly cfg: Pick<Config, 'PUSH_TIMEOUT_MS' | 'PUSH_CONCURRENCY_PER_HOST'>) {}

  isSlow(origin: string, now = Date.now()): boolean {
    const at = this.slowAt.get(origin);
    return at !== undefined && now - at < SLOW_FOR_MS;
  }

  // Runs one post to `origin`, noting the origin slow when the post takes longer than slowPostMs.
  async timed<T>(origin: string, post: () => Promise<T>): Promise<T> {
    const started = Date.now();
    try {
      return await post();
    } finally {
      const now = Date.now();
      if (now - started > slowPostMs(this.cfg)) this.markSlow(origin, now);
    }
  }

  private markSlow(origin: string, now: number): void {
    this.slowAt.delete(origin);
    this.slowAt.set(origin, now);
    // Bounded memory: entries older than a minute, and the oldest beyond SLOW_ORIGINS_KEPT, go.
    for (const [o, at] of this.slowAt) {
      if (now - at < SLOW_FOR_MS && this.slowAt.size <= SLOW_ORIGINS_KEPT) break;
      this.slowAt.delete(o);
    }
  }

  // A release function, or undefined when the origin is slow and already has all its slots in use.
  take(origin: string): (() => void) | undefined {
    const n = this.inUse.get(origin) ?? 0;
    if (n >= this.cfg.PUSH_CONCURRENCY_PER_HOST && this.isSlow(origin)) return undefined;
    this.inUse.set(origin, n + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = this.inUse.get(origin)! - 1;
      if (left) this.inUse.set(origin, left);
      else this.inUse.delete(origin);
    };
  }
}

// A run that finds its config leased by a running run comes back after BUSY_DELAY_MS, doubled for
// each time its job ran before, up to BUSY_DELAY_MAX_MS: the jobs of a backlog all wait for the one
// run that posts, and each costs a few reads whenever it comes back, so a long wait has to cost
// only a few comebacks. The jitter keeps jobs turned away together from coming back together.
const BUSY_DELAY_MS = 200;
const BUSY_DELAY_MAX_MS = 5_000;
const busyDelayMs = (runsBefore: number) =>
  Math.round(Math.min(BUSY_DELAY_MS * 2 ** runsBefore, BUSY_DELAY_MAX_MS) * (0.75 + Math.random() / 2));

// A run over a slow origin's slots comes back after about the time one of them takes to free up:
// each of its posts takes over slowPostMs, so its PUSH_CONCURRENCY_PER_HOST slots free up about
// once every slowPostMs / PUSH_CONCURRENCY_PER_HOST between them (1 s by default); coming back more
// often would only find them full. The jitter keeps runs turned away together from coming back together.
const slowOriginDelayMs = (cfg: Pick<Config, 'PUSH_TIMEOUT_MS' | 'PUSH_CONCURRENCY_PER_HOST'>) =>
  Math.round(Math.max(BUSY_DELAY_MS, slowPostMs(cfg) / cfg.PUSH_CONCURRENCY_PER_HOST) * (0.75 + Math.random() / 2));

async function authHeaders(deps: DeliveryDeps, config: repo.PushConfigRow): Promise<Record<string, string>> {
  const { token, credentials } = await pushSecrets(deps, config);
  const headers: Record<string, string> = {};
  if (token) headers['x-a2a-notification-token'] = token;
  if (credentials && config.authentication) headers.authorization = `${config.authentication.schemes[0]} ${credentials}`;
  return headers;
}

export interface DeliveryJob { task_id: string; config_id: string; timeline_seq: number }
// Run the job again in `ms`, without spending an attempt: 'busy', another run leases the config;
// 'held', a failed post's backoff or a webhook's Retry-After holds it; 'slow origin', the origin's slots are all in use; 'more',
// the run stopped at its budget (or its config moved to another origin) before reaching its own update.
export interface Later { later: 'busy' | 'held' | 'slow origin' | 'more'; ms: number }
export type DeliveryOutcome = 'delivered' | 'nothing to deliver' | 'config gone' | 'skipped: push notifications off' | Later;

interface DeliveryDeps { db: Knex; cfg: Config; log: Logger }

const origin = (url: string) => new URL(url).origin;

// The hold after an update's n-th failed post: the queue's backoff.
export const retryBackoffMs = (cfg: Pick<Config, 'PUSH_BACKOFF_MS' | 'RETRY_BACKOFF_MAX_MS'>, failedPosts: number) => cappedBackoffMs(cfg, cfg.PUSH_BACKOFF_MS, failedPosts);

/**
 * Delivers the pending status updates of one config, oldest first, under a lease so runs for the
 * same config never overlap ('busy': another run holds it; try again, later each time: busyDelayMs,
 * from `runsBefore`, the job's runs before this one), in one of its
 * origin's slots (OriginSlots). No transaction or
 * row lock is held while posting: a config set, an alias rotation and the task's status changes go
 * on meanwhile. A failed post is counted against its update (repo.countFailedPost): before
 * PUSH_ATTEMPTS of them, the config is held for the backoff, or a longer Retry-After
 * (repo.holdPushConfig), and the run ends; every run of the config finds it held and comes back when
 * the hold ends ('held'), and the update's own job (or a later one's) posts it again. At
 * PUSH_ATTEMPTS, or at once on a permanent refusal (isPermanentRefusal), the update is given up and
 * the run goes on. Faults of ours (a database error, an undecryptable token) are thrown: BullMQ
 * retries the job. See Later for the other outcomes.
 */
export async function deliverPending(deps: DeliveryDeps, slots: OriginSlots, job: DeliveryJob, runsBefore: number): Promise<DeliveryOutcome> {
  const exists = await repo.getPushConfig(deps.db, job.task_id, job.config_id);
  if (!exists) return 'config gone';
  if (exists.delivered_seq >= job.timeline_seq) return 'nothing to deliver';
  // Off (A2A_PUSH_NOTIFICATIONS=false, say without webhook egress): configs stored while it was on
  // are kept, and their updates until then passed over, not held back for a burst of stale ones later.
  if (!deps.cfg.A2A_PUSH_NOTIFICATIONS) {
    await repo.skipUpdatesUpTo(deps.db, job.task_id, job.config_id, job.timeline_seq);
    return 'skipped: push notifications off';
  }
  const slotOrigin = origin(exists.url);
  const release = slots.take(slotOrigin);
  if (!release) return { later: 'slow origin', ms: slowOriginDelayMs(deps.cfg) };
  try {
    return await deliverLeased(deps, slots, slotOrigin, job, runsBefore);
  } finally {
    release();
  }
}

async function deliverLeased(deps: DeliveryDeps, slots: OriginSlots, slotOrigin: string, job: DeliveryJob, runsBefore: number): Promise<DeliveryOutcome> {
  const { db, cfg, log } = deps;
  const busy = (): Later => ({ later: 'busy', ms: busyDelayMs(runsBefore) });
  const leaseId = randomUUID();
  const leaseMs = cfg.PUSH_TIMEOUT_MS + LEASE_MARGIN_MS;
  const started = Date.now();
  // A lease statement sets lease_until from its own start, after it was sent: the lease surely holds
  // until leaseMs after leaseSentAt (a monotonic clock, unlike Date.now()).
  let leaseSentAt = performance.now();
  const config = await repo.leasePushConfig(db, job.task_id, job.config_id, leaseId, leaseMs);
  if (!config) {
    const holdMs = await repo.pushConfigHoldMs(db, job.task_id, job.config_id);
    if (holdMs === undefined) return 'config gone';
    return holdMs ? { later: 'held', ms: holdMs } : busy();
  }
  // A failed post's backoff or the webhook's Retry-After: the config is held that long once the run
  // ends, so that no run of it (a later update's job included) posts to it sooner.
  let holdMs = 0;
  // The config as the run posts to it: a set seen between two updates moves the rest there.
  let target = config;
  const leaseOutlastsPost = () => performance.now() - leaseSentAt <= LEASE_MARGIN_MS - POST_SLACK_MS;
  // Whether the run may post now: only while no other run can have taken the config, so that a
  // webhook never gets an update twice from overlapping runs, or a later one before it. The lease is
  // renewed (one UPDATE) only after reads slow enough to eat into its margin.
  const mayPost = async () => {
    if (leaseOutlastsPost()) return true;
    const sent = performance.now();
    if (!(await repo.renewPushConfigLease(db, job.task_id, job.config_id, leaseId, leaseMs))) return false;
    leaseSentAt = sent;
    // A renewal that itself took most of the margin leaves too little for a post: the run ends.
    return leaseOutlastsPost();
  };
  try {
    if (config.delivered_seq >= job.timeline_seq) return 'nothing to deliver';
    const task = await tasks.getTask(db, job.task_id);
    if (!task) return 'config gone';
    // The config moved to another origin since the slot was taken: the run comes back for its slot.
    if (origin(config.url) !== slotOrigin) return { later: 'more', ms: 0 };
    const items = await repo.statusItemsAfter(db, job.task_id, config.delivered_seq, ITEMS_PER_RUN);
    let headers = await authHeaders(deps, target);
    let reached = config.delivered_seq;
    let cut = items.length === ITEMS_PER_RUN;
    for (const item of items) {
      if (Date.now() - started > RUN_BUDGET_MS) {
        cut = true;
        break;
      }
      try {
        const body = await notificationBody(db, task, item);
        if (!(await mayPost())) return busy();
        await slots.timed(slotOrigin, () => postNotification(target.url, body, headers, { allowPrivate: cfg.PUSH_ALLOW_PRIVATE, timeoutMs: cfg.PUSH_TIMEOUT_MS }));
      } catch (err) {
        if (!(err instanceof DeliveryError)) throw err;
        const { status, retryAfterMs: wait, message: reason } = err;
        const where = { task_id: job.task_id, config_id: job.config_id, seq: item.seq, host: new URL(target.url).host, status, reason };
        holdMs = wait ?? 0;
        if (!err.permanent && !isPermanentRefusal(status)) {
          const failed = await repo.countFailedPost(db, job.task_id, job.config_id, leaseId, target.updated_at);
          // Taken by another run, or set again (its URL mended, say) while the post failed: no hold.
          if (failed === undefined) {
            holdMs = 0;
            return busy();
          }
          if (failed < cfg.PUSH_ATTEMPTS) {
            holdMs = Math.max(holdMs, retryBackoffMs(cfg, failed));
            log.warn({ ...where, attempt: failed, attempts: cfg.PUSH_ATTEMPTS, retry_in_ms: holdMs }, 'push notification post failed');
            return item.seq > job.timeline_seq ? 'delivered' : { later: 'held', ms: holdMs };
          }
        }
        log.warn(where, 'push notification given up');
      }
      // A lease lost since the post (statements slower than the slack it had left) belongs to another run now.
      leaseSentAt = performance.now();
      const now = await repo.setDeliveredSeq(db, job.task_id, job.config_id, item.seq, leaseId, leaseMs);
      if (!now) return busy();
      reached = item.seq;
      // Given up, yet the webhook asked for a pause: the next update waits for the hold to end; and
      // a config moved to another origin is left to a run in that origin's slot.
      if (holdMs || origin(now.url) !== slotOrigin) {
        cut = true;
        break;
      }
      // The config was set again meanwhile: the rest of the run goes to its new URL, with its new token.
      if (now.url !== target.url || now.encrypted_secrets !== target.encrypted_secrets || JSON.stringify(now.authentication) !== JSON.stringify(target.authentication)) {
        target = now;
        headers = await authHeaders(deps, target);
      }
    }
    return cut && reached < job.timeline_seq ? { later: 'more', ms: 0 } : 'delivered';
  } finally {
    // Not released (or held), the lease runs out by itself: the next run waits for it, no more.
    await (holdMs ? repo.holdPushConfig(db, job.task_id, job.config_id, leaseId, holdMs, target.updated_at) : repo.releasePushConfig(db, job.task_id, job.config_id, leaseId))
      .catch((err) => log.warn({ task_id: job.task_id, config_id: job.config_id, reason: (err as Error).message }, 'push config lease not released; it runs out by itself'));
  }
}

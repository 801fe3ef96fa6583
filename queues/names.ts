import { Backoffs, UnrecoverableError, type BackoffStrategy, type Job, type JobsOptions, type Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Config } from '../domain/config.ts';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { PushConfigId, Uuid } from '../domain/shapes/common.ts';

export const QUEUE_NAMES = ['agent-tasks', 'key-jobs', 'credential-refresh', 'push-notifications'] as const;
export type QueueName = (typeof QUEUE_NAMES)[number];

// Job payloads carry ids only: never secrets, tokens or key material. The outbox writes them; a
// job added by hand (the queue dashboard) is checked against its queue's schema before it is queued,
// and every job by its worker before it runs (job-payloads.ts).
export const JOB_PAYLOAD_SCHEMAS = {
  'agent-tasks': Type.Object({ task_id: Uuid, message_id: Uuid }),
  'key-jobs': Type.Object({ job_id: Uuid }),
  'credential-refresh': Type.Object({ credential_id: Uuid }),
  'push-notifications': Type.Object({ task_id: Uuid, config_id: PushConfigId, timeline_seq: Type.Integer({ minimum: 1 }) }),
} satisfies Record<QueueName, TSchema>;
export type JobPayloads = { [Q in QueueName]: Static<(typeof JOB_PAYLOAD_SCHEMAS)[Q]> };

// A queue's jobs by state, as metrics and the internal queue stats show them. A job given a priority
// (from the queue dashboard) waits in a set of its own, BullMQ's `prioritized`: it is waiting all the same.
// So does a delayed job whose time has come, left in BullMQ's delayed set until a worker comes for
// jobs: `delayed` is only those whose time is still to come. They are counted by score (ZCOUNT), not
// read, and after the other counts: one promoted in between stays `delayed`, never counted twice.
// `redis`: the queue's connection (BullMQ's own client type has no ZCOUNT).
export async function queueJobCounts(queue: Queue, redis: Pick<Redis, 'zcount'>): Promise<Record<string, number>> {
  const { prioritized, ...counts } = await queue.getJobCounts('waiting', 'prioritized', 'active', 'delayed', 'completed', 'failed');
  const due = Math.min(counts.delayed, await redis.zcount(queue.keys.delayed, 0, dueScoreMax(Date.now())));
  return { ...counts, waiting: counts.waiting + prioritized + due, delayed: counts.delayed - due };
}

// The highest delayed-set score of a job due by `now` (ms): BullMQ scores a delayed job by its time,
// ms * 0x1000, plus a counter below 0x1000.
const dueScoreMax = (now: number) => (now + 1) * 0x1000 - 1;

// Whether a job ran before and was sent back to wait by a retry of it once it had finished (Job.retry,
// the dashboard's Retry and Retry all): BullMQ deletes its processedOn, keeps its add time, and records
// no time of that retry. Its counts of attempts tell, unless the retry reset them; its stack trace
// (kept) still tells of a failure. `taken`: a job a worker has just taken, its attempt counted started.
export const retriedAfterFinishing = (job: Job, taken = false): boolean =>
  job.attemptsStarted > (taken ? 1 : 0) || job.attemptsMade > 0 || !!job.stacktrace?.length;

// How long the longest-waiting job has waited; null when none waits. BullMQ records no time of a
// job's return to the wait list (a retry, a run handed back at shutdown, a stalled run taken back),
// only when it was added (timestamp, plus opts.delay) and when a worker last took it (processedOn):
// its wait began no earlier than the latest of these, so it counts from there (a fresh job: from its
// add), not from its first add. A job retried once it had finished has no processedOn, and its add
// time may be days old: it is left out, undated (and does not end the scan below). A run handed back at shutdown or taken back after stalling goes to
// the front of the line (moveJobFromActiveToWait, moveStalledJobsToWait: RPUSH), as does a new job
// added lifo (the queue dashboard allows it); other new jobs and retries (promoted once their backoff
// is over, or retryJob without lifo) go to the back (LPUSH), in the order they came. Every job pushed
// to the front lies ahead of every job pushed to the back. So the longest wait is among the jobs from
// the front up to the first that never ran and was not added lifo: those behind it came later. A lifo
// job does not end the scan, as it may be newer than those behind it. The scan still reads at most
// OLDEST_SCAN_MAX jobs per list: past that many lifo jobs and returned runs at the front, an older
// job behind them goes unseen. Jobs with a priority are ordered by it, not by age: each is read
// (up to OLDEST_SCAN_MAX). A delayed job (a new one with a
// delay, a retry in its backoff) waits once its time has come, yet stays in BullMQ's delayed set
// until a worker comes for jobs: the earliest due there waits since its time, its score (ms * 0x1000).
const OLDEST_SCAN_PAGE = 50;
const OLDEST_SCAN_MAX = 1000;
export async function oldestWaitingAgeMs(queue: Queue): Promise<number | null> {
  let since = Infinity;
  for (const state of ['waiting', 'prioritized'] as const) {
    scan: for (let at = 0; at < OLDEST_SCAN_MAX; at += OLDEST_SCAN_PAGE) {
      const jobs = await queue.getJobs([state], at, at + OLDEST_SCAN_PAGE - 1, true);
      for (const job of jobs) {
        if (!job.processedOn && retriedAfterFinishing(job)) continue;
        since = Math.min(since, Math.max(job.timestamp + (job.opts.delay ?? 0), job.processedOn ?? 0));
        if (state === 'waiting' && !job.processedOn && !job.opts.lifo) break scan;
      }
      if (jobs.length < OLDEST_SCAN_PAGE) break;
    }
  }
  const [, score] = await (await queue.getBackend().client).zrange(queue.keys.delayed, 0, 0, { WITHSCORES: true });
  const due = score === undefined ? Infinity : Math.floor(Number(score) / 0x1000);
  if (due <= Date.now()) since = Math.min(since, due);
  return since === Infinity ? null : Date.now() - since;
}

// Worker connections taking `queue`'s jobs on Redis database `db` (the queue's). BullMQ finds them by
// name in CLIENT LIST, which lists every client of the Redis server: the workers of another
// installation on another database of it, under the same QUEUE_PREFIX, counted as this one's.
// A Redis without CLIENT LIST gets one made-up entry from BullMQ (no `db`): no count rather than a wrong one.
export async function queueWorkerCount(queue: Queue, db: number): Promise<number> {
  const clients = await queue.getWorkers();
  if (clients.some((c) => c.db === undefined)) throw new Error('Redis does not list its clients (CLIENT LIST)');
  return clients.filter((c) => c.db === String(db)).length;
}

// Jobs each worker process runs at once, per queue.
export function queueConcurrency(cfg: Config): Record<QueueName, number> {
  return {
    'agent-tasks': cfg.AGENT_CONCURRENCY,
    'key-jobs': cfg.KEY_JOB_CONCURRENCY,
    'credential-refresh': cfg.CREDENTIAL_REFRESH_CONCURRENCY,
    'push-notifications': cfg.PUSH_CONCURRENCY,
  };
}

// Retries wait `delay`, doubled for each attempt before, up to RETRY_BACKOFF_MAX_MS: BullMQ's own
// exponential backoff has no ceiling (AGENT_ATTEMPTS=20 at 1 s would wait six days before the last).
export const CAPPED_EXPONENTIAL = 'capped-exponential';
/** The backoff types a job of ours may name: BullMQ's own two, and ours (backoffStrategy). */
export const BACKOFF_TYPES = [CAPPED_EXPONENTIAL, 'exponential', 'fixed'] as const;
export const cappedBackoffMs = (cfg: Pick<Config, 'RETRY_BACKOFF_MAX_MS'>, delay: number, attemptsMade: number) =>
  Math.min(delay * 2 ** (attemptsMade - 1), cfg.RETRY_BACKOFF_MAX_MS);
/** Every worker's backoffStrategy (BullMQ calls it for backoff types of its own it does not know). */
export const backoffStrategy = (cfg: Config): BackoffStrategy => (attemptsMade, type, _err, job) => {
  if (type !== CAPPED_EXPONENTIAL) throw new Error(`unknown backoff type ${type}`);
  return cappedBackoffMs(cfg, job?.opts.backoff && typeof job.opts.backoff === 'object' ? job.opts.backoff.delay ?? 0 : 0, attemptsMade);
};

// Whether the attempt under way is the job's last: failing, it fails for good.
export const lastAttempt = (job: Pick<Job, 'attemptsMade' | 'opts'>): boolean => job.attemptsMade + 1 >= (job.opts.attempts ?? 1);

// How long BullMQ waits before it runs `job` again once the attempt under way fails with `err`, as a
// worker decides it (Job.shouldRetryJob, not exported; the job's backoff, backoffStrategy for ours).
// Undefined when BullMQ does not run it again: after the last attempt, for an UnrecoverableError
// (known by its name too, as BullMQ does), or when the backoff answers -1. BullMQ also stops at a
// worker's maxStartedAttempts, which none of ours sets (workers/main.ts).
export async function retryDelayMs(cfg: Config, job: Job, err: Error): Promise<number | undefined> {
  if (lastAttempt(job) || err instanceof UnrecoverableError || err.name === 'UnrecoverableError') return undefined;
  const backoff = job.opts.backoff === undefined ? undefined : Backoffs.normalize(job.opts.backoff);
  const delay = backoff && await Backoffs.calculate(backoff, job.attemptsMade + 1, err, job, backoffStrategy(cfg));
  return delay === -1 ? undefined : delay || 0;
}

export function defaultJobOptions(cfg: Config, queue: QueueName): JobsOptions {
  const common: JobsOptions = { removeOnComplete: { count: 1000, age: 3600 }, removeOnFail: { count: 10000, age: 7 * 86400 } };
  switch (queue) {
    case 'agent-tasks':
      return { ...common, attempts: cfg.AGENT_ATTEMPTS, backoff: { type: CAPPED_EXPONENTIAL, delay: cfg.AGENT_BACKOFF_MS } };
    case 'key-jobs':
      // Ten attempts ride out about eight minutes of a key service's outage, then the job fails visibly.
      return { ...common, attempts: 10, backoff: { type: 'exponential', delay: 1000 } };
    case 'credential-refresh':
      // Removed when they end: the job id is the credential's, free again for its next due time.
      return { removeOnComplete: true, removeOnFail: true, attempts: cfg.CREDENTIAL_REFRESH_ATTEMPTS, backoff: { type: CAPPED_EXPONENTIAL, delay: cfg.CREDENTIAL_REFRESH_BACKOFF_MS } };
    case 'push-notifications':
      return { ...common, attempts: cfg.PUSH_ATTEMPTS, backoff: { type: CAPPED_EXPONENTIAL, delay: cfg.PUSH_BACKOFF_MS } };
  }
}

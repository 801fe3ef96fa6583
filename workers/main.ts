// The `worker` process: BullMQ workers for every queue, with graceful shutdown.
import { Worker, type Job, type Processor } from 'bullmq';
import { exitOnConfigError, loadConfigOrExit, warnOfLookalikeVariables } from '../domain/config.ts';
import { createServices } from '../domain/services.ts';
import { bootstrap } from '../domain/bootstrap.ts';
import { waitForBackingServices } from '../domain/startup.ts';
import { startKeyringInvalidation } from '../domain/keyring.ts';
import { createRedis } from '../queues/connection.ts';
import { publicReason } from '../domain/errors.ts';
import { createAgentTaskProcessor } from './run-agent-task.ts';
import { createKeyJobsProcessor, onKeyJobFailed } from './key-jobs.ts';
import { startHousekeeping } from './housekeeping.ts';
import { failLostRun } from './fail-run.ts';
import { logCrashesMasked } from './crash-lines.ts';
import { createPushDeliveryProcessor, listenForPushDeliveries } from './deliver-push.ts';
import { CancelRegistry } from './cancel-registry.ts';
import { watchCancels } from './watch-cancels.ts';
import { startRunHeartbeat } from './run-heartbeat.ts';
import { createRefreshCredentialProcessor, giveUpOnRefreshesFailedForGood, recordRefreshOutcomes, startRefreshScheduler } from './refresh-credential.ts';
import { UnstoredTokens } from '../domain/bridge/credential-refresh.ts';
import { AgentConfigError, resolveAgent } from './agents/resolve-agent.ts';
import { failedForGood, recordJobMetrics } from './record-job-metrics.ts';
import { WorkerMetrics } from '../queues/worker-metrics.ts';
import { backoffStrategy, queueConcurrency, type JobPayloads, type QueueName } from '../queues/names.ts';
import { checkingPayload, JobPayloadMismatch } from '../queues/job-payloads.ts';
import { stalledTooOften } from '../queues/stalled.ts';
import { exitIfNotStoppedWithin, onStop, workerStopWithinMs } from '../domain/stop-signals.ts';
import { renewingRetakenLocks } from './renew-retaken-lock.ts';
import { throttledWarn } from '../domain/throttled-warn.ts';

const cfg = loadConfigOrExit();
const services = createServices(cfg, 'worker');
const { log } = services;
warnOfLookalikeVariables(log);
await waitForBackingServices(services).catch(exitOnConfigError);
await bootstrap(services).catch(exitOnConfigError);
await startKeyringInvalidation(services);
services.outbox.startSweeper();

logCrashesMasked(log);

const cancels = new CancelRegistry();
// A task ended with no run of it here: the agent's passes for ended tasks run soon (the remote
// agent's cancel of the remote task, which a run would have done), not at their next turn.
let afterCancel = () => {};
const stopWatchingCancels = await watchCancels(services, cancels, () => afterCancel());
// Four marks within the age recovery waits for before it takes a working task's run for lost.
const stopRunHeartbeat = startRunHeartbeat(services, cancels, cfg.JOB_RECOVERY_MS / 4);

const agent = await resolveAgent(services).catch((err: unknown) => {
  if (!(err instanceof AgentConfigError)) throw err;
  log.debug({ err: err.cause }, 'agent module error');
  log.fatal(err.message);
  process.exit(2);
});
const connection = createRedis(cfg.REDIS_URL, 'worker');
connection.on('error', (err) => log.debug({ err: { message: err.message } }, 'redis connection error'));
const concurrency = queueConcurrency(cfg);
// Each processor is wrapped: it runs only jobs whose data is its queue's payload (queues/job-payloads.ts),
// and a job taken again after it stalled keeps its lock (renew-retaken-lock.ts).
const wrapped = <Q extends QueueName, R>(queue: Q, processor: Processor<JobPayloads[Q], R>) =>
  checkingPayload(queue, renewingRetakenLocks(processor, cfg.WORKER_LOCK_MS), log);
const common = {
  connection, prefix: cfg.QUEUE_PREFIX, lockDuration: cfg.WORKER_LOCK_MS, stalledInterval: cfg.WORKER_STALLED_CHECK_MS, maxStalledCount: 5,
  settings: { backoffStrategy: backoffStrategy(cfg) },
};

const metrics = new WorkerMetrics(services.redis, cfg.QUEUE_PREFIX);
const agentWorker = new Worker<JobPayloads['agent-tasks'], string>('agent-tasks', wrapped('agent-tasks', createAgentTaskProcessor(services, agent.handler, cancels, metrics)), {
  ...common,
  concurrency: concurrency['agent-tasks'],
  // Never reached: BullMQ honours a queue's manual rate limit (the pause of runs during a Postgres
  // outage, run-agent-task.ts) only on workers with a limiter.
  limiter: { max: Number.MAX_SAFE_INTEGER, duration: 1000 },
});
// A job that stalled too often never reaches the processor's own final-attempt handling.
agentWorker.on('failed', (job: Job<JobPayloads['agent-tasks']> | undefined, err) => {
  if (!job || !stalledTooOften(err)) return;
  // Recovery (recover-agent-runs.ts) fails the task later when this cannot.
  failLostRun(services, job.data.task_id, job.data.message_id, `its worker stopped during it too often (${err.message})`).catch(() => undefined);
});

// Fired when a shutdown's grace period is over: key jobs go back to the queue after their batch.
const keyJobsHandBack = new AbortController();
const keyJobsWorker = new Worker<JobPayloads['key-jobs']>('key-jobs', wrapped('key-jobs', createKeyJobsProcessor(services, keyJobsHandBack.signal)), {
  ...common,
  concurrency: concurrency['key-jobs'],
});
keyJobsWorker.on('failed', onKeyJobFailed(services));
const housekeeping = startHousekeeping(services, agent.housekeeping);
afterCancel = () => { for (const name of agent.afterCancel ?? []) housekeeping.soon(name); };

const pushWorker = new Worker<JobPayloads['push-notifications']>('push-notifications', wrapped('push-notifications', createPushDeliveryProcessor(services)), {
  ...common,
  concurrency: concurrency['push-notifications'],
});
const pushListener = await listenForPushDeliveries(services);

// Refreshed tokens this process could not store yet, for the next attempts of their jobs.
const unstoredTokens = new UnstoredTokens(cfg);
const refreshWorker = new Worker<JobPayloads['credential-refresh']>('credential-refresh', wrapped('credential-refresh', createRefreshCredentialProcessor(services, unstoredTokens)), {
  ...common,
  concurrency: concurrency['credential-refresh'],
});
giveUpOnRefreshesFailedForGood(refreshWorker, services, unstoredTokens);
const stopRefreshScheduler = startRefreshScheduler(services);

// These processors leave their failures to BullMQ's retries, saying nothing of them: each is logged
// here with the job's ids (payloads hold ids only), and one that failed for good with its stack.
// A job whose data is not a payload was logged, without its data, as it was failed.
for (const w of [pushWorker, refreshWorker] as Worker[]) {
  w.on('failed', (job: Job | undefined, err) => {
    if (!job || err instanceof JobPayloadMismatch) return;
    const where = { queue: w.name, job_id: job.id, ...job.data, attempt: job.attemptsMade, attempts: job.opts.attempts };
    if (failedForGood(job)) log.error({ ...where, err }, 'job failed for good');
    else log.warn({ ...where, reason: publicReason(err) }, 'job attempt failed; it will be retried');
  });
}

const workers = [agentWorker, keyJobsWorker, pushWorker, refreshWorker];
for (const w of workers) {
  const warn = throttledWarn(log, 'worker error');
  w.on('error', (err) => warn({ err: { message: err.message }, queue: w.name }));
  w.on('stalled', (jobId) => log.warn({ queue: w.name, job_id: jobId }, 'job stalled: its worker died or was blocked past WORKER_LOCK_MS; moved back to wait'));
}
for (const w of workers) recordJobMetrics(w, metrics);
recordRefreshOutcomes(refreshWorker, metrics);
// Flushed every second: a warn line a minute while Redis is away, as the queues' errors are.
const warnFlush = throttledWarn(log, 'worker metrics not flushed; will retry');
metrics.start((err) => warnFlush({ err: { message: err.message } }));
log.info({ queues: workers.map((w) => w.name), agent: cfg.AGENT_KIND }, 'worker started');

let stopping = false;
async function shutdown(signal: string) {
  if (stopping) return;
  stopping = true;
  log.info({ signal }, 'worker shutting down: finishing active jobs');
  const grace = setTimeout(() => {
    // Agent runs still going are handed back to the queue for another worker; key jobs follow after their batch.
    const runs = cancels.abortAll('worker shutting down');
    keyJobsHandBack.abort();
    if (runs) log.warn({ runs, grace_ms: cfg.WORKER_SHUTDOWN_GRACE_MS }, 'grace period over: agent runs handed back to the queue');
  }, cfg.WORKER_SHUTDOWN_GRACE_MS);
  grace.unref();
  // Closing the queues needs Redis (jobs handed back, locks released): without it a worker asked to
  // stop would wait for ever. Past this, it exits; the jobs it held are taken over once their locks
  // expire (WORKER_LOCK_MS).
  const closeWithinMs = workerStopWithinMs(cfg);
  exitIfNotStoppedWithin(closeWithinMs, () => log.error({ after_ms: closeWithinMs }, 'worker could not close its queues in time (Redis unreachable?); exiting: its jobs are taken over once their locks expire'));
  const housekeepingStopped = housekeeping.stop();
  stopRefreshScheduler();
  await Promise.allSettled(workers.map((w) => w.close()));
  clearTimeout(grace);
  stopRunHeartbeat();
  await stopWatchingCancels();
  await metrics.stop().catch(() => undefined);
  await pushListener.close();
  connection.disconnect();
  await housekeepingStopped;
  await services.close();
  // Last, once everything closed: a process whose close timed out exits 1 without it.
  log.info('worker stopped');
  process.exit(0);
}
onStop((why) => void shutdown(why));

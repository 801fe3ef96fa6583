// Processor of the agent-tasks queue: runs (or continues) one task's agent. Every step is safe
// to repeat: a job re-run after a crash skips work already committed.
import { RateLimitError, WaitingError, type Job } from 'bullmq';
import { randomUUID } from 'node:crypto';
import type { Services } from '../domain/services.ts';
import { InvalidRequest, NotFound, publicReason, type ResourceName, refusedByRuntime, unanswered, unreachable } from '../domain/errors.ts';
import type { JobPayloads } from '../queues/names.ts';
import * as tasks from '../db/tasks.ts';
import type { RunState } from '../db/tasks.ts';
import type { Logger } from '../domain/logger.ts';
import { appendArtifact, appendMessage, beginRun, changeStatus, changeStatusIf, checkRoom } from '../domain/tasks.ts';
import { inStatement, inTransaction, type UnitOfWork } from '../domain/unit-of-work.ts';
import { heldByTake, isTerminal, RUN_RESULTS, runEndsFrom, workingUnder } from '../domain/task-states.ts';
import { RUN_TAKE, type AgentContext, type AgentHandler, type AgentResult } from './agents/types.ts';
import { agentMessage, checkArtifact } from './agents/agent-output.ts';
import { cutReason, failRun, failureReason } from './fail-run.ts';
import type { CancelRegistry } from './cancel-registry.ts';
import type { WorkerMetrics } from '../queues/worker-metrics.ts';
import { noSecretWithKey, readSecretValue } from '../domain/secrets.ts';
import { agentCallKey, invokeFunction } from '../domain/bridge/functions.ts';
import { checkAgainst } from '../domain/bridge/catalog.ts';
import { AgentInvokeOptions } from '../domain/shapes/bridge.ts';
import { withTimeout } from '../domain/with-timeout.ts';
import { SHUTDOWN_WIND_DOWN_MS } from '../domain/stop-signals.ts';
import { findUnstorable, storableText } from '../domain/storable-json.ts';
import { postgresAnswers, PROBE_TIMEOUT_MS } from '../domain/readiness.ts';
import { readTimeoutMs } from '../db/knex.ts';
import { callLimit } from '../domain/call-limit.ts';
import { secretMasker } from '../domain/secret-mask.ts';
import { holdSecretsRead } from './secrets-read.ts';
import { ownStoreFailure } from './agents/own-store.ts';

const HISTORY = 200;
// The most of one run's secret reads in flight at once, and apart from them of its invokeFunction
// calls (a provider's answer may take BRIDGE_TIMEOUT_MS): each holds one of the worker's 20 Postgres
// connections while it reads. Its writes (reply, setStatus, emitArtifact) go one at a time, in the
// order made: they all take the task's row lock, so more at once only raced for it, landing out of
// order (a replaced artifact over the chunks appended after it); and 10,000 artifacts emitted at
// once used to wait on the pool until they timed out as Postgres out of reach, and the run was tried
// again, for ever.
const CALLS_PER_RUN = 4;
// How long agent runs pause, on every worker, once one meets Postgres or Redis unavailable.
const OUTAGE_PAUSE_MS = 1000;

function finalOf(result: AgentResult | void) {
  // A string returned for its message, or a misspelt member (`mesage`), completed the task with
  // "Task completed" and dropped what the agent meant to say.
  if (result !== undefined && result !== null) {
    const shape = 'a run returns {status?, message?} or nothing';
    if (typeof result !== 'object' || Array.isArray(result)) throw new InvalidRequest(`The agent returned ${Array.isArray(result) ? 'an array' : `a ${typeof result}`}; ${shape}`);
    const extra = Object.keys(result).find((k) => k !== 'status' && k !== 'message');
    if (extra !== undefined) throw new InvalidRequest(`The agent returned a result with '${extra}'; ${shape}`);
  }
  const status = result?.status ?? 'completed';
  if (!RUN_RESULTS.includes(status)) throw new InvalidRequest(`The agent returned status '${String(status)}'; a run ends in one of ${RUN_RESULTS.join(', ')}`);
  return { status, message: agentMessage(result?.message ?? `Task ${status}`, 'message') };
}

// What the agent threw, if the runtime can read it as it reads failures (its message, whether it is
// an Error or ended the task); else an Error saying so. A getter or proxy trap that throws would
// otherwise escape the run's failure handling: the task stayed working until job recovery.
function readable(thrown: unknown): unknown {
  try {
    // A function has members (a message) and may be a proxy too.
    if ((typeof thrown === 'object' && thrown !== null) || typeof thrown === 'function') {
      failureReason(thrown);
      void (thrown as { taskEnded?: unknown }).taskEnded;
      void (thrown instanceof Error);
      ownStoreFailure(thrown);
    }
    return thrown;
  } catch {
    return new Error(`the agent threw ${typeof thrown === 'function' ? 'a function' : 'an object'} that could not be read`);
  }
}

// A name an agent looks something up by (a secret's key, a provider instance's id). Unchecked,
// undefined reached the query builder, whose error quoted our SQL as the task's status message after
// every retry, and a NUL character Postgres (SQLSTATE 22021, retried): the first is a wrong call, the
// second names nothing that can be stored.
function lookupName(value: unknown, what: string, notFound: (name: string) => NotFound): string {
  if (typeof value !== 'string') throw new InvalidRequest(`${what} must be a string, not ${value === null ? 'null' : typeof value}`);
  if (findUnstorable(value)) throw notFound(storableText(value));
  return value;
}
const notFoundAs = (resource: ResourceName) => (name: string) => new NotFound(resource, name);

// Settles when the run is aborted (task canceled, worker shutting down), whether or not the agent
// stops: a run that ignores its signal must not hold the job, or the worker, past a cancel or the
// shutdown grace period.
const abortedBy = (signal: AbortSignal) => new Promise<never>((_, reject) => {
  if (signal.aborted) reject(signal.reason);
  signal.addEventListener('abort', () => reject(signal.reason), { once: true });
});

// A run aborted by the worker's shutdown: it is handed back to the queue once its agent stops, and
// what the agent writes until then still lands, for the next try to find.
const forShutdown = (signal: AbortSignal) => signal.aborted && !!(signal.reason as { shutdown?: boolean } | undefined)?.shutdown;

// What a run hands its agent: the task, its history and trigger message, the run's abort signal, and
// the calls it may make, each through `ours` (which marks outages and refusals). Reads and calls are
// refused once the run is aborted; writes too, but for a shutdown's abort, and they apply only while
// the task is still working under this run.
function agentContext(
  services: Services, ours: <T>(call: () => Promise<T>) => Promise<T>,
  run: { taskId: string; messageId: string; attempt: number; state: RunState; trigger: NonNullable<RunState['trigger']>; signal: AbortSignal; log: Logger; secretsRead: Set<string> },
): AgentContext {
  const { taskId, messageId, attempt, state, trigger, signal, log: runLog, secretsRead } = run;
  const writeInTurn = callLimit(1);
  const readInTurn = callLimit(CALLS_PER_RUN);
  const invokeInTurn = callLimit(CALLS_PER_RUN);
  let invocations = 0;
  const history = state.history.map(({ seq: _s, ...m }) => m);
  const { seq: _seq, ...message } = trigger;

  const ended = (what: string) => Object.assign(new Error(`task is ${what}`), { taskEnded: true });
  const over = () => Object.assign(new Error('the run is over (its task canceled or taken, or the attempt failed, timed out or was handed back)'), { taskEnded: true });
  // Reads and calls from inside a run are refused once the run is aborted.
  const whileRunning = <T>(fn: () => Promise<T>) => (signal.aborted ? Promise.reject(over()) : fn());
  // Writes too, but for a shutdown's: a failed attempt leaves its task working under its take until
  // its retry claims it, and what its handler left going (a call beside the one that threw, artifacts
  // queued for their turn) landed meanwhile, then again from the retry.
  const refuseOnceOver = () => {
    if (signal.aborted && !forShutdown(signal)) throw over();
  };
  // Writes from inside a run are skipped once the task is no longer working under it: ended (e.g.
  // canceled meanwhile), set waiting by a client, or taken by another run or by another take of this
  // run's job (a copy started elsewhere while this one stalled). Its callers (reply,
  // setStatus, emitArtifact) pass its errors through `ours`.
  const whileActive = async <T>(fn: (uow: UnitOfWork, task: tasks.TaskRow) => Promise<T>) => {
    // Before the transaction too: a run's queued calls take no connection once it is over.
    refuseOnceOver();
    return inTransaction(services, async (uow) => {
      const locked = await tasks.getTask(uow.trx, taskId, true);
      // Deleted meanwhile (TASK_RETENTION_DAYS, a context purge): ended too.
      if (!locked) throw ended('deleted');
      if (!heldByTake(locked, { messageId, attempt })) throw ended(locked.status === 'working' ? 'under another run' : locked.status);
      // Checked under the task's lock: a write that passes commits before a retry's claim of the task.
      refuseOnceOver();
      return fn(uow, locked);
    });
  };

  const maxMessageBytes = services.cfg.TASK_MESSAGES_MAX_BYTES;
  return {
    [RUN_TAKE]: attempt,
    task: tasks.toTask(state.task),
    history,
    message,
    signal,
    reply: (r) => writeInTurn(() => ours(async () => {
      const reply = agentMessage(r, 'reply');
      return (await whileActive((uow, locked) => appendMessage(uow, locked, reply, maxMessageBytes))).message;
    })),
    setStatus: (status, r) => writeInTurn(() => ours(async () => {
      // The run's end (input-required, completed, ...) is its return value, which a status set here would pre-empt.
      if (status !== 'working') throw new InvalidRequest(`ctx.setStatus takes 'working' only, not '${String(status)}'; a run ends with its return value {status, message}`);
      const progress = r === undefined ? undefined : agentMessage(r, 'message');
      await whileActive((uow, locked) => changeStatus(uow, locked, status, maxMessageBytes, progress, messageId));
    })),
    emitArtifact: (input) => writeInTurn(() => ours(async () => {
      const artifact = checkArtifact(input);
      const artifactId = artifact.artifactId ?? randomUUID();
      await whileActive((uow, locked) => appendArtifact(uow, locked, { ...artifact, artifactId }, services.cfg.TASK_ARTIFACTS_MAX_BYTES));
      return artifactId;
    })),
    readSecret: (key) => readInTurn(() => whileRunning(() => ours(async () => {
      const value = await readSecretValue(services, lookupName(key, 'ctx.readSecret: the key', noSecretWithKey));
      // Not handed out once the run is over: its values are no longer kept for masking (secrets-read.ts).
      if (signal.aborted) throw over();
      secretsRead.add(value);
      return value;
    }))),
    invokeFunction: (providerInstanceId, functionTypeId, params, options = {}) => {
      // Numbered as the agent makes its calls, not as they get their turn: a try of the run again
      // numbers them alike.
      const ordinal = ++invocations;
      return invokeInTurn(() => whileRunning(() => ours(async () => {
        checkAgainst(AgentInvokeOptions, options, 'options');
        return invokeFunction(
          services, lookupName(providerInstanceId, 'ctx.invokeFunction: the provider instance id', notFoundAs('provider_instance')),
          lookupName(functionTypeId, 'ctx.invokeFunction: the function type id', notFoundAs('function_controller')), params,
          { paramsPath: 'params', signal, log: runLog, idempotencyKey: options.idempotencyKey ?? agentCallKey(taskId, messageId, ordinal) },
        );
      })));
    },
    log: runLog,
  };
}

export function createAgentTaskProcessor(services: Services, agent: AgentHandler, cancels: CancelRegistry, metrics: WorkerMetrics) {
  const { log } = services;
  // Errors of the run's own calls saying Postgres or Redis is out of reach, too busy to take a
  // write, or silent: a statement left unanswered (unanswered()) while a probe on a connection of
  // its own gets no answer either, now or since the statement went out. A run that meets one has
  // not failed: it goes back to the queue without using up an attempt, or every run of an outage
  // would fail for good. The agent's own errors (a remote agent refusing connections) are not
  // marked: those are its failures. Nor are statements Postgres canceled (57014), or left unanswered
  // while Postgres answers probes (an event loop kept busy past the read timeout, a statement stuck
  // on a lock where statement_timeout does not reach): that may be about this run alone, which would
  // otherwise come back first after every pause, for ever.
  const outages = new WeakSet<object>();
  // When a probe last went unanswered. A statement sent into that silence may time out only once
  // Postgres answers again (its bytes lost on the way): an outage too, while its read timeout spans then.
  let silentAt = -Infinity;
  const spanMs = readTimeoutMs(services.cfg.DB_QUERY_TIMEOUT_MS) + PROBE_TIMEOUT_MS;
  const silent = async () => {
    if (!(await postgresAnswers(services))) silentAt = Date.now();
    return Date.now() - silentAt <= spanMs;
  };
  // The runtime refusing what a run handed it or asked for (refusedByRuntime):
  // no retry can mend that, so the run fails at once instead of repeating its work, and its replies.
  const refusals = new WeakSet<object>();
  // Agent failures the run logged before handing them to BullMQ's retries.
  const retried = new WeakSet<object>();
  const outage = async (err: object) => unreachable(err) || (unanswered(err) && await silent());
  const ours = async <T>(call: () => Promise<T>): Promise<T> => {
    try {
      return await call();
    } catch (err) {
      if (typeof err === 'object' && err) {
        if (await outage(err)) outages.add(err);
        else if (refusedByRuntime(err)) refusals.add(err);
      }
      throw err;
    }
  };

  return async function runAgentTask(job: Job<JobPayloads['agent-tasks']>, token?: string): Promise<string> {
    try {
      return await run(job, token);
    } catch (err) {
      if (!outages.has(err as object)) {
        // A fault of ours (a statement Postgres refused, a bug) outside the agent's run: BullMQ retries
        // it, and job recovery fails the task once it failed for good. Said here, or nowhere.
        if (!(err instanceof WaitingError) && !retried.has(err as object)) {
          log.error({ task_id: job.data.task_id, attempt: job.attemptsMade + 1, attempts: job.opts.attempts ?? 1, err }, 'agent run failed in the runtime');
        }
        throw err;
      }
      log.warn({ task_id: job.data.task_id, reason: publicReason(err) }, `Postgres or Redis is unavailable: the run goes back to the queue and runs pause ${OUTAGE_PAUSE_MS} ms`);
      // Pauses the queue on every worker; the job goes back to wait as it was. With Redis down the
      // pause cannot be set; the job goes back all the same (or, failing that, its lock expires).
      await services.queues['agent-tasks'].rateLimit(OUTAGE_PAUSE_MS).catch(() => undefined);
      throw new RateLimitError();
    }
  };

  async function run(job: Job<JobPayloads['agent-tasks']>, token?: string): Promise<string> {
    const { task_id: taskId, message_id: messageId } = job.data;
    const historyLimits = { limit: HISTORY, maxBytes: services.cfg.AGENT_HISTORY_MAX_BYTES };
    const begun = await ours(() => beginRun(services, taskId, messageId, historyLimits));
    if (!begun) return 'task gone';
    if (!begun.started) {
      if (isTerminal(begun.task.status)) return `task already ${begun.task.status}`;
      if (begun.answered) return 'already answered';
      // A re-run after a crash finds the task working under its own run and carries on; a run for
      // another message of the task ends.
      if (begun.task.status !== 'working') return 'task changed before start';
      if (!workingUnder(begun.task, messageId)) return 'another run has the task';
    }
    if (!begun.trigger) return 'message gone';
    // A re-run takes the task from the copy that may still run where the job stalled (or from the
    // attempt before, whose handler may have left writes going): that take's writes and end are
    // refused from now on.
    const attempt = begun.started ? begun.task.run_attempt ?? 0 : await ours(() => tasks.claimRun(services.db, taskId, messageId));
    if (attempt === undefined) return 'task changed before start';
    // A write of that take committed between the read above and the claim would be on the task but
    // not in the history: read again now that none can land (a start claims in the statement that reads).
    const state = begun.started ? begun : await ours(() => beginRun(services, taskId, messageId, historyLimits, { start: false }));
    if (!state?.trigger) return 'task changed before start';

    // A task has one run at a time: one of its runs still going here lost it to this one (or, for the
    // same message, is a stalled copy of this job that BullMQ gave up on).
    const previous = cancels.messageOf(taskId);
    if (previous !== undefined && cancels.cancel(taskId, 'task taken by another run', { superseded: true })) {
      log.info({ task_id: taskId }, previous === messageId ? 'agent run aborted: its job started again' : 'agent run aborted: task taken by another run');
    }
    const controller = cancels.register(taskId, messageId, attempt);
    // Registered after a shutdown aborted every run (its start waited on Postgres meanwhile): handed
    // back before its agent starts, not started only to be waited for. Registered after its task's
    // end was noted (a cancel committed since the start): its agent is not started.
    if (controller.signal.aborted) {
      cancels.release(taskId, controller);
      if (!(controller.signal.reason as { shutdown?: boolean }).shutdown) {
        log.info({ task_id: taskId }, 'agent run aborted before its agent started: task canceled');
        return 'task changed before start';
      }
      await job.moveToWait(token);
      throw new WaitingError();
    }
    // A run past AGENT_RUN_TIMEOUT_MS is aborted as a cancel aborts it, and fails the task at once:
    // another attempt would only hold a slot as long again.
    const limit = services.cfg.AGENT_RUN_TIMEOUT_MS;
    const timer = limit > 0
      ? setTimeout(() => controller.abort(Object.assign(new Error(`the run did not finish within AGENT_RUN_TIMEOUT_MS (${limit} ms)`), { timedOut: true })), limit)
      : undefined;
    const timedOut = () => controller.signal.aborted && !!(controller.signal.reason as { timedOut?: boolean } | undefined)?.timedOut;
    const runLog = log.child({ task_id: taskId });
    const maxMessageBytes = services.cfg.TASK_MESSAGES_MAX_BYTES;
    // The values the agent read: masked in its failure's reason, which its error may quote.
    const secretsRead = new Set<string>();
    const letGoOfSecretsRead = holdSecretsRead(secretsRead);
    const ctx = agentContext(services, ours, { taskId, messageId, attempt, state, trigger: state.trigger, signal: controller.signal, log: runLog, secretsRead });

    let running: Promise<AgentResult | void> | undefined;
    try {
      running = agent(ctx);
      const result = await Promise.race([running, abortedBy(controller.signal)]);
      clearTimeout(timer);
      const final = await ours(async () => {
        const out = finalOf(result);
        // Counts only grow: a message that does not fit beside the count at the run's start is refused
        // here, before it travels to Postgres; the statement checks against the count as it is then.
        checkRoom(taskId, 'message_bytes', Number(state.task.message_bytes ?? 0), tasks.messageBytes(out.message), maxMessageBytes);
        return out;
      });
      // Done running: from here the final write's compare-and-set decides, and a check that sees the
      // task leave working by this write does not take it for a client's doing.
      cancels.release(taskId, controller);
      const done = await ours(() => inStatement(services, (uow) => changeStatusIf(uow, taskId, final.status, runEndsFrom(final.status), final.message, { run: messageId, runAttempt: attempt, maxMessageBytes })));
      if (done) {
        metrics.count('taskbridge_agent_runs_total', { outcome: final.status });
        return final.status;
      }
      // Not written: the task ended or was taken meanwhile, or the message would take it over what it
      // may hold (the statement checks without a read; this read, on a miss only, tells which).
      await ours(async () => {
        const now = await tasks.getTask(services.db, taskId);
        if (now?.message_bytes != null && heldByTake(now, { messageId, attempt })) checkRoom(taskId, 'message_bytes', Number(now.message_bytes), tasks.messageBytes(final.message), maxMessageBytes);
      });
      return 'task ended or taken by another run during the run';
    } catch (caught) {
      const err = readable(caught);
      // A built-in agent's own statements (agents/own-store.ts) meeting an outage: as if ours had.
      const store = ownStoreFailure(err);
      if (store && await outage(store)) outages.add(err as object);
      if (outages.has(err as object)) throw err;
      // A refusal fails the run even when the worker is shutting down (another try would meet it again)
      // or the run was aborted meanwhile (failRun's compare-and-set leaves a task that moved on alone).
      const refused = refusals.has(err as object) || timedOut();
      if (!refused && forShutdown(controller.signal)) {
        // Handed back to the queue, once the agent has stopped, without using up an attempt: the run did not fail.
        if (running) await withTimeout(running, SHUTDOWN_WIND_DOWN_MS).catch(() => undefined);
        await job.moveToWait(token);
        throw new WaitingError();
      }
      // `err` is whatever the agent threw: null and undefined too.
      if (!refused && (controller.signal.aborted || (err as { taskEnded?: boolean } | null | undefined)?.taskEnded)) return 'aborted: task ended';
      const attempts = refused ? job.attemptsMade + 1 : (job.opts.attempts ?? 1);
      // A run that timed out failed for that, whatever its agent threw on the way out.
      const unmasked = failureReason(timedOut() ? controller.signal.reason : err);
      // Cut as the task's status message is: an agent's error may quote megabytes (a remote agent's
      // error page), which went whole into each attempt's log line and the job's failedReason and stack.
      const reason = cutReason(secretMasker([...secretsRead])(unmasked));
      if (job.attemptsMade + 1 < attempts) {
        log.warn({ task_id: taskId, attempt: job.attemptsMade + 1, attempts, reason }, 'agent run failed; it will be retried');
        // BullMQ keeps the error's message and stack: one that quotes a secret, or was cut, is not handed on.
        const thrown = err instanceof Error && reason === unmasked ? err : new Error(reason);
        retried.add(thrown);
        throw thrown;
      }
      const failed = await ours(() => inStatement(services, (uow) => failRun(uow, taskId, `The agent failed after ${attempts} attempt(s): ${reason}`, { run: messageId, runAttempt: attempt })));
      // Not written (null): the task had ended or was taken meanwhile; this run did not end it.
      if (failed) metrics.count('taskbridge_agent_runs_total', { outcome: 'failed' });
      log.warn({ task_id: taskId, attempts, reason }, 'agent run failed for good');
      return 'failed';
    } finally {
      clearTimeout(timer);
      // Whatever the handler left going (a call beside the one that failed) stops with the run.
      if (!controller.signal.aborted) controller.abort(new Error('the run is over'));
      cancels.release(taskId, controller);
      letGoOfSecretsRead();
    }
  }
}

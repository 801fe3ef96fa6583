// Periodic passes of every worker, each idempotent: recovery of work whose queue job Redis lost
// (key jobs: recover-key-jobs.ts; agent runs of submitted tasks and of answers to waiting ones, and runs whose job failed
// without ending their task: recover-agent-runs.ts; push deliveries: recover-push-deliveries.ts), the purge of OAuth brokering states abandoned
// long ago and of tasks past TASK_RETENTION_DAYS, and the agent's own passes (the remote agent's: remote tasks of canceled or failed tasks).
import type { Services } from '../domain/services.ts';
import { recoverLostKeyJobs } from './recover-key-jobs.ts';
import { AgentRunRecovery } from './recover-agent-runs.ts';
import { purgeExpiredBrokerStates } from '../domain/bridge/brokering.ts';
import { taskRetention } from '../domain/task-retention.ts';
import { recoverPushDeliveries } from './recover-push-deliveries.ts';
import { timerMs, withTimeout } from '../domain/with-timeout.ts';
import type { HousekeepingPass } from './agents/types.ts';

// `extra`: the agent's own passes (workers/agents/types.ts Agent). The stop starts no pass, tells
// those in flight, and waits for them for up to WORKER_SHUTDOWN_GRACE_MS, as for the jobs: closing the
// services under one would fail it midway. A pass still running then is interrupted (the task
// retention batch in flight rolls back) so that the worker closes within its stop budget
// (workerStopWithinMs, which the wait is started within) rather than exiting 1 at its end.
// `soon(name)` runs one of them SOON_MS from now besides (again once it ends, if it is running), for
// work that should not wait for the next pass.
export function startHousekeeping(services: Services, extra: Record<string, HousekeepingPass> = {}): Housekeeping {
  const every = services.cfg.JOB_RECOVERY_MS;
  const agentRuns = new AgentRunRecovery(services);
  const expiredTasks = taskRetention(services);
  const stopping = new AbortController();
  const interrupt = new AbortController();
  const passes: Record<string, HousekeepingPass> = {
    'key jobs': (signal) => recoverLostKeyJobs(services, every, signal),
    'agent runs': (signal) => agentRuns.pass(every, signal),
    'push deliveries': (signal) => recoverPushDeliveries(services, every, signal),
    'expired broker states': () => purgeExpiredBrokerStates(services),
    'tasks past retention': (signal) => expiredTasks({ stopping: signal, interrupt: interrupt.signal }),
  };
  for (const [name, pass] of Object.entries(extra)) passes[`agent: ${name}`] = pass;
  const running = new Map<string, Promise<unknown>>();
  const again = new Set<string>();
  const due = new Set<string>();
  const run = (what: string) => {
    if (stopping.signal.aborted) return;
    if (running.has(what)) {
      again.add(what);
      return;
    }
    running.set(what, passes[what](stopping.signal)
      .catch((err) => {
        const said = { err: { message: (err as Error).message }, what };
        if (interrupt.signal.aborted) services.log.info(said, 'housekeeping pass interrupted by the shutdown; what it had not committed rolled back');
        else services.log.warn(said, 'housekeeping pass failed; will retry');
      })
      .finally(() => {
        running.delete(what);
        if (again.delete(what)) run(what);
      }));
  };
  const timer = setInterval(() => {
    for (const what of Object.keys(passes)) if (!running.has(what)) run(what);
  }, every);
  timer.unref();
  const soon = (name: string) => {
    const what = `agent: ${name}`;
    if (!passes[what] || due.has(what) || stopping.signal.aborted) return;
    due.add(what);
    setTimeout(() => {
      due.delete(what);
      run(what);
    }, SOON_MS).unref();
  };
  const stop = async () => {
    clearInterval(timer);
    stopping.abort();
    if (!running.size) return;
    const withinMs = services.cfg.WORKER_SHUTDOWN_GRACE_MS;
    services.log.info({ passes: [...running.keys()], within_ms: withinMs }, 'worker shutting down: waiting for housekeeping passes in flight');
    const ended = Promise.allSettled(running.values());
    if (await withTimeout(ended, timerMs(withinMs)).then(() => true, () => false)) return;
    services.log.info({ passes: [...running.keys()] }, 'worker shutting down: interrupting housekeeping passes still running');
    interrupt.abort();
    // Each now ends with its current statement or call (the retention batch's connection is ended);
    // the services' close would wait for a statement in flight anyway.
    await ended;
  };
  return { stop, soon };
}

export interface Housekeeping {
  stop(): Promise<void>;
  /** Runs the agent's pass of that name SOON_MS from now, besides its turns (once however often asked meanwhile). */
  soon(name: string): void;
}

// A run of the canceled task going on elsewhere ends its remote task itself within this (the remote
// agent's cancel call takes 5 s at most) and forgets its row, so the pass does not ask again.
const SOON_MS = 6000;

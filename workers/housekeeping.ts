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

// `extra`: the agent's own passes (workers/agents/types.ts Agent). The stop starts no pass and
// resolves once the passes in flight have ended: closing the services under one (a retention pass
// runs for up to half of JOB_RECOVERY_MS) would fail it midway.
export function startHousekeeping(services: Services, extra: Record<string, () => Promise<unknown>> = {}): () => Promise<void> {
  const every = services.cfg.JOB_RECOVERY_MS;
  const agentRuns = new AgentRunRecovery(services);
  const expiredTasks = taskRetention(services);
  const passes: Record<string, () => Promise<unknown>> = {
    'key jobs': () => recoverLostKeyJobs(services, every),
    'agent runs': () => agentRuns.pass(every),
    'push deliveries': () => recoverPushDeliveries(services, every),
    'expired broker states': () => purgeExpiredBrokerStates(services),
    'tasks past retention': expiredTasks,
  };
  for (const [name, pass] of Object.entries(extra)) passes[`agent: ${name}`] = pass;
  const running = new Map<string, Promise<unknown>>();
  const timer = setInterval(() => {
    for (const [what, pass] of Object.entries(passes)) {
      if (running.has(what)) continue;
      running.set(what, pass()
        .catch((err) => services.log.warn({ err: { message: (err as Error).message }, what }, 'housekeeping pass failed; will retry'))
        .finally(() => running.delete(what)));
    }
  }, every);
  timer.unref();
  return async () => {
    clearInterval(timer);
    if (!running.size) return;
    services.log.info({ passes: [...running.keys()] }, 'worker shutting down: waiting for housekeeping passes in flight');
    await Promise.allSettled(running.values());
  };
}

// Periodic recovery of work whose queue job Redis lost: key jobs (recover-key-jobs.ts) and agent
// runs of submitted tasks (recover-agent-runs.ts). Every worker runs it; both are idempotent.
import type { Services } from '../domain/services.ts';
import { recoverLostKeyJobs } from './recover-key-jobs.ts';
import { AgentRunRecovery } from './recover-agent-runs.ts';

export function startJobRecovery(services: Services): () => void {
  const every = services.cfg.JOB_RECOVERY_MS;
  const agentRuns = new AgentRunRecovery(services);
  const passes: Record<string, () => Promise<unknown>> = {
    'key jobs': () => recoverLostKeyJobs(services, every),
    'agent runs': () => agentRuns.pass(every),
  };
  const running = new Set<string>();
  const timer = setInterval(() => {
    for (const [what, pass] of Object.entries(passes)) {
      if (running.has(what)) continue;
      running.add(what);
      pass()
        .catch((err) => services.log.warn({ err: { message: (err as Error).message }, what }, 'job recovery failed; will retry'))
        .finally(() => running.delete(what));
    }
  }, every);
  timer.unref();
  return () => clearInterval(timer);
}

// Says in Postgres which runs of this process are still going, every `everyMs`, so that job recovery
// (recover-agent-runs.ts) can tell a working task whose run goes on here from one whose queue job
// Redis lost (a flush or failover while the run waited for a retry, or while its worker died): only
// the second is enqueued again. Runs younger than `everyMs` need no mark: their start is recent.
import type { Services } from '../domain/services.ts';
import { markRunsSeen } from '../db/tasks.ts';
import type { CancelRegistry } from './cancel-registry.ts';

export function startRunHeartbeat(services: Pick<Services, 'db' | 'log'>, cancels: CancelRegistry, everyMs: number): () => void {
  let marking = false;
  const timer = setInterval(() => {
    const runs = cancels.runningFor(everyMs);
    if (marking || !runs.length) return;
    marking = true;
    markRunsSeen(services.db, runs)
      .catch((err: Error) => services.log.debug({ err: { message: err.message } }, 'runs not marked as going on; will retry'))
      .finally(() => { marking = false; });
  }, everyMs);
  timer.unref();
  return () => clearInterval(timer);
}

// Says in Postgres which runs of this process are still going, every `everyMs`, so that job recovery
// (recover-agent-runs.ts) can tell a working task whose run goes on here from one whose queue job
// Redis lost (a flush or failover while the run waited for a retry, or while its worker died): only
// the second is enqueued again. Runs younger than `everyMs` need no mark: their start is recent.
import type { Services } from '../domain/services.ts';
import { startHeartbeat } from '../domain/heartbeat.ts';
import { markRunsSeen } from '../db/tasks.ts';
import type { CancelRegistry } from './cancel-registry.ts';

export function startRunHeartbeat(services: Pick<Services, 'db' | 'log'>, cancels: CancelRegistry, everyMs: number): () => void {
  return startHeartbeat(
    () => {
      const runs = cancels.runningFor(everyMs);
      return runs.length ? markRunsSeen(services.db, runs) : undefined;
    },
    (err) => services.log.debug({ err: { message: err.message } }, 'runs not marked as going on; will retry'),
    { heartbeatMs: everyMs },
  );
}

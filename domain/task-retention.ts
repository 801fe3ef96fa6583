// TASK_RETENTION_DAYS: tasks that ended (completed, canceled, failed, rejected) longer ago than that
// are deleted with everything they hold, by a housekeeping pass of the workers (workers/housekeeping.ts).
// Tasks that have not ended are kept however old they are. 0 keeps every task.
import type { Services } from './services.ts';
import { purgeEndedTasks } from '../db/task-purge.ts';

const DAY_MS = 24 * 60 * 60 * 1000;
// Tasks per transaction: row locks and the cascade's work stay small enough not to hold up intake.
const BATCH = 1000;

// Deletes in batches until none are left or half of the housekeeping interval has gone, so that
// a backlog (retention just turned on) is worked off over several passes.
export async function purgeExpiredTasks(s: Pick<Services, 'db' | 'cfg' | 'log'>): Promise<number> {
  const days = s.cfg.TASK_RETENTION_DAYS;
  if (days === 0) return 0;
  const before = new Date(Date.now() - days * DAY_MS);
  const until = Date.now() + s.cfg.JOB_RECOVERY_MS / 2;
  let tasks = 0;
  let contexts = 0;
  for (;;) {
    const done = await purgeEndedTasks(s.db, before, BATCH);
    if (!done) break;
    tasks += done.tasks;
    contexts += done.contexts;
    if (done.tasks < BATCH || Date.now() >= until) break;
  }
  if (tasks) s.log.info({ tasks, contexts, retention_days: days }, 'ended tasks past their retention deleted');
  return tasks;
}

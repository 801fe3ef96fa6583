// TASK_RETENTION_DAYS: tasks that ended (completed, canceled, failed, rejected) longer ago than that
// are deleted with everything they hold, by a housekeeping pass of the workers (workers/housekeeping.ts).
// Tasks that have not ended are kept however old they are. 0 keeps every task.
import type { Services } from './services.ts';
import { purgeEndedTasks } from '../db/task-purge.ts';

const DAY_MS = 24 * 60 * 60 * 1000;
// Tasks per transaction at most: row locks and the cascade's work stay small enough not to hold up intake.
const MAX_BATCH = 1000;

// A statement Postgres canceled at DB_QUERY_TIMEOUT_MS, or the client gave up on.
const timedOut = (err: unknown) => (err as { code?: unknown })?.code === '57014' || /Query read timeout$/.test(String((err as Error)?.message ?? ''));

// The pass: deletes in batches until none are left or half of the housekeeping interval has gone,
// so that a backlog (retention just turned on) is worked off over several passes. Tasks holding many
// rows each can make a batch outlast DB_QUERY_TIMEOUT_MS; being the oldest, the same batch would come
// back every pass and stop the purge for good, so the batch halves until it fits, and grows back as
// batches go through.
export function taskRetention(s: Pick<Services, 'db' | 'cfg' | 'log'>): () => Promise<number> {
  let batch = MAX_BATCH;
  return async function purgeExpiredTasks() {
    const days = s.cfg.TASK_RETENTION_DAYS;
    if (days === 0) return 0;
    const before = new Date(Date.now() - days * DAY_MS);
    const until = Date.now() + s.cfg.JOB_RECOVERY_MS / 2;
    let tasks = 0;
    let contexts = 0;
    try {
      while (Date.now() < until) {
        let done: Awaited<ReturnType<typeof purgeEndedTasks>>;
        try {
          done = await purgeEndedTasks(s.db, before, batch);
        } catch (err) {
          if (!timedOut(err) || batch === 1) throw err;
          batch = Math.ceil(batch / 2);
          s.log.info({ batch }, 'task retention: a batch took too long; trying fewer tasks at a time');
          continue;
        }
        if (!done) break;
        tasks += done.tasks;
        contexts += done.contexts;
        if (done.tasks < batch) break;
        batch = Math.min(MAX_BATCH, batch * 2);
      }
    } finally {
      if (tasks) s.log.info({ tasks, contexts, retention_days: days }, 'ended tasks past their retention deleted');
    }
    return tasks;
  };
}

// TASK_RETENTION_DAYS: tasks that ended (completed, canceled, failed, rejected) longer ago than that
// are deleted with everything they hold, by a housekeeping pass of the workers (workers/housekeeping.ts).
// Tasks that have not ended are kept however old they are. 0 keeps every task.
import type { Services } from './services.ts';
import { statementTimedOut } from './errors.ts';
import { purgeEndedTasks, thinNextEndedTask } from '../db/task-purge.ts';

const DAY_MS = 24 * 60 * 60 * 1000;
// Tasks per transaction at most: row locks and the cascade's work stay small enough not to hold up intake.
const MAX_BATCH = 1000;
// Passes without a timed-out batch before the batch may double again (once a pass): a size that
// failed is not tried again at every batch, each try costing a batch timeout of rolled-back work.
const GROW_AFTER_PASSES = 10;
// Rows per statement when a single task is too large to delete at once: at most, and at least (a
// chunk that times out halves, down to the least).
const THIN_CHUNK = 2000;
const THIN_CHUNK_MIN = 50;

// The pass: deletes in batches until none are left or half of the housekeeping interval has gone,
// so that a backlog (retention just turned on) is worked off over several passes. Tasks holding many
// rows each can make a batch outlast its timeout; being the oldest, the same batch would come back
// every pass and stop the purge for good, so the batch halves until it fits, and a single task that
// does not fit is thinned first. The batch timeout is DB_QUERY_TIMEOUT_MS, at most the pass's own
// time: with no statement timeout (DB_QUERY_TIMEOUT_MS=0) a batch would otherwise never time out, and
// every one would be 1,000 tasks in one transaction however much they hold; the thinning's statements
// have the same timeout. A worker that stops (`stopping`) gets no further batch nor thinning chunk,
// what was deleted so far staying deleted; `interrupt` ends the batch or chunk in flight, which rolls back.
export interface RetentionStop { stopping: AbortSignal; interrupt: AbortSignal }
export function taskRetention(s: Pick<Services, 'db' | 'cfg' | 'log'>): (stop: RetentionStop) => Promise<number> {
  const batchTimeoutMs = Math.floor(Math.min(s.cfg.DB_QUERY_TIMEOUT_MS || Infinity, s.cfg.JOB_RECOVERY_MS / 2));
  let batch = MAX_BATCH;
  let thinChunk = THIN_CHUNK;
  let calmPasses = 0;
  return async function purgeExpiredTasks(stop: RetentionStop) {
    const days = s.cfg.TASK_RETENTION_DAYS;
    if (days === 0) return 0;
    if (++calmPasses > GROW_AFTER_PASSES) {
      batch = Math.min(MAX_BATCH, batch * 2);
      thinChunk = Math.min(THIN_CHUNK, thinChunk * 2);
    }
    const before = new Date(Date.now() - days * DAY_MS);
    const until = Date.now() + s.cfg.JOB_RECOVERY_MS / 2;
    let tasks = 0;
    let contexts = 0;
    try {
      while (Date.now() < until && !stop.stopping.aborted) {
        let done: Awaited<ReturnType<typeof purgeEndedTasks>>;
        try {
          done = await purgeEndedTasks(s.db, before, batch, batchTimeoutMs, stop.interrupt);
        } catch (err) {
          if (!statementTimedOut(err)) throw err;
          calmPasses = 0;
          if (batch > 1) {
            batch = Math.ceil(batch / 2);
            s.log.info({ batch }, 'task retention: a batch took too long; trying fewer tasks at a time');
            continue;
          }
          let rows: number;
          try {
            rows = await thinNextEndedTask(s.db, before, thinChunk, batchTimeoutMs, stop);
          } catch (thinErr) {
            if (!statementTimedOut(thinErr) || thinChunk <= THIN_CHUNK_MIN) throw thinErr;
            thinChunk = Math.ceil(thinChunk / 2);
            continue;
          }
          if (rows) s.log.info({ rows }, 'task retention: a task too large to delete at once was thinned first');
          else if (!stop.stopping.aborted) throw err;
          continue;
        }
        if (!done) break;
        tasks += done.tasks;
        contexts += done.contexts;
        if (done.tasks < batch) break;
      }
    } finally {
      if (tasks) s.log.info({ tasks, contexts, retention_days: days }, 'ended tasks past their retention deleted');
    }
    return tasks;
  };
}

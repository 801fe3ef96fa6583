// Aborts the runs of this process whose task has ended elsewhere (canceled through the API, failed
// by job recovery). A note on Redis does it at once; a check in Postgres every CHECK_MS catches the
// notes that never came (Redis down or reconnecting when the task ended, an API process gone between
// its commit and the note), so a run learns of its task's end within about a second either way; a
// note that came before its run registered is kept for it (cancel-registry.ts). The
// check also aborts a run whose task is no longer working under it: a client set it waiting for
// input (and may have answered, so that another run, on any worker, has it), and a run whose job was
// taken again (its worker stalled past the job's lock) by another worker, which holds the task now.
import type { Services } from '../domain/services.ts';
import { TASK_CANCELED } from '../domain/tasks.ts';
import { CLIENT_RUN, heldByTake, isTerminal, workingUnder } from '../domain/task-states.ts';
import { runHolders } from '../db/tasks.ts';
import type { CancelRegistry, RunningRun } from './cancel-registry.ts';

const CHECK_MS = 500;

/** Aborts those of `runs` whose task has ended, or is no longer working under their take. */
async function checkRuns(services: Pick<Services, 'db' | 'log'>, cancels: CancelRegistry, runs: readonly RunningRun[]): Promise<void> {
  const { db, log } = services;
  const runOf = new Map(runs.map((r) => [r.taskId, r]));
  for (const task of await runHolders(db, [...runOf.keys()])) {
    const { messageId, attempt } = runOf.get(task.id)!;
    if (isTerminal(task.status)) {
      if (cancels.cancel(task.id, `task ${task.status}`, { messageId, attempt })) log.info({ task_id: task.id, status: task.status }, `agent run aborted: task ${task.status}`);
    } else if (!heldByTake(task, { messageId, attempt })) {
      const why = task.status !== 'working' ? `task set ${task.status}`
        : task.run_message_id === CLIENT_RUN ? 'task taken by a client'
          : workingUnder(task, messageId) ? 'its job taken again elsewhere' : 'task taken by another run';
      if (cancels.cancel(task.id, why, { messageId, attempt, superseded: true })) log.info({ task_id: task.id, status: task.status }, `agent run aborted: ${why}`);
    }
  }
}

/** `elsewhere`: told of a task ended with no run of it in this process (a run elsewhere, or none going). */
export async function watchCancels(services: Pick<Services, 'db' | 'bus' | 'log'>, cancels: CancelRegistry, elsewhere: () => void): Promise<() => Promise<void>> {
  const { bus, log } = services;
  const unsubscribe = await bus.subscribe(TASK_CANCELED, (msg) => {
    if (typeof msg.task_id !== 'string') return;
    if (cancels.taskEnded(msg.task_id)) log.info({ task_id: msg.task_id, status: 'canceled' }, 'agent run aborted: task canceled');
    else elsewhere();
  });

  let checking = false;
  // Every run, however young: one canceled in its first CHECK_MS whose note was lost would otherwise
  // first be checked at up to twice that. One query by primary key for the runs of this worker.
  const check = async () => {
    const runs = cancels.runningFor(0);
    if (checking || !runs.length) return;
    checking = true;
    try {
      await checkRuns(services, cancels, runs);
    } catch (err) {
      log.debug({ err: { message: (err as Error).message } }, 'ended tasks not checked; will retry');
    } finally {
      checking = false;
    }
  };
  const timer = setInterval(() => void check(), CHECK_MS);
  timer.unref();
  return async () => {
    clearInterval(timer);
    await unsubscribe().catch(() => undefined);
  };
}

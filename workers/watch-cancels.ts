// Aborts the runs of this process whose task has ended elsewhere (canceled through the API, failed
// by job recovery). A note on Redis does it at once; a check in Postgres every CHECK_MS catches the
// notes that never came (Redis down or reconnecting when the task ended, an API process gone between
// its commit and the note), so a run learns of its task's end within about a second either way. The
// check also aborts a run whose task is no longer working under it: a client set it waiting for
// input (and may have answered, so that another run, on any worker, has it), and a run whose job was
// taken again (its worker stalled past the job's lock) by another worker, which holds the task now.
import type { Services } from '../domain/services.ts';
import { TASK_CANCELED } from '../domain/tasks.ts';
import { CLIENT_RUN, heldByTake, isTerminal, workingUnder } from '../domain/task-states.ts';
import { runHolders } from '../db/tasks.ts';
import type { CancelRegistry } from './cancel-registry.ts';

const CHECK_MS = 500;

export async function watchCancels(services: Pick<Services, 'db' | 'bus' | 'log'>, cancels: CancelRegistry): Promise<() => Promise<void>> {
  const { db, bus, log } = services;
  const abort = (taskId: string, status = 'canceled') => {
    if (cancels.cancel(taskId, `task ${status}`)) log.info({ task_id: taskId, status }, `agent run aborted: task ${status}`);
  };
  const unsubscribe = await bus.subscribe(TASK_CANCELED, (msg) => {
    if (typeof msg.task_id === 'string') abort(msg.task_id);
  });

  let checking = false;
  // Runs younger than CHECK_MS are left to the note: a busy worker's many short runs cost no query.
  const check = async () => {
    const runs = cancels.runningFor(CHECK_MS);
    if (checking || !runs.length) return;
    checking = true;
    try {
      const runOf = new Map(runs.map((r) => [r.taskId, r]));
      for (const task of await runHolders(db, [...runOf.keys()])) {
        const { messageId, attempt } = runOf.get(task.id)!;
        if (isTerminal(task.status)) abort(task.id, task.status);
        else if (!heldByTake(task, { messageId, attempt })) {
          const why = task.status !== 'working' ? `task set ${task.status}`
            : task.run_message_id === CLIENT_RUN ? 'task taken by a client'
              : workingUnder(task, messageId) ? 'its job taken again elsewhere' : 'task taken by another run';
          if (cancels.cancel(task.id, why, { messageId, attempt, superseded: true })) log.info({ task_id: task.id, status: task.status }, `agent run aborted: ${why}`);
        }
      }
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

// Runs nobody will finish. A run's job id is its trigger message id, so a worker can tell, for a
// task that has not moved for a while:
// - submitted, waiting for input with an answer, or working under a run no worker says goes on
//   (run-heartbeat.ts; not a task a client set working after its run), whose run message has
//   neither an unsent outbox row nor a BullMQ job: Redis lost the job (a failover, a flush, no
//   persistence), perhaps while it waited for a retry or its worker died. The run is enqueued
//   again under the same id (several workers add one; a task never has two runs,
//   workers/run-agent-task.ts; a working task's run carries on where it was). A long backlog is no
//   loss: its jobs exist.
// - submitted, waiting with an answer, or working, whose run job has failed: the job ended without
//   its processor's own final handling (it stalled too often, or the failure could not be written).
//   The task fails, saying so.
// Passes walk the candidates in pages, so a large backlog is checked piece by piece.
import type { Services } from '../domain/services.ts';
import { clearStaleRunDue, listRunsToCheck } from '../db/tasks.ts';
import { pendingOutboxIds } from '../db/outbox.ts';
import { failLostRun } from './fail-run.ts';

const PAGE = 500;

export class AgentRunRecovery {
  private after?: { created_at: Date; task_id: string };

  constructor(private readonly services: Services) {}

  /** Checks the next page of candidates at least `olderThanMs` old, until `stopping`; returns the task ids whose run was enqueued again or failed. */
  async pass(olderThanMs: number, stopping: AbortSignal): Promise<string[]> {
    const { db, queues, redis, log } = this.services;
    if (!this.after) await clearStaleRunDue(db);
    const page = await listRunsToCheck(db, olderThanMs, this.after, PAGE);
    // The next pass continues after this page, or starts over after the last one.
    this.after = page.length === PAGE ? page[PAGE - 1] : undefined;
    if (!page.length) return [];
    const queue = queues['agent-tasks'];
    const pending = await pendingOutboxIds(db, page.map((r) => r.message_id));
    const unsent = page.filter((r) => !pending.has(r.message_id));
    // A job of any state has its hash at toKey(id); a failed one is in the failed set. The queues share this
    // Redis connection. Its reason is read here too: asked for after the task's failure has committed, a
    // Redis gone meanwhile would fail the pass and lose the line.
    const pipeline = redis.pipeline();
    for (const r of unsent) pipeline.exists(queue.toKey(r.message_id)).zscore(queue.keys.failed, r.message_id).hget(queue.toKey(r.message_id), 'failedReason');
    const replies = (await pipeline.exec()) ?? [];
    const handled: string[] = [];
    for (const [i, r] of unsent.entries()) {
      if (stopping.aborted) break;
      const [exists, failedAt, reason] = [replies[3 * i]?.[1], replies[3 * i + 1]?.[1], replies[3 * i + 2]?.[1]];
      if (exists === 0 && r.resumable) {
        await queue.add('run', { task_id: r.task_id, message_id: r.message_id }, { jobId: r.message_id });
        log.warn({ task_id: r.task_id, message_id: r.message_id }, 'agent run had no queue job: enqueued again');
        handled.push(r.task_id);
      } else if (typeof failedAt === 'string') {
        if (await failLostRun(this.services, r.task_id, r.message_id, 'its queue job failed without ending the task')) {
          log.warn({ task_id: r.task_id, message_id: r.message_id, reason: reason ?? undefined }, 'agent run job had failed with its task unfinished: task failed');
          handled.push(r.task_id);
        }
      }
    }
    return handled;
  }
}

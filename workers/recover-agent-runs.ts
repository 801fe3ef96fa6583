// Tasks whose run job Redis lost (a failover, a flush, no persistence) would stay submitted, or
// waiting for input with an answer nobody runs, for ever. A run's job id is its trigger message id,
// so a worker can tell: a task still submitted after a while whose first user message, or a task
// waiting for input whose first user message since has neither an unsent outbox row nor a BullMQ
// job, gets its run enqueued again under the same id (several workers add one; a task never has
// two runs, workers/run-agent-task.ts). A long backlog is no loss: its jobs exist. Passes walk the
// candidates in pages, so a large backlog is checked piece by piece.
import type { Services } from '../domain/services.ts';
import { listUnstartedRuns, type UnstartedRun } from '../db/tasks.ts';
import { pendingOutboxIds } from '../db/outbox.ts';

const PAGE = 500;

export class AgentRunRecovery {
  private after?: { created_at: Date; task_id: string };

  constructor(private readonly services: Services) {}

  /** Checks the next page of candidates at least `olderThanMs` old; returns the task ids whose run was enqueued again. */
  async pass(olderThanMs: number): Promise<string[]> {
    const { db, queues, redis, log } = this.services;
    const page = await listUnstartedRuns(db, olderThanMs, this.after, PAGE);
    // The next pass continues after this page, or starts over after the last one.
    this.after = page.length === PAGE ? page[PAGE - 1] : undefined;
    if (!page.length) return [];
    const queue = queues['agent-tasks'];
    const pending = await pendingOutboxIds(db, page.map((r) => r.message_id));
    const unsent = page.filter((r) => !pending.has(r.message_id));
    // A job of any state has its hash at toKey(id); the queues share this Redis connection.
    const pipeline = redis.pipeline();
    for (const r of unsent) pipeline.exists(queue.toKey(r.message_id));
    const exists = (await pipeline.exec()) ?? [];
    const lost: UnstartedRun[] = unsent.filter((_, i) => exists[i]?.[1] === 0);
    for (const r of lost) {
      await queue.add('run', { task_id: r.task_id, message_id: r.message_id }, { jobId: r.message_id });
      log.warn({ task_id: r.task_id, message_id: r.message_id }, 'agent run had no queue job: enqueued again');
    }
    return lost.map((r) => r.task_id);
  }
}

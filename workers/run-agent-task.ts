// Processor of the agent-tasks queue: runs (or continues) one task's agent. Every step is safe
// to repeat: a job re-run after a crash skips work already committed.
import type { Job } from 'bullmq';
import { randomUUID } from 'node:crypto';
import type { Services } from '../domain/services.ts';
import type { JobPayloads } from '../queues/names.ts';
import * as tasks from '../db/tasks.ts';
import * as messages from '../db/messages.ts';
import { appendArtifact, appendMessage, changeStatus } from '../domain/tasks.ts';
import { inTransaction } from '../domain/unit-of-work.ts';
import { isTerminal } from '../domain/task-states.ts';
import type { MessagePart } from '../api/schemas/task.ts';
import type { AgentContext, AgentHandler, Reply } from './agents/types.ts';
import type { CancelRegistry } from './cancel-registry.ts';

const HISTORY = 200;
const toParts = (r: Reply): MessagePart[] => (typeof r === 'string' ? [{ type: 'text-part', text: r }] : r);

export function createAgentTaskProcessor(services: Services, agent: AgentHandler, cancels: CancelRegistry, readSecret: (key: string) => Promise<string>) {
  const { db, log } = services;

  return async function runAgentTask(job: Job<JobPayloads['agent-tasks']>): Promise<string> {
    const { task_id: taskId, message_id: messageId } = job.data;
    const task = await tasks.getTask(db, taskId);
    if (!task) return 'task gone';
    if (isTerminal(task.status)) return `task already ${task.status}`;
    const trigger = await messages.getMessageRow(db, messageId);
    if (!trigger) return 'message gone';
    if (await messages.hasAgentMessageAfter(db, taskId, trigger.seq)) return 'already answered';

    const started = await inTransaction(services, async (uow) => {
      const locked = (await tasks.getTask(uow.trx, taskId, true))!;
      if (isTerminal(locked.status)) return null;
      return locked.status === 'working' ? tasks.toTask(locked) : changeStatus(uow, locked, 'working');
    });
    if (!started) return 'task ended before start';

    const controller = cancels.register(taskId);
    const history = (await messages.recentMessages(db, taskId, HISTORY)).map(({ seq: _s, ...m }) => m);
    const { seq: _seq, ...message } = trigger;

    // Writes from inside a run are skipped once the task has ended (e.g. canceled meanwhile).
    const whileActive = <T>(fn: (uow: Parameters<Parameters<typeof inTransaction>[1]>[0], task: tasks.TaskRow) => Promise<T>) =>
      inTransaction(services, async (uow) => {
        const locked = (await tasks.getTask(uow.trx, taskId, true))!;
        if (isTerminal(locked.status)) throw Object.assign(new Error(`task is ${locked.status}`), { taskEnded: true });
        return fn(uow, locked);
      });

    const ctx: AgentContext = {
      task: started,
      history,
      message,
      signal: controller.signal,
      reply: async (r) => (await whileActive((uow) => appendMessage(uow, taskId, { role: 'agent', parts: toParts(r) }))).message,
      setStatus: async (status, r) => {
        await whileActive((uow, locked) => changeStatus(uow, locked, status, r === undefined ? undefined : { role: 'agent', parts: toParts(r) }));
      },
      emitArtifact: async (artifact) => {
        await whileActive((uow) => appendArtifact(uow, taskId, { artifactId: artifact.artifactId ?? randomUUID(), ...artifact }));
      },
      readSecret,
      log: log.child({ task_id: taskId }),
    };

    try {
      const result = (await agent(ctx)) ?? {};
      const final = result.status ?? 'completed';
      const reply = result.message === undefined ? undefined : { role: 'agent' as const, parts: toParts(result.message) };
      const outcome = await inTransaction(services, async (uow) => {
        const locked = (await tasks.getTask(uow.trx, taskId, true))!;
        if (isTerminal(locked.status)) return `task ${locked.status} during run`;
        await changeStatus(uow, locked, final, reply ?? { role: 'agent', parts: [{ type: 'text-part', text: `Task ${final}` }] });
        return final;
      });
      return outcome;
    } catch (err) {
      if (controller.signal.aborted && (controller.signal.reason as { shutdown?: boolean })?.shutdown) throw err;
      if (controller.signal.aborted || (err as { taskEnded?: boolean }).taskEnded) return 'aborted: task ended';
      const attempts = job.opts.attempts ?? 1;
      if (job.attemptsMade + 1 < attempts) throw err;
      const reason = (err as Error)?.message ?? String(err);
      await inTransaction(services, async (uow) => {
        const locked = (await tasks.getTask(uow.trx, taskId, true))!;
        if (isTerminal(locked.status)) return;
        await changeStatus(uow, locked, 'failed', { role: 'agent', parts: [{ type: 'text-part', text: `The agent failed after ${attempts} attempt(s): ${reason}` }] });
      });
      log.warn({ task_id: taskId, attempts, reason }, 'agent run failed for good');
      return 'failed';
    } finally {
      cancels.release(taskId, controller);
    }
  };
}

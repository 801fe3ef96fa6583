// Processor of the agent-tasks queue: runs (or continues) one task's agent. Every step is safe
// to repeat: a job re-run after a crash skips work already committed.
import { WaitingError, type Job } from 'bullmq';
import { randomUUID } from 'node:crypto';
import type { Services } from '../domain/services.ts';
import { publicReason } from '../domain/errors.ts';
import type { JobPayloads } from '../queues/names.ts';
import * as tasks from '../db/tasks.ts';
import { appendArtifact, appendMessage, beginRun, changeStatus, changeStatusIf } from '../domain/tasks.ts';
import { inStatement, inTransaction } from '../domain/unit-of-work.ts';
import { allowedFrom, isTerminal, type TaskState } from '../domain/task-states.ts';
import type { MessagePart } from '../api/schemas/task.ts';
import type { AgentContext, AgentHandler, Reply } from './agents/types.ts';
import type { CancelRegistry } from './cancel-registry.ts';
import { readSecretValue } from '../domain/secrets.ts';
import { invokeFunction } from '../domain/bridge/functions.ts';

const HISTORY = 200;
// A run's final status applies only while the task is still active.
const activeFrom = (to: TaskState) => allowedFrom(to).filter((s) => !isTerminal(s));
const toParts = (r: Reply): MessagePart[] => (typeof r === 'string' ? [{ type: 'text-part', text: r }] : r);

export function createAgentTaskProcessor(services: Services, agent: AgentHandler, cancels: CancelRegistry) {
  const { log } = services;

  return async function runAgentTask(job: Job<JobPayloads['agent-tasks']>, token?: string): Promise<string> {
    const { task_id: taskId, message_id: messageId } = job.data;
    const state = await beginRun(services, taskId, messageId, HISTORY);
    if (!state) return 'task gone';
    if (!state.started) {
      if (isTerminal(state.task.status)) return `task already ${state.task.status}`;
      if (state.answered) return 'already answered';
      if (state.task.status !== 'working') return 'task changed before start';
      // A re-run after a crash finds the task working under its own run and carries on; a run for
      // another message of the task ends (tasks from before migration 0009 name no run).
      if (state.task.run_message_id && state.task.run_message_id !== messageId) return 'another run has the task';
    }
    if (!state.trigger) return 'message gone';
    const started = tasks.toTask(state.task);

    const controller = cancels.register(taskId);
    const history = state.history.map(({ seq: _s, ...m }) => m);
    const { seq: _seq, ...message } = state.trigger;

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
      readSecret: (key) => readSecretValue(services, key),
      invokeFunction: (providerInstanceId, functionTypeId, params) => invokeFunction(services, providerInstanceId, functionTypeId, params),
      log: log.child({ task_id: taskId }),
    };

    try {
      const result = (await agent(ctx)) ?? {};
      const final = result.status ?? 'completed';
      const reply = result.message === undefined ? undefined : { role: 'agent' as const, parts: toParts(result.message) };
      const done = await inStatement(services, (uow) =>
        changeStatusIf(uow, taskId, final, activeFrom(final), reply ?? { role: 'agent', parts: [{ type: 'text-part', text: `Task ${final}` }] }));
      return done ? final : 'task ended during run';
    } catch (err) {
      if (controller.signal.aborted && (controller.signal.reason as { shutdown?: boolean })?.shutdown) {
        // Handed back to the queue at once without using up an attempt: the run did not fail.
        await job.moveToWait(token);
        throw new WaitingError();
      }
      if (controller.signal.aborted || (err as { taskEnded?: boolean }).taskEnded) return 'aborted: task ended';
      const attempts = job.opts.attempts ?? 1;
      if (job.attemptsMade + 1 < attempts) throw err;
      const reason = publicReason(err);
      await inStatement(services, (uow) => changeStatusIf(uow, taskId, 'failed', activeFrom('failed'),
        { role: 'agent', parts: [{ type: 'text-part', text: `The agent failed after ${attempts} attempt(s): ${reason}` }] }));
      log.warn({ task_id: taskId, attempts, reason }, 'agent run failed for good');
      return 'failed';
    } finally {
      cancels.release(taskId, controller);
    }
  };
}

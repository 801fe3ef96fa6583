// A cancel that commits between a run's start and its registration in the worker (workers/
// cancel-registry.ts): its note on Redis finds no run yet. The window is a statement's answer wide,
// so it is held open here in-process: the run's start statement answers only once the cancel has
// committed and its note has been read.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Worker } from 'bullmq';
import { resetDb, testDb, testEnv, waitFor } from './helpers/stack.ts';
import { loadConfig } from '../domain/config.ts';
import { createServices, type Services } from '../domain/services.ts';
import { TaskWaiter } from '../domain/task-waiter.ts';
import { cancelTask, sendMessage } from '../domain/a2a/methods.ts';
import { createRedis } from '../queues/connection.ts';
import { WorkerMetrics } from '../queues/worker-metrics.ts';
import { CancelRegistry } from '../workers/cancel-registry.ts';
import { watchCancels } from '../workers/watch-cancels.ts';
import { createAgentTaskProcessor } from '../workers/run-agent-task.ts';
import type { AgentHandler } from '../workers/agents/types.ts';

describe('a cancel noted before its run registered', () => {
  let api: Services;
  let worker: Services;
  let bull: Worker;
  let stopWatching: () => Promise<void>;
  const cancels = new CancelRegistry();
  const origQuery = pg.Client.prototype.query;
  // Runs once, after the run start's statement has committed and before its answer reaches the run.
  let afterStart: (() => Promise<void>) | undefined;
  let notesWithoutRun = 0;
  const started: { signalAborted: boolean }[] = [];
  const outcomes: string[] = [];

  before(async () => {
    await resetDb();
    const env = { ...testEnv(), LOG_LEVEL: 'silent' };
    api = createServices(loadConfig(env), 'api');
    worker = createServices(loadConfig(env), 'worker');
    stopWatching = await watchCancels(worker, cancels, () => { notesWithoutRun += 1; });
    (pg.Client.prototype as any).query = function (this: unknown, config: any, ...rest: any[]) {
      const text = typeof config === 'string' ? config : config?.text;
      const result = (origQuery as any).call(this, config, ...rest);
      if (afterStart && typeof text === 'string' && text.includes('run_due_message_id = null, run_seen_at')) {
        const h = afterStart;
        afterStart = undefined;
        return result.then(async (r: unknown) => { await h(); return r; });
      }
      return result;
    };
    const agent: AgentHandler = async (ctx) => {
      started.push({ signalAborted: ctx.signal.aborted });
      // As an agent that makes one call at its start: it waits for nothing but its signal after.
      await new Promise((resolve) => ctx.signal.aborted ? resolve(undefined) : ctx.signal.addEventListener('abort', resolve, { once: true }));
    };
    const processor = createAgentTaskProcessor(worker, agent, cancels, new WorkerMetrics(worker.redis, worker.cfg.QUEUE_PREFIX));
    bull = new Worker('agent-tasks', processor, { connection: createRedis(worker.cfg.REDIS_URL, 'worker'), prefix: worker.cfg.QUEUE_PREFIX });
    bull.on('completed', (_job, out: string) => outcomes.push(out));
  });

  after(async () => {
    (pg.Client.prototype as any).query = origQuery;
    await bull?.close();
    await stopWatching?.();
    await worker?.close();
    await api?.close();
  });

  it('does not start the agent: the run ends before it, and the task stays canceled with nothing after', async () => {
    const call = { services: api, waiter: new TaskWaiter(api.bus, api.log), signal: new AbortController().signal };
    let canceledBeforeRegister = false;
    let taskId = '';
    const notesBefore = notesWithoutRun;
    afterStart = async () => {
      await waitFor(async () => taskId !== '', 'the send to answer');
      await cancelTask(call, { id: taskId });
      await waitFor(async () => notesWithoutRun > notesBefore, 'the cancel note to find no run');
      canceledBeforeRegister = cancels.messageOf(taskId) === undefined;
    };
    const message = { kind: 'message' as const, messageId: randomUUID(), role: 'user' as const, parts: [{ kind: 'text' as const, text: 'hello' }] };
    const task = await sendMessage(call, { message: { ...message }, configuration: { blocking: false } });
    taskId = task.id;
    await waitFor(async () => outcomes.length > 0, 'the run to end');
    assert.ok(canceledBeforeRegister, 'the note came before the run registered');
    assert.deepEqual(started, [], 'the agent was started for a canceled task');
    assert.deepEqual(outcomes, ['task changed before start']);
    const row = await testDb()('tasks').where({ id: taskId }).first();
    assert.equal(row.status, 'canceled');
    const items = await testDb()('timeline_items').where({ task_id: taskId }).orderBy('seq');
    assert.deepEqual(items.map((i: { event_payload: { type: string; status?: string } }) => i.event_payload.status ?? i.event_payload.type), ['message', 'submitted', 'working', 'canceled']);
  });
});

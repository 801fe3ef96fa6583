// An open A2A stream lets go of its task's snapshot, and of each event, once it has handed it over. A stream may stay
// open for as long as its task runs, and each holding its snapshot (up to 8 MiB of history and 16 MiB
// of artifacts), a key's 100 open streams on a large task held gigabytes of the API's memory.
// Called in-process, as the API's route calls them, to see with a WeakRef what the stream holds.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setImmediate as nextTurn } from 'node:timers/promises';
import v8 from 'node:v8';
import vm from 'node:vm';
import { resetDb, testEnv } from './helpers/stack.ts';
import { loadConfig } from '../domain/config.ts';
import { createServices, type Services } from '../domain/services.ts';
import { TaskWaiter } from '../domain/task-waiter.ts';
import { addMessage } from '../domain/tasks.ts';
import { resubscribe, sendMessage, streamMessage, type A2ACall, type TaskStream } from '../domain/a2a/methods.ts';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const bigMessage = () => ({ kind: 'message' as const, messageId: randomUUID(), role: 'user' as const, parts: [{ kind: 'text' as const, text: 'x'.repeat(1_000_000) }] });

describe('A2A streams let go of what they sent', () => {
  let services: Services;
  let waiter: TaskWaiter;

  before(async () => {
    await resetDb();
    services = createServices(loadConfig({ ...testEnv(), LOG_LEVEL: 'silent' }), 'api');
    waiter = new TaskWaiter(services.bus, services.log);
  });
  after(async () => {
    await services?.close();
  });

  // The stream opened, its first event (the snapshot) taken and the next asked for, which waits for
  // the task to move: what the stream still holds then, it holds for as long as it stays open.
  async function openAndIdle(open: () => Promise<TaskStream>) {
    const stream = await open();
    const first = await stream.next();
    assert.equal((first.value as { kind: string }).kind, 'task');
    const snapshot = new WeakRef(first.value as object);
    return { snapshot, stream, next: stream.next() as Promise<IteratorResult<unknown>> };
  }

  it('message/stream and tasks/resubscribe on a task that goes on (no worker runs it)', async () => {
    const client = new AbortController();
    const call: A2ACall = { services, waiter, signal: client.signal };
    const task = await sendMessage(call, { message: bigMessage(), configuration: { blocking: false } });
    const open = [
      await openAndIdle(() => resubscribe(call, { id: task.id })),
      await openAndIdle(() => streamMessage(call, { message: bigMessage() })),
    ];
    // A new job: a WeakRef's target is kept for the job that made it.
    await nextTurn();
    gc();
    await nextTurn();
    assert.deepEqual(open.map((o) => o.snapshot.deref() === undefined), [true, true], 'each stream let go of its snapshot (resubscribe, message/stream)');
    client.abort();
    for (const o of open) assert.equal((await o.next).done, true);
  });

  it('an event it streamed once its task has moved on, the stream waiting again', async () => {
    const client = new AbortController();
    const call: A2ACall = { services, waiter, signal: client.signal };
    const task = await sendMessage(call, { message: bigMessage(), configuration: { blocking: false } });
    const open = await openAndIdle(() => resubscribe(call, { id: task.id }));
    await addMessage(services, task.id, { role: 'agent', parts: [{ type: 'text-part', text: 'y'.repeat(1_000_000) }] });
    const event = await takeNext(open);
    await nextTurn();
    gc();
    await nextTurn();
    assert.equal(event.deref(), undefined, 'the stream let go of the message it sent');
    client.abort();
    assert.equal((await open.next).done, true);
  });
});

// The event a stream's pending next() resolves to (a message), then held only by a WeakRef: the
// next one is asked for in its place (a settled promise holds its value).
async function takeNext(open: { stream: TaskStream; next: Promise<IteratorResult<unknown>> }): Promise<WeakRef<object>> {
  const result = await open.next;
  open.next = open.stream.next();
  assert.equal((result.value as { kind: string }).kind, 'message');
  return new WeakRef(result.value as object);
}

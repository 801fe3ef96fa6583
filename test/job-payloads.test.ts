// Jobs whose data does not match their queue's payload (queues/names.ts), added past the dashboard's
// check (a script, redis-cli, an older release): the worker fails them at once, saying why, and
// goes on with the next job.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { Job, Queue } from 'bullmq';
import { statusesOf, textMessage, useStack, waitFor, withQueue } from './helpers/stack.ts';

// A value that must not reach the worker's log.
const MARK = 'sk-live-payload-7f3a';

const BAD_JOBS = [
  { queue: 'agent-tasks', name: 'run', data: { task_id: `nope-${MARK}`, message_id: randomUUID() }, reason: 'data.task_id must be a UUID' },
  { queue: 'key-jobs', name: 'migrate-deks', data: null, reason: 'data must be object' },
  { queue: 'credential-refresh', name: 'refresh', data: { credential: MARK }, reason: 'data.credential_id is required' },
  { queue: 'push-notifications', name: 'deliver', data: { task_id: randomUUID(), config_id: MARK, timeline_seq: 0 }, reason: 'data.timeline_seq must be >= 1' },
  // Config ids as the A2A API takes them: Postgres refuses a NUL, so such a job would fail every attempt.
  { queue: 'push-notifications', name: 'deliver', data: { task_id: randomUUID(), config_id: `${MARK}\u0000`, timeline_seq: 1 }, reason: 'data.config_id must not contain NUL' },
  { queue: 'push-notifications', name: 'deliver', data: { task_id: randomUUID(), config_id: MARK.padEnd(257, 'x'), timeline_seq: 1 }, reason: 'data.config_id must NOT have more than 256 characters' },
] as const;

// Well-formed jobs of rows that do not exist: each processor finds nothing to do and completes.
const GOOD_JOBS = [
  { queue: 'key-jobs', name: 'migrate-deks', data: { job_id: randomUUID() } },
  { queue: 'credential-refresh', name: 'refresh', data: { credential_id: randomUUID() } },
  { queue: 'push-notifications', name: 'deliver', data: { task_id: randomUUID(), config_id: 'c1', timeline_seq: 1 } },
] as const;

// The job read once it has ended: one read before may be of its run still going.
const ended = async (queue: Queue, id: string) => {
  const state = await waitFor(async () => {
    const s = await queue.getJobState(id);
    return (s === 'failed' || s === 'completed') && s;
  }, `job ${id} to end`, 30000, 50);
  return { job: (await queue.getJob(id)) as Job, state };
};

describe('workers check each job against its queue payload before running it', function () {
  this.timeout(120000);
  const stack = useStack();

  for (const bad of BAD_JOBS) {
    it(`fails a job of ${bad.queue} whose data does not match (${bad.reason}), at once and saying where, and logs it once without the data`, async () => {
      await withQueue(stack.env, bad.queue, async (queue) => {
        const added = await queue.add(bad.name, bad.data, { attempts: 3 });
        const { job, state } = await ended(queue, added.id!);
        assert.equal(state, 'failed');
        assert.equal(job.attemptsMade, 1);
        assert.equal(job.failedReason, `job data does not match the ${bad.queue} payload: ${bad.reason}`);
        const logs = stack.workers[0].logs;
        // Job ids are numbered per queue.
        const lines = logs.filter((l) => l.includes(`"queue":"${bad.queue}"`) && l.includes(`"job_id":"${added.id}"`));
        assert.equal(lines.length, 1, lines.join('\n'));
        assert.equal(JSON.parse(lines[0]).level, 40);
        assert.ok(!logs.some((l) => l.includes(MARK)), 'the job data is not logged');
      });
    });
  }

  it('still runs well-formed jobs on each queue afterwards', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('after a bad job') });
    assert.equal(created.status, 201);
    const id = created.body.task.id;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task.status === 'completed', `task ${id} to complete`, 30000, 100);
    assert.deepEqual(await statusesOf(stack.client, id), ['submitted', 'working', 'completed']);
    for (const good of GOOD_JOBS) {
      await withQueue(stack.env, good.queue, async (queue) => {
        const added = await queue.add(good.name, good.data, { attempts: 3 });
        const { job, state } = await ended(queue, added.id!);
        assert.equal(state, 'completed', `${good.queue}: ${job.failedReason}`);
        assert.equal(job.attemptsMade, 1);
      });
    }
  });
});

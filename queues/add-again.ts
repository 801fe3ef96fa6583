// A job added again under a fixed id (the recovery passes': one per lost piece of work, so several
// workers add it once) whose earlier job BullMQ may still keep, finished: under its id the new one
// would be taken for it and never run. The earlier one is removed and a new one added, not retried:
// BullMQ's retry keeps its first add time, from which the enqueue lag and the backlog age would count
// (queues/names.ts). One another worker has just taken (locked) stays, and carries the work.
import type { JobsOptions, Queue } from 'bullmq';

export async function addAgain(queue: Queue, name: string, data: object, jobId: NonNullable<JobsOptions['jobId']>): Promise<void> {
  await (await queue.getJob(jobId))?.remove().catch(() => undefined);
  await queue.add(name, data, { jobId });
}

// A job found stalled (its lock expired: a Redis restart that kept its data, an event loop blocked)
// may be taken again by the very worker still running its earlier copy. BullMQ renews the locks of
// the jobs it tracks by job id, and the earlier copy's end stops tracking that id: the new copy's
// lock is never renewed, so it stalls again every WORKER_LOCK_MS, each time taken again and the
// copy before it aborted, until the job fails for good ("job stalled more than allowable limit").
// A job that has stalled before therefore renews its own lock while it runs; renewing a lock
// BullMQ renews too costs one command, and a copy whose lock another took renews nothing.
import type { Job, Processor } from 'bullmq';

// Two parameters, as the processors take: BullMQ makes an abort signal per job for a processor of three.
export function renewingRetakenLocks<D, R>(processor: Processor<D, R>, lockMs: number): Processor<D, R> {
  return async (job: Job<D, R>, token?: string) => {
    if (!job.stalledCounter || !token) return processor(job, token);
    let renewing = false;
    const timer = setInterval(() => {
      if (renewing) return; // Redis away: one renewal waits for it, not one per tick
      renewing = true;
      job.extendLock(token, lockMs).catch(() => undefined).finally(() => { renewing = false; });
    }, lockMs / 2);
    try {
      return await processor(job, token);
    } finally {
      clearInterval(timer);
    }
  };
}

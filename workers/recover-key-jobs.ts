// Key jobs whose queue job is gone (Redis lost data: a failover, a flush, no persistence) would
// stay queued or running for ever and block new migrations of their envelope key. Every worker
// looks for them now and then and enqueues them again. The processors resume from the job row, so
// a second run is harmless, and the fixed job id keeps several workers from adding more than one.
import type { Services } from '../domain/services.ts';
import { listUnfinishedKeyJobs } from '../db/key-jobs.ts';
import { pendingOutboxPayloads } from '../db/outbox.ts';
import { addAgain } from '../queues/add-again.ts';

const LIVE_STATES = ['active', 'waiting', 'delayed', 'prioritized', 'waiting-children'] as const;

/** Enqueues again the unfinished key jobs at least `olderThanMs` old that no queue job carries, until `stopping`; returns their ids. */
export async function recoverLostKeyJobs(services: Services, olderThanMs: number, stopping: AbortSignal): Promise<string[]> {
  const rows = await listUnfinishedKeyJobs(services.db, olderThanMs);
  if (!rows.length) return [];
  const queue = services.queues['key-jobs'];
  // Rows the outbox relay has not sent yet (Redis down) are on their way. Read before the queue:
  // a row relayed in between is then seen in the queue.
  const carried = new Set<unknown>((await pendingOutboxPayloads(services.db, 'key-jobs')).map((p) => p.job_id));
  for (const j of await queue.getJobs([...LIVE_STATES])) carried.add(j?.data?.job_id);
  const lost = rows.filter((r) => !carried.has(r.id));
  const enqueued: string[] = [];
  for (const r of lost) {
    if (stopping.aborted) break;
    // An earlier recovery's job may have ended with the row unfinished (its failure could not be recorded).
    await addAgain(queue, r.kind, { job_id: r.id }, `recovered-${r.id}`);
    services.log.warn({ job_id: r.id, kind: r.kind }, 'key job had no queue job: enqueued again');
    enqueued.push(r.id);
  }
  return enqueued;
}

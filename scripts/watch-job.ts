// `npm run cli -- jobs list|watch`: key jobs (bulk DEK migrations, alias rotations) as Postgres
// records them, so it works wherever the CLI reaches the database: what is under way, and one
// job's progress until it ends (a bar on a terminal, a line per change otherwise).
import { setTimeout as sleep } from 'node:timers/promises';
import type { Knex } from 'knex';
import { getKeyJob, listActiveKeyJobs, listEndedKeyJobs, type KeyJobRow } from '../db/key-jobs.ts';
import { NotFound } from '../domain/errors.ts';
import { isOpenKeyJob } from '../domain/key-job-states.ts';

const BAR_WIDTH = 30;

const counts = (j: Pick<KeyJobRow, 'done' | 'failed' | 'total'>) => `${j.done + j.failed}/${j.total} (${j.done} done, ${j.failed} failed)`;

export async function listJobs(db: Knex, json: boolean): Promise<void> {
  const jobs = await listActiveKeyJobs(db);
  if (json) console.log(JSON.stringify(jobs));
  else if (!jobs.length) console.log('No key jobs under way.');
  else for (const j of jobs) console.log(`${j.id}  ${j.kind}  ${j.status}  ${counts(j)}`);
}

const ENDED_WITHIN_MS = 24 * 3600_000;
const ENDED_SHOWN = 100;

/** The key jobs that ended in the last 24 hours, newest first: a failed one with its first error. */
export async function listEndedJobs(db: Knex, json: boolean): Promise<void> {
  const jobs = await listEndedKeyJobs(db, ENDED_WITHIN_MS, ENDED_SHOWN);
  if (json) console.log(JSON.stringify(jobs.map((j) => ({ ...j, finished_at: j.finished_at?.toISOString() ?? null }))));
  else if (!jobs.length) console.log('No key jobs ended in the last 24 hours.');
  else {
    for (const j of jobs) {
      console.log(`${j.id}  ${j.kind}  ${j.status}  ${counts(j)}  ended ${j.finished_at?.toISOString() ?? '-'}${j.first_error ? `  first error ${j.first_error.id}: ${j.first_error.message}` : ''}`);
    }
  }
}

function bar(j: KeyJobRow): string {
  const share = j.total ? Math.min(1, (j.done + j.failed) / j.total) : j.status === 'completed' ? 1 : 0;
  const filled = Math.round(share * BAR_WIDTH);
  return `[${'#'.repeat(filled)}${'.'.repeat(BAR_WIDTH - filled)}] ${String(Math.floor(share * 100)).padStart(3)}%`;
}

/** Follows a job until it ends; 0 when it completed with every item done, 1 otherwise (failed,
 * canceled, or completed with items that failed: a script that migrates keys must not read that as done). */
export async function watchJob(db: Knex, id: string, opts: { intervalMs?: number; out?: NodeJS.WriteStream } = {}): Promise<number> {
  const out = opts.out ?? process.stdout;
  // Ctrl-C on a terminal: end the bar's line first, so that the shell's prompt does not land on it;
  // the signal is raised again, so the exit is still the interrupt's (130).
  const interrupted = () => {
    out.write('\n');
    process.kill(process.pid, 'SIGINT');
  };
  if (out.isTTY) process.once('SIGINT', interrupted);
  try {
    return await follow(db, id, out, opts.intervalMs ?? 500);
  } finally {
    process.removeListener('SIGINT', interrupted);
  }
}

// The bar's line cut to the terminal's width: a longer one wraps, and \r goes back only to its last
// row, so each redraw would leave a row more. What matters most comes first, the job's id last.
const fitted = (line: string, columns: number | undefined) => (columns ? line.slice(0, columns - 1) : line);

async function follow(db: Knex, id: string, out: NodeJS.WriteStream, intervalMs: number): Promise<number> {
  let last = '';
  for (;;) {
    const job = await getKeyJob(db, id);
    if (!job) throw new NotFound('job', id);
    const line = `${job.kind} ${job.id} ${job.status} ${counts(job)}`;
    if (out.isTTY) out.write(`\r${fitted(`${bar(job)} ${job.status} ${counts(job)} ${job.kind} ${job.id}`, out.columns)}\x1b[K`);
    else if (line !== last) out.write(`${line}\n`);
    last = line;
    if (!isOpenKeyJob(job.status)) {
      if (out.isTTY) out.write('\n');
      for (const e of job.errors.slice(0, 10)) out.write(`  error ${e.id}: ${e.message}\n`);
      if (job.errors.length > 10) out.write(`  ... ${job.errors.length - 10} more errors (GET /api/encryption/v1/job/${job.id})\n`);
      if (job.status === 'completed' && job.failed) out.write(`${job.failed} of ${job.total} items failed: not every key was processed\n`);
      return job.status === 'completed' && !job.failed ? 0 : 1;
    }
    await sleep(intervalMs);
  }
}

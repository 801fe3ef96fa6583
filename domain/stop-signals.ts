// When a process (API, worker, the `npm start` launcher) stops gracefully: SIGTERM (platforms), SIGINT
// (Ctrl-C), SIGHUP (the terminal it ran in closed), and, for the API and worker under `npm start`,
// the end of the IPC channel to its launcher (killed without stopping its children: they would
// otherwise run on, orphaned).
import type { Config } from './config.ts';
import { timerMs } from './with-timeout.ts';

// How long a run aborted by a shutdown may take to stop before its job goes back to the queue: what
// the agent records on its way out (the remote agent: the remote task it sent to, which it reads on
// for up to 5 s) must be there for the next run, or that run repeats the work.
export const SHUTDOWN_WIND_DOWN_MS = 6000;
// How long after its grace period a worker still waits for its queues to close (runs it aborted
// first wind down).
export const WORKER_CLOSE_MS = SHUTDOWN_WIND_DOWN_MS + 10_000;
// How long after the grace period the API waits for its Postgres and Redis connections to close.
// The pool closes only once its statements have ended (the sweeper's, a cut request's), which with
// Postgres silent and no DB_QUERY_TIMEOUT_MS is never: past this, it exits.
export const API_CLOSE_MS = 5000;
// The longest the API and a worker take to stop once asked, each exiting by itself by then: `npm
// start` kills neither sooner.
export const apiStopWithinMs = (cfg: Config) => timerMs(cfg.API_SHUTDOWN_DELAY_MS + cfg.API_SHUTDOWN_GRACE_MS + API_CLOSE_MS);
export const workerStopWithinMs = (cfg: Config) => timerMs(cfg.WORKER_SHUTDOWN_GRACE_MS + WORKER_CLOSE_MS);

let stopping: ((why: string) => void) | undefined;

// The launcher can be killed while its children start (seconds of loading, waiting for Postgres and
// Redis, bootstrap), before they call onStop, and the channel's end is told once: it is watched from
// when this module loads, and one that ended before is seen in process.connected. Until onStop there
// is nothing to finish, so the process exits at once, as a signal would end it then.
const launcherGone = () => (stopping ? stopping('npm start launcher gone') : process.exit(1));
if (process.send) {
  if (process.connected) process.on('disconnect', launcherGone);
  else launcherGone();
}

export function onStop(stop: (why: string) => void): void {
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => stop(signal));
  stopping = stop;
}

// A stop that cannot finish (Postgres or Redis unreachable while connections close) still ends: past
// `ms` the process says why (`say`) and exits 1. The timer does not keep a process that finished alive.
export function exitIfNotStoppedWithin(ms: number, say: () => void): void {
  setTimeout(() => {
    say();
    process.exit(1);
  }, ms).unref();
}

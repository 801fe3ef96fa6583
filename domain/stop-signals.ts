// When a process (API, worker, the `npm start` launcher) stops gracefully: SIGTERM (platforms), SIGINT
// (Ctrl-C), SIGHUP (the terminal it ran in closed), and, for the API and worker under `npm start`,
// the end of the IPC channel to its launcher (killed without stopping its children: they would
// otherwise run on, orphaned).
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

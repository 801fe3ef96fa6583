// When a process (API, worker, the `npm start` launcher) stops gracefully: SIGTERM (platforms), SIGINT
// (Ctrl-C), SIGHUP (the terminal it ran in closed), and, for the API and worker under `npm start`,
// the end of the IPC channel to its launcher (killed without stopping its children: they would
// otherwise run on, orphaned).
export function onStop(stop: (why: string) => void): void {
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => stop(signal));
  if (process.send) process.on('disconnect', () => stop('npm start launcher gone'));
}

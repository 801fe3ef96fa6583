// Ends a test run that has stopped moving. mocha times out a test only while its event loop runs: a
// process blocked in native code, stopped, or stuck writing its output would otherwise sit silent
// until CI's own limit, with no hint of where. The reporter (test/helpers/reporter.cjs) writes the
// test or hook it is in to a progress file at each start and end; once that file has not changed for
// the stall limit, the watchdog prints that test and what every process of the run is doing (Linux:
// its state and the kernel function it waits in), then kills them.
import fs from 'node:fs';
import { readProcTable, subtree, type ProcEntry } from './proc-table.ts';

const read = (file: string) => {
  try { return fs.readFileSync(file, 'utf8'); } catch { return ''; }
};

interface ProcInfo extends ProcEntry { wchan: string; cmd: string }

// `root` and everything it started, parents before their children, with what each waits in and runs.
function processTree(root: number): ProcInfo[] {
  const table = readProcTable();
  return table ? subtree(table, root).map((p) => {
    const cmd = read(`/proc/${p.pid}/cmdline`).replace(/\0+$/, '').replace(/\0/g, ' ');
    return { ...p, wchan: read(`/proc/${p.pid}/wchan`) || '-', cmd: cmd.length > 160 ? `${cmd.slice(0, 160)}…` : cmd };
  }) : [];
}

function describeStall(tree: ProcInfo[], progressFile: string, stalledMs: number): string {
  const where = read(progressFile).trim() || '(no test had started)';
  const lines = [
    `no test started or ended for ${Math.round(stalledMs / 1000)} s (TEST_STALL_MS); the run is stuck in:`,
    ...where.split('\n').map((l) => `  ${l}`),
    'its processes (state: R running, S sleeping, D in I/O, T stopped; then the kernel function it waits in):',
    ...tree.map((p) => `  ${p.pid} ${p.state} ${p.wchan} ${p.cmd}`),
  ];
  return lines.join('\n');
}

// Watches `progressFile` while the run goes; once it stalls, the run's processes are killed and
// `onStall` gets the description. Returns the function that stops the watch.
export function watchProgress(root: number, progressFile: string, stallMs: number, onStall: (description: string) => void): () => void {
  const started = Date.now();
  const timer = setInterval(() => {
    let last = started;
    try { last = Math.max(started, fs.statSync(progressFile).mtimeMs); } catch { /* no test yet */ }
    const stalled = Date.now() - last;
    if (stalled < stallMs) return;
    clearInterval(timer);
    const tree = processTree(root);
    const description = describeStall(tree, progressFile, stalled);
    // Killed before anything is printed, in case printing is what blocks; children first, so none
    // is left to its own devices; the root also where /proc is not there.
    for (const pid of [...tree.map((p) => p.pid).reverse(), root]) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* gone already */ }
    }
    onStall(description);
  }, Math.min(10_000, Math.max(100, stallMs / 10)));
  timer.unref();
  return () => clearInterval(timer);
}

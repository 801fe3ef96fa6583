// Ends a test run that has stopped moving. mocha times out a test only while its event loop runs: a
// process blocked in native code, stopped, or stuck writing its output would otherwise sit silent
// until CI's own limit, with no hint of where. The reporter (test/helpers/reporter.cjs) writes the
// test or hook it is in to a progress file at each start and end; once that file has not changed for
// the stall limit, the watchdog prints that test and what every process of the run is doing (Linux:
// its state and the kernel function it waits in), then kills them.
import fs from 'node:fs';

interface ProcInfo { pid: number; ppid: number; state: string; wchan: string; cmd: string }

const read = (file: string) => {
  try { return fs.readFileSync(file, 'utf8'); } catch { return ''; }
};

function processes(): ProcInfo[] {
  let pids: string[];
  try { pids = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p)); } catch { return []; }
  const out: ProcInfo[] = [];
  for (const p of pids) {
    const stat = read(`/proc/${p}/stat`);
    // "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ')'.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (rest.length < 2) continue;
    const cmd = read(`/proc/${p}/cmdline`).replace(/\0+$/, '').replace(/\0/g, ' ');
    out.push({ pid: Number(p), ppid: Number(rest[1]), state: rest[0], wchan: read(`/proc/${p}/wchan`) || '-', cmd: cmd.length > 160 ? `${cmd.slice(0, 160)}…` : cmd });
  }
  return out;
}

// `root` and everything it started, parents before their children.
function processTree(root: number): ProcInfo[] {
  const all = processes();
  const tree: ProcInfo[] = [];
  const visit = (pid: number) => {
    const me = all.find((p) => p.pid === pid);
    if (me) tree.push(me);
    for (const child of all.filter((p) => p.ppid === pid)) visit(child.pid);
  };
  visit(root);
  return tree;
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

// The machine's processes as Linux's /proc shows them: each one's parent, state and CPU time. The
// benches count what their processes spent (bench/harness.ts); `npm test`'s watchdog lists a stuck
// run's processes (scripts/test-watchdog.ts).
import fs from 'node:fs';

export interface ProcEntry {
  pid: number;
  ppid: number;
  /** Its process group. */
  pgrp: number;
  /** R running, S sleeping, D in I/O, T stopped, Z ended and not reaped, … */
  state: string;
  /** User and system time, its reaped children's included. */
  cpuMs: number;
}

const TICK_MS = 1000 / 100; // USER_HZ, 100 on Linux

// Every process, by pid; undefined without /proc.
export function readProcTable(): Map<number, ProcEntry> | undefined {
  if (!fs.existsSync('/proc/self/stat')) return undefined;
  const table = new Map<number, ProcEntry>();
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue; // ended meanwhile
    }
    // "pid (comm) state ppid pgrp …": comm may hold spaces and parentheses, so split after the last ')'.
    // Then utime, stime, cutime, cstime are fields 14 to 17.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const pid = Number(name);
    table.set(pid, { pid, ppid: Number(f[1]), pgrp: Number(f[2]), state: f[0], cpuMs: (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * TICK_MS });
  }
  return table;
}

// Whether a process of group `group` runs: with /proc, one that has not ended (an ended one may wait
// long to be reaped by an init that reaps lazily); without, whether the group can be signalled.
export function groupRuns(group: number): boolean {
  const table = readProcTable();
  if (table) return [...table.values()].some((p) => p.pgrp === group && p.state !== 'Z');
  try {
    process.kill(-group, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

// `root` and every process it started, parents before their children.
export function subtree(table: Map<number, ProcEntry>, root: number): ProcEntry[] {
  const children = new Map<number, number[]>();
  for (const p of table.values()) children.set(p.ppid, [...(children.get(p.ppid) ?? []), p.pid]);
  const out: ProcEntry[] = [];
  const visit = (pid: number) => {
    const me = table.get(pid);
    if (me) out.push(me);
    for (const child of children.get(pid) ?? []) visit(child);
  };
  visit(root);
  return out;
}

// When process `pid` started (clock ticks after boot), which tells it from a later one given its pid:
// null when /proc shows there is no such process, undefined when it cannot be told (no /proc, unreadable).
export function leaderStart(pid: number): string | null | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] || undefined;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ENOENT' && fs.existsSync('/proc/self/stat') ? null : undefined;
  }
}

// Sends `signal` to process group `group`; a group that has ended meanwhile is no error.
export function signalGroup(group: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-group, signal);
  } catch {
    // Ended meanwhile.
  }
}

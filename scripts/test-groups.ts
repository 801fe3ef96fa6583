// The process groups the tests start (servers, launchers: detached, so a signal to mocha's group does not
// reach them). Once a signal has ended mocha's group, no after-hook of the tests stops them: `npm test`
// lists them in a file named by TEST_GROUPS_FILE and ends those still running.
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { groupRuns, leaderStart, signalGroup } from './proc-table.ts';

// For a process just spawned detached (it leads its own group); nothing outside npm test.
export function registerGroup(child: ChildProcess): void {
  const file = process.env.TEST_GROUPS_FILE;
  if (file && child.pid) fs.appendFileSync(file, `${child.pid} ${leaderStart(child.pid) ?? ''}\n`);
}

// The listed groups still running: led by the process listed (its start time tells it from a later
// one given its pid), or by none as /proc shows (its leader ended, others of the group run on; while
// they do, the kernel gives no new process that pid). One whose start time was not recorded, or whose
// leader's cannot be read now (no /proc), is left alone: it may be someone else's by now.
// `startOf` for the tests only.
export function runningGroups(file: string, startOf: (pid: number) => string | null | undefined = leaderStart): number[] {
  let lines: string[];
  try {
    lines = fs.readFileSync(file, 'utf8').split('\n').filter(Boolean);
  } catch {
    return []; // none listed
  }
  return [...new Set(lines)].map((l) => l.split(' ')).filter(([group, start]) => {
    if (!start) return false;
    const now = startOf(Number(group));
    return (now === null || now === start) && groupRuns(Number(group));
  }).map(([group]) => Number(group));
}

function signalGroups(groups: number[], signal: NodeJS.Signals): void {
  for (const group of groups) signalGroup(group, signal);
}

export function killGroups(file: string): void {
  signalGroups(runningGroups(file), 'SIGKILL');
}

// SIGTERM, and SIGKILL to what still runs `graceMs` later. Returns the groups it signalled.
export async function endGroups(file: string, graceMs: number): Promise<number[]> {
  const groups = runningGroups(file);
  signalGroups(groups, 'SIGTERM');
  const deadline = Date.now() + graceMs;
  while (groups.some(groupRuns) && Date.now() < deadline) await sleep(50);
  signalGroups(groups.filter(groupRuns), 'SIGKILL');
  return groups;
}

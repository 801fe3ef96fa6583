// Abort controllers of the agent runs in this process, fired when their task ends elsewhere
// (workers/watch-cancels.ts).
export class CancelRegistry {
  private runs = new Map<string, { controller: AbortController; since: number }>();

  register(taskId: string): AbortController {
    const controller = new AbortController();
    this.runs.set(taskId, { controller, since: Date.now() });
    return controller;
  }

  release(taskId: string, c: AbortController): void {
    if (this.runs.get(taskId)?.controller === c) this.runs.delete(taskId);
  }

  cancel(taskId: string, reason = 'task canceled'): boolean {
    const run = this.runs.get(taskId);
    run?.controller.abort(new Error(reason));
    return !!run;
  }

  /** Tasks whose runs have gone on for at least `ms`. */
  runningFor(ms: number): string[] {
    const before = Date.now() - ms;
    return [...this.runs].filter(([, r]) => r.since <= before && !r.controller.signal.aborted).map(([taskId]) => taskId);
  }

  // Shutdown aborts are marked so the run is handed back for retry instead of counted as canceled.
  /** Aborts every run; returns how many there were. */
  abortAll(reason: string): number {
    for (const { controller } of this.runs.values()) controller.abort(Object.assign(new Error(reason), { shutdown: true }));
    return this.runs.size;
  }
}

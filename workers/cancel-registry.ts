// Abort controllers of the agent runs in this process, fired by cancel notes from any process.
export class CancelRegistry {
  private runs = new Map<string, AbortController>();

  register(taskId: string): AbortController {
    const c = new AbortController();
    this.runs.set(taskId, c);
    return c;
  }

  release(taskId: string, c: AbortController): void {
    if (this.runs.get(taskId) === c) this.runs.delete(taskId);
  }

  cancel(taskId: string, reason = 'task canceled'): boolean {
    const c = this.runs.get(taskId);
    c?.abort(new Error(reason));
    return !!c;
  }

  // Shutdown aborts are marked so the run is handed back for retry instead of counted as canceled.
  /** Aborts every run; returns how many there were. */
  abortAll(reason: string): number {
    for (const c of this.runs.values()) c.abort(Object.assign(new Error(reason), { shutdown: true }));
    return this.runs.size;
  }
}

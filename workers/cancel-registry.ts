// Abort controllers of the agent runs in this process, fired when their task ends elsewhere or
// another run takes it (workers/watch-cancels.ts). A run is its task and trigger message, and the
// take of its job (the task's run_attempt) it holds the task under.
export interface RunningRun { taskId: string; messageId: string; attempt: number }

// How long a note of a task's end that found no run here is kept for a run registering late.
const ENDED_NOTE_MS = 10_000;

export class CancelRegistry {
  private runs = new Map<string, { controller: AbortController; messageId: string; attempt: number; since: number }>();
  // Set by abortAll: a run that registers later (its start was still waiting on Postgres when the
  // shutdown's grace period ended) is handed back at once too, not left running past the shutdown.
  private shutdown?: Error;
  // Tasks whose end was noted while no run of theirs was here, oldest first. A run that started
  // just before the end and registers just after it is aborted as it registers, not at the next
  // check in Postgres (up to half a second of calls its agent should not make). An ended task takes
  // no new run, so a note can only be about a run that started before it.
  private endedNotes = new Map<string, number>();

  register(taskId: string, messageId: string, attempt: number): AbortController {
    const controller = new AbortController();
    if (this.shutdown) controller.abort(this.shutdown);
    else if (this.endedLately(taskId)) controller.abort(new Error('task canceled'));
    this.runs.set(taskId, { controller, messageId, attempt, since: Date.now() });
    return controller;
  }

  /** Aborts the task's run, as `cancel` does, or, with none here yet, the run that registers for it soon; false when there was none. */
  taskEnded(taskId: string): boolean {
    if (this.cancel(taskId)) return true;
    const now = Date.now();
    for (const [id, at] of this.endedNotes) {
      if (at > now - ENDED_NOTE_MS) break;
      this.endedNotes.delete(id);
    }
    this.endedNotes.delete(taskId);
    this.endedNotes.set(taskId, now);
    return false;
  }

  private endedLately(taskId: string): boolean {
    const at = this.endedNotes.get(taskId);
    return at !== undefined && at > Date.now() - ENDED_NOTE_MS;
  }

  release(taskId: string, c: AbortController): void {
    if (this.runs.get(taskId)?.controller === c) this.runs.delete(taskId);
  }

  /**
   * Aborts the task's run (only the one for `messageId`, and `attempt`, given them); false when there is none.
   * `superseded`: the task was taken from the run (by a client or another run), not ended: an agent
   * may leave what it started elsewhere going for the run that took over (the remote agent does).
   */
  cancel(taskId: string, reason = 'task canceled', opts: { messageId?: string; attempt?: number; superseded?: boolean } = {}): boolean {
    const run = this.runs.get(taskId);
    if (!run || (opts.messageId !== undefined && run.messageId !== opts.messageId) || (opts.attempt !== undefined && run.attempt !== opts.attempt)) return false;
    run.controller.abort(Object.assign(new Error(reason), opts.superseded ? { superseded: true } : {}));
    return true;
  }

  /** The message of the task's run going on here, if any. */
  messageOf(taskId: string): string | undefined {
    return this.runs.get(taskId)?.messageId;
  }

  /** Runs that have gone on for at least `ms`. */
  runningFor(ms: number): RunningRun[] {
    const before = Date.now() - ms;
    return [...this.runs].filter(([, r]) => r.since <= before && !r.controller.signal.aborted).map(([taskId, r]) => ({ taskId, messageId: r.messageId, attempt: r.attempt }));
  }

  // Shutdown aborts are marked so the run is handed back for retry instead of counted as canceled.
  /** Aborts every run, and every run registered from now on; returns how many there were. */
  abortAll(reason: string): number {
    this.shutdown = Object.assign(new Error(reason), { shutdown: true });
    for (const { controller } of this.runs.values()) controller.abort(this.shutdown);
    return this.runs.size;
  }
}

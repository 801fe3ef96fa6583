// Wakes API-side followers of a task's timeline (A2A streams, blocking message/send) when
// workers write to it. One Redis subscription per process feeds every follower; the notes only
// say "look again": followers re-read Postgres, so a lost note costs latency, never an event.
import { setTimeout as sleep } from 'node:timers/promises';
import type { EventBus } from '../queues/events.ts';
import type { Logger } from './logger.ts';
import { TASK_EVENTS } from './tasks.ts';

const SUBSCRIBE_WAIT_MS = 1000;

export interface TaskFollow {
  /**
   * Resolves once a note for the task arrived since the previous call (at once if one already
   * did), after `timeoutMs`, or when `signal` aborts.
   */
  wait(timeoutMs: number, signal?: AbortSignal): Promise<void>;
  close(): void;
}

export class TaskWaiter {
  private follows = new Map<string, Set<{ pending: boolean; wake?: () => void }>>();
  private started?: Promise<unknown>;
  private subscribed = false;
  // Set once a follower waited for the subscription in vain; it never comes down once up (ioredis
  // subscribes again after a reconnect), so this covers the one outage it can wait for.
  private waitedInVain = false;

  constructor(private readonly bus: EventBus, private readonly log: Logger) {}

  private start(): Promise<unknown> {
    this.started ??= this.bus.subscribe(TASK_EVENTS, (msg) => {
      const set = typeof msg.task_id === 'string' ? this.follows.get(msg.task_id) : undefined;
      if (!set) return;
      for (const f of set) {
        f.pending = true;
        f.wake?.();
      }
    }).then(() => { this.subscribed = true; }, (err) => {
      this.started = undefined; // retried by the next follower; meanwhile followers poll
      throw err;
    });
    return this.started;
  }

  /** Starts following a task; register before reading the timeline so no note is missed. */
  async follow(taskId: string): Promise<TaskFollow> {
    // With Redis away the subscription waits for it; followers do not: they poll meanwhile. Only the
    // first waits up to SUBSCRIBE_WAIT_MS for it; the next ones (each still asking for it) go on at once.
    if (!this.subscribed) {
      const starting = this.start().catch(() => undefined);
      if (!this.waitedInVain) {
        await Promise.race([starting, sleep(SUBSCRIBE_WAIT_MS, undefined, { ref: false })]);
        if (!this.subscribed) {
          this.waitedInVain = true;
          this.log.warn('task notes unavailable (no Redis subscription): A2A streams and blocking sends poll Postgres until it is up');
        }
      }
    }
    const entry: { pending: boolean; wake?: () => void } = { pending: false };
    let set = this.follows.get(taskId);
    if (!set) this.follows.set(taskId, (set = new Set()));
    set.add(entry);
    return {
      wait: (timeoutMs, signal) => {
        if (entry.pending || signal?.aborted) {
          entry.pending = false;
          return Promise.resolve();
        }
        return new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', done);
            entry.wake = undefined;
            entry.pending = false;
            resolve();
          };
          const timer = setTimeout(done, Math.max(0, timeoutMs));
          signal?.addEventListener('abort', done, { once: true });
          entry.wake = done;
        });
      },
      close: () => {
        set!.delete(entry);
        if (set!.size === 0 && this.follows.get(taskId) === set) this.follows.delete(taskId);
      },
    };
  }
}

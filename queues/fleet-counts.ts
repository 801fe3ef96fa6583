// Counts per subject and fixed time window (RATE_LIMIT_PER_SECOND per key, AUTH_FAILURES_PER_MINUTE
// per client address) shared by every API process through Redis, without a Redis round trip per
// request: a shared count per request cost about a third of intake throughput (bench:a2a). A request
// reads and adds to this process's memory only; every SYNC_MS one pipelined round trip adds what this
// process counted since to one Redis counter per limit, window and subject, and brings back the
// fleet's totals. A process therefore misses what the others counted since their last sync and its
// own last read: the fleet may pass a limit by what it takes in about two intervals (README). Redis
// down or slow leaves the counts of this process and the last totals it learned: requests never wait
// for Redis.
import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from '../domain/logger.ts';
import { RedisOutageLog } from './redis-outage.ts';

export const SYNC_MS = 200;
// An address comes from X-Forwarded-For under TRUST_PROXY, which a client may fill with anything:
// a long one is named by its hash in Redis.
const SUBJECT_MAX = 100;
// A subject this process has not counted for this long is no longer read back at each sync: a flood
// of one-off subjects (wrong keys from many addresses) would otherwise cost a Redis read per subject
// every SYNC_MS for the rest of its window. Counting it again brings its fleet total back.
const READ_IDLE_MS = 5000;

interface Slot {
  window: number;
  /** Counted here and not yet added to Redis. */
  unsynced: number;
  /** The fleet's total (this process's synced counts included) at the last sync. */
  fleet: number;
  /** When this process last counted for it. */
  counted: number;
}

export class WindowCounts {
  readonly slots = new Map<string, Slot>();

  constructor(readonly name: string, readonly windowMs: number) {}

  private slot(subject: string, now: number, create: boolean): Slot | undefined {
    const window = Math.floor(now / this.windowMs);
    const slot = this.slots.get(subject);
    if (slot?.window === window) return slot;
    if (!create) return undefined;
    const fresh = { window, unsynced: 0, fleet: 0, counted: now };
    this.slots.set(subject, fresh);
    return fresh;
  }

  private msLeft(now: number): number {
    return this.windowMs - (now % this.windowMs);
  }

  /** Counts `n` for the subject unless that would take its count in this window past `limit`: 0 if counted, else the ms until the window ends. */
  take(subject: string, limit: number, n = 1, now = Date.now()): number {
    const slot = this.slot(subject, now, true)!;
    if (slot.unsynced + slot.fleet + n > limit) return this.msLeft(now);
    slot.unsynced += n;
    slot.counted = now;
    return 0;
  }

  /** The subject's count in this window. */
  count(subject: string, now = Date.now()): number {
    const slot = this.slot(subject, now, false);
    return slot ? slot.unsynced + slot.fleet : 0;
  }

  /** The ms until the window ends if the subject's count in it has reached `limit`, else 0. */
  reached(subject: string, limit: number, now = Date.now()): number {
    return this.count(subject, now) >= limit ? this.msLeft(now) : 0;
  }

  add(subject: string, now = Date.now()): void {
    const slot = this.slot(subject, now, true)!;
    slot.unsynced++;
    slot.counted = now;
  }
}

export class FleetCounts {
  private readonly windows = new Map<string, WindowCounts>();
  private timer?: NodeJS.Timeout;
  private syncing = false;
  private readonly outage: RedisOutageLog;

  constructor(private readonly redis: Redis, private readonly prefix: string, log: Logger) {
    this.outage = new RedisOutageLog(log, 'Redis unavailable for the request limits: each API process counts on its own until it is back', 'Redis back for the request limits: counts are shared by the API processes again');
  }

  /** The counts named `name` (one Redis counter per window and subject under `<prefix>:limit:<name>:`); syncing starts with the first. */
  window(name: string, windowMs: number): WindowCounts {
    let counts = this.windows.get(name);
    if (!counts) this.windows.set(name, (counts = new WindowCounts(name, windowMs)));
    this.timer ??= setInterval(() => void this.sync(), SYNC_MS).unref();
    return counts;
  }

  private key(counts: WindowCounts, window: number, subject: string): string {
    const named = subject.length > SUBJECT_MAX ? `sha256:${createHash('sha256').update(subject).digest('hex')}` : subject;
    return `${this.prefix}:limit:${counts.name}:${window}:${named}`;
  }

  // A sync still waiting for Redis (slow, or silent until the command timeout) is not joined by another.
  async sync(now = Date.now()): Promise<void> {
    // Counts of past windows go whatever Redis does: a sync that never ends (a Redis that holds the
    // connection and never answers, with no command timeout) must not keep every subject since.
    for (const counts of this.windows.values()) {
      const current = Math.floor(now / counts.windowMs);
      for (const [subject, slot] of counts.slots) if (slot.window < current) counts.slots.delete(subject);
    }
    if (this.syncing) return;
    const pipeline = this.redis.pipeline();
    const sent: { slot: Slot; delta: number }[] = [];
    for (const counts of this.windows.values()) {
      for (const [subject, slot] of counts.slots) {
        if (!slot.unsynced && now - slot.counted > READ_IDLE_MS) continue;
        const key = this.key(counts, slot.window, subject);
        // Kept for two windows: the one it counts and the next, for processes whose clock is behind.
        if (slot.unsynced) pipeline.incrby(key, slot.unsynced).pexpire(key, 2 * counts.windowMs);
        else pipeline.get(key);
        sent.push({ slot, delta: slot.unsynced });
      }
    }
    if (!sent.length) return;
    this.syncing = true;
    let failed: Error | undefined;
    try {
      const results = (await pipeline.exec()) ?? [];
      let i = 0;
      for (const { slot, delta } of sent) {
        const [err, total] = results[i] ?? [new Error('no answer')];
        i += delta ? 2 : 1;
        if (err) {
          failed ??= err;
          continue;
        }
        // Counted meanwhile stays unsynced; a total read before another process's sync never lowers what is known.
        slot.unsynced -= delta;
        slot.fleet = Math.max(slot.fleet, Number(total) || 0);
      }
    } catch (err) {
      failed = err as Error;
    } finally {
      this.syncing = false;
    }
    this.outage.note(failed);
  }

  stop(): void {
    this.outage.stop();
    clearInterval(this.timer);
  }
}

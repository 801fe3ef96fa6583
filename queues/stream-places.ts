// Places of A2A streams per API key, shared by every API process through Redis (A2A_STREAMS_PER_KEY):
// one sorted set per key whose members are its streams open anywhere, each scored by when its lease
// ends. A process renews the leases of its streams every third of a lease, so the places of a process
// that dies with streams open come back when their leases end. Unlike request counts
// (fleet-counts.ts), a place costs a round trip: streams are opened rarely and live long, and a
// shared count that lagged would let a key pile up streams across processes. Redis down or slow: the
// place is not counted in Redis until it is back (the next renewal adds it); the caller's own count
// of this process's streams still holds.
import { randomUUID } from 'node:crypto';
import type { ChainableCommander, Redis } from 'ioredis';
import type { Logger } from '../domain/logger.ts';
import { withTimeout } from '../domain/with-timeout.ts';
import { RedisOutageLog } from './redis-outage.ts';

// Times come from Redis (TIME), not from each process's clock: a process whose clock ran ahead would
// take other processes' live leases for ended ones. (replicate_commands: Redis 5 and 6 refuse a write
// after TIME without it; 7 always replicates a script's effects.)
const NOW = `if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

// The set lives as long as its furthest lease, whatever lease each process uses (processes with
// another A2A_STREAM_LEASE_MS during a rollout would otherwise expire each other's places).
const EXPIRE_LAST = `local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], last[2]) end`;

// KEYS[1]: a key's places; ARGV: the stream, the limit, the lease (ms). The count of other live
// places when full (nothing taken), else -1.
const TAKE = `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local open = redis.call('ZCARD', KEYS[1])
if open >= tonumber(ARGV[2]) then return open end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
${EXPIRE_LAST}
return -1`;

// KEYS[1]: a key's places; ARGV: the lease (ms), then the streams open here. Added back if they were
// dropped meanwhile (their lease ended while Redis was out of reach): they are still open.
const RENEW = `${NOW}
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i]) end
${EXPIRE_LAST}
return #ARGV - 1`;

// How long opening a stream waits for Redis before it counts the place here alone: a Redis that
// keeps the connection but does not answer would otherwise hold the request to DB_QUERY_TIMEOUT_MS.
const TAKE_WAIT_MS = 2000;
// How long a stop waits for the places it gives back to reach Redis.
const STOP_WAIT_MS = 1000;

// The scripts as commands, on the connection and in its pipelines.
interface PlaceCommands {
  takeStreamPlace(key: string, stream: string, limit: number, leaseMs: number): Promise<number>;
  renewStreamPlaces(key: string, leaseMs: number, ...streams: string[]): unknown;
}

export class StreamPlaces {
  private readonly redis: Redis & PlaceCommands;
  private readonly outage: RedisOutageLog;
  // The places this process holds, by subject: what each renewal renews.
  private readonly held = new Map<string, Set<string>>();
  // Places given back in the last lease, by stream: removed again after each renewal.
  private readonly released = new Map<string, { subject: string; until: number }>();
  private renewing = false;
  private timer?: NodeJS.Timeout;
  private seq = 0;
  private readonly processId = randomUUID();

  constructor(redis: Redis, private readonly prefix: string, private readonly leaseMs: number, log: Logger) {
    redis.defineCommand('takeStreamPlace', { numberOfKeys: 1, lua: TAKE });
    redis.defineCommand('renewStreamPlaces', { numberOfKeys: 1, lua: RENEW });
    this.redis = redis as Redis & PlaceCommands;
    this.outage = new RedisOutageLog(log, 'Redis unavailable for A2A stream places: each API process counts its own streams until it is back', 'Redis back for A2A stream places: they are counted across the API processes again');
  }

  private key(subject: string): string {
    return `${this.prefix}:a2a-streams:${subject}`;
  }

  /**
   * Takes one of `subject`'s `limit` places: a release, or, when the fleet holds them all, how many
   * are open. Redis unavailable or slow: a place that counts only here until Redis is back.
   */
  async take(subject: string, limit: number): Promise<{ release(): void } | { open: number }> {
    const stream = `${this.processId}:${++this.seq}`;
    try {
      const open = await withTimeout(this.redis.takeStreamPlace(this.key(subject), stream, limit, this.leaseMs), Math.min(TAKE_WAIT_MS, this.leaseMs / 3));
      this.outage.note();
      if (open >= 0) return { open };
    } catch (err) {
      this.outage.note(err as Error);
    }
    const mine = this.held.get(subject) ?? new Set<string>();
    mine.add(stream);
    this.held.set(subject, mine);
    this.timer ??= setInterval(() => void this.renew(), Math.max(1, Math.floor(this.leaseMs / 3))).unref();
    return {
      release: () => {
        if (!mine.delete(stream)) return;
        if (!mine.size && this.held.get(subject) === mine) this.held.delete(subject);
        // Removed now, and again after each renewal for a lease: a take or renewal left unanswered by a
        // dropped connection is sent again when it comes back, which would put the place back, and a
        // removal refused meanwhile would leave it to its lease.
        this.released.set(stream, { subject, until: Date.now() + this.leaseMs });
        this.redis.zrem(this.key(subject), stream).catch(() => undefined);
      },
    };
  }

  async renew(): Promise<void> {
    if (this.renewing || (!this.held.size && !this.released.size)) return;
    this.renewing = true;
    const pipeline = this.redis.pipeline() as ChainableCommander & PlaceCommands;
    for (const [subject, streams] of this.held) pipeline.renewStreamPlaces(this.key(subject), this.leaseMs, ...streams);
    const now = Date.now();
    for (const [stream, { subject, until }] of this.released) {
      if (until < now) this.released.delete(stream);
      else pipeline.zrem(this.key(subject), stream);
    }
    let failed: Error | undefined;
    try {
      failed = ((await pipeline.exec()) ?? []).find(([err]) => err)?.[0] ?? undefined;
    } catch (err) {
      failed = err as Error;
    } finally {
      this.renewing = false;
    }
    this.outage.note(failed);
  }

  /** Gives back the places still held here (this process is going), waiting a moment for Redis. */
  async stop(): Promise<void> {
    this.outage.stop();
    clearInterval(this.timer);
    const pipeline = this.redis.pipeline();
    for (const [subject, streams] of this.held) pipeline.zrem(this.key(subject), ...streams);
    for (const [stream, { subject }] of this.released) pipeline.zrem(this.key(subject), stream);
    if (pipeline.length) await withTimeout(pipeline.exec(), STOP_WAIT_MS).catch(() => undefined);
  }
}

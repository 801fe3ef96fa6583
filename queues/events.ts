import type { Redis } from 'ioredis';
import type { Logger } from '../domain/logger.ts';
import { withTimeout } from '../domain/with-timeout.ts';

// Small wake-up notes between processes over Redis pub/sub. Postgres stays the source of truth:
// a subscriber that misses a note re-reads state there.
export type Handler = (message: Record<string, unknown>) => void;

export interface EventBusOptions {
  /**
   * How often the subscriber connection is pinged. It sends nothing otherwise, so one dropped
   * silently as idle (a NAT gateway, a load balancer) would stay dead, and every follower would
   * fall back to polling; a ping that gets no answer within `timeoutMs` reconnects it (ioredis then
   * subscribes again to every channel).
   */
  heartbeatMs?: number;
  timeoutMs?: number;
}

interface Channel { handlers: Set<Handler>; subscribed: Promise<unknown> }

export class EventBus {
  private channels = new Map<string, Channel>();
  private beating = false;

  constructor(private readonly pub: Redis, private readonly sub: Redis, private readonly prefix: string, private readonly log: Logger, { heartbeatMs = 30_000, timeoutMs = 10_000 }: EventBusOptions = {}) {
    sub.on('message', (channel: string, raw: string) => {
      const handlers = this.channels.get(channel)?.handlers;
      if (!handlers) return;
      let msg: Record<string, unknown>;
      try { msg = JSON.parse(raw); } catch { return; }
      for (const h of handlers) {
        try { h(msg); } catch (err) { this.log.error({ err, channel }, 'event handler failed'); }
      }
    });
    setInterval(() => this.heartbeat(timeoutMs), heartbeatMs).unref();
  }

  private heartbeat(timeoutMs: number): void {
    // 'end': closed on purpose (shutdown). Not ready: ioredis is reconnecting already.
    if (this.beating || this.sub.status !== 'ready') return;
    this.beating = true;
    withTimeout(this.sub.ping(), timeoutMs)
      .catch((err: Error) => {
        if (this.sub.status === 'end') return;
        this.log.warn({ why: err.message }, 'Redis subscriber gave no answer to a ping; reconnecting');
        this.sub.disconnect(true);
      })
      .finally(() => { this.beating = false; });
  }

  private channel(name: string) { return `${this.prefix}:${name}`; }

  async publish(name: string, message: Record<string, unknown>): Promise<void> {
    await this.pub.publish(this.channel(name), JSON.stringify(message));
  }

  async subscribe(name: string, handler: Handler): Promise<() => Promise<void>> {
    const ch = this.channel(name);
    let channel = this.channels.get(ch);
    if (!channel) {
      const created: Channel = { handlers: new Set(), subscribed: this.sub.subscribe(ch) };
      this.channels.set(ch, created);
      // A subscription Redis refused is forgotten, so that the next subscriber asks again (kept, every
      // later subscriber would take the channel for subscribed and never hear a note).
      created.subscribed.catch(() => { if (this.channels.get(ch) === created) this.channels.delete(ch); });
      channel = created;
    }
    // Added before the wait: a channel with no handler left is dropped, and a handler added after
    // the last one left during the wait would sit in a dropped channel and hear nothing.
    const { handlers } = channel;
    handlers.add(handler);
    try {
      await channel.subscribed;
    } catch (err) {
      handlers.delete(handler);
      throw err;
    }
    return async () => {
      handlers.delete(handler);
      if (handlers.size === 0 && this.channels.get(ch) === channel) {
        this.channels.delete(ch);
        await this.sub.unsubscribe(ch).catch(() => undefined);
      }
    };
  }
}

import type { Redis } from 'ioredis';
import type { Logger } from '../domain/logger.ts';
import { startHeartbeat, type HeartbeatOptions } from '../domain/heartbeat.ts';

// Small wake-up notes between processes over Redis pub/sub. Postgres stays the source of truth:
// a subscriber that misses a note re-reads state there.
export type Handler = (message: Record<string, unknown>) => void;

interface Channel { handlers: Set<Handler>; subscribed: Promise<unknown> }

export class EventBus {
  private channels = new Map<string, Channel>();

  // The subscriber is pinged (domain/heartbeat.ts): one dropped silently would leave every follower
  // polling. One that gives no answer is reconnected, and ioredis subscribes again to every channel.
  constructor(private readonly pub: Redis, private readonly sub: Redis, private readonly prefix: string, private readonly log: Logger, heartbeat: HeartbeatOptions = {}) {
    sub.on('message', (channel: string, raw: string) => {
      const handlers = this.channels.get(channel)?.handlers;
      if (!handlers) return;
      let msg: Record<string, unknown>;
      try { msg = JSON.parse(raw); } catch { return; }
      for (const h of handlers) {
        try { h(msg); } catch (err) { this.log.error({ err, channel }, 'event handler failed'); }
      }
    });
    // Not 'ready': closed on purpose ('end', at shutdown), or ioredis is reconnecting already.
    startHeartbeat(() => (sub.status === 'ready' ? sub.ping() : undefined), (err) => {
      if (sub.status === 'end') return;
      log.warn({ why: err.message }, 'Redis subscriber gave no answer to a ping; reconnecting');
      sub.disconnect(true);
    }, heartbeat);
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

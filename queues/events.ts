import type { Redis } from 'ioredis';
import type { Logger } from '../domain/logger.ts';

// Small wake-up notes between processes over Redis pub/sub. Postgres stays the source of truth:
// a subscriber that misses a note re-reads state there.
export type Handler = (message: Record<string, unknown>) => void;

export class EventBus {
  private handlers = new Map<string, Set<Handler>>();

  constructor(private readonly pub: Redis, private readonly sub: Redis, private readonly prefix: string, private readonly log: Logger) {
    sub.on('message', (channel: string, raw: string) => {
      const set = this.handlers.get(channel);
      if (!set) return;
      let msg: Record<string, unknown>;
      try { msg = JSON.parse(raw); } catch { return; }
      for (const h of set) {
        try { h(msg); } catch (err) { this.log.error({ err, channel }, 'event handler failed'); }
      }
    });
  }

  private channel(name: string) { return `${this.prefix}:${name}`; }

  async publish(name: string, message: Record<string, unknown>): Promise<void> {
    await this.pub.publish(this.channel(name), JSON.stringify(message));
  }

  async subscribe(name: string, handler: Handler): Promise<() => Promise<void>> {
    const ch = this.channel(name);
    let set = this.handlers.get(ch);
    if (!set) {
      set = new Set();
      this.handlers.set(ch, set);
      await this.sub.subscribe(ch);
    }
    set.add(handler);
    return async () => {
      set!.delete(handler);
      if (set!.size === 0 && this.handlers.get(ch) === set) {
        this.handlers.delete(ch);
        await this.sub.unsubscribe(ch).catch(() => undefined);
      }
    };
  }
}

// What counts shared through Redis (fleet-counts.ts, stream-places.ts) say of an outage: one warn
// line when Redis stops answering and one info line when it answers again, not a line a request.
import type { Logger } from '../domain/logger.ts';

export class RedisOutageLog {
  private down = false;
  private stopped = false;

  constructor(private readonly log: Logger, private readonly lost: string, private readonly back: string) {}

  /** How the last exchange with Redis went: `failed` its error, none when it answered. */
  note(failed?: Error): void {
    // Commands cut short by the connection closing at shutdown are no outage.
    if (this.stopped) return;
    if (failed && !this.down) this.log.warn({ err: { message: failed.message } }, this.lost);
    else if (!failed && this.down) this.log.info(this.back);
    this.down = Boolean(failed);
  }

  stop(): void {
    this.stopped = true;
  }
}

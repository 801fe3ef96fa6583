import pg from 'pg';
import type { Logger } from '../domain/logger.ts';
import { withTimeout } from '../domain/with-timeout.ts';

const RECONNECT_MS = 1000;

export interface ListenOptions {
  /**
   * How often the connection is asked a `select 1`. A LISTEN connection otherwise sends nothing, so
   * a NAT gateway or load balancer that drops idle connections silently (AWS's after 350 s) would
   * leave it dead without anyone knowing; the heartbeat keeps it busy and finds it dead if it is.
   */
  heartbeatMs?: number;
  /** Longest a connect, a LISTEN or a heartbeat may take before the connection counts as lost. */
  timeoutMs?: number;
}

// A dedicated connection that LISTENs on Postgres channels and reconnects when it is lost.
// Notifications sent while it was away are missed, so callers use it for wake-ups and cache
// invalidation that also have a time bound, never as the only record of anything.
export async function listenPg(
  url: string, channels: Record<string, (payload: string) => void>, log: Logger, { heartbeatMs = 30_000, timeoutMs = 10_000 }: ListenOptions = {},
): Promise<{ close(): Promise<void> }> {
  let client: pg.Client | undefined;
  let heartbeat: NodeJS.Timeout | undefined;
  let closed = false;
  const connect = async (): Promise<void> => {
    const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: timeoutMs });
    c.on('notification', (n) => {
      const handler = channels[n.channel];
      if (!handler) return;
      try {
        handler(n.payload ?? '');
      } catch (err) {
        log.warn({ err: { message: (err as Error).message }, channel: n.channel }, 'notification handler failed');
      }
    });
    // A failed attempt is retried by its rejection alone: when its 'error' and 'end' scheduled a
    // retry too, every failed attempt made two, and an outage of n seconds left 2^n connections.
    const duringConnect = () => undefined;
    c.on('error', duringConnect);
    try {
      await c.connect();
      for (const channel of Object.keys(channels)) await withTimeout(c.query(`LISTEN ${pg.escapeIdentifier(channel)}`), timeoutMs);
    } catch (err) {
      c.end().catch(() => undefined);
      throw err;
    }
    // Closed while connecting (a reconnect under way at shutdown): this connection is not wanted.
    if (closed) {
      c.end().catch(() => undefined);
      return;
    }
    c.off('error', duringConnect);
    let lost = false;
    let beat: NodeJS.Timeout | undefined;
    const onLost = (why: string) => {
      if (lost || closed) return;
      lost = true;
      clearInterval(beat);
      log.warn({ why, channels: Object.keys(channels) }, 'Postgres listener lost its connection; reconnecting');
      c.end().catch(() => undefined);
      reconnect();
    };
    c.on('error', (err) => onLost(err.message));
    c.on('end', () => onLost('connection ended'));
    let beating = false;
    beat = setInterval(() => {
      if (beating) return; // one at a time: pg queues queries on a connection
      beating = true;
      withTimeout(c.query('select 1'), timeoutMs).then(() => { beating = false; }, (err: Error) => onLost(`heartbeat: ${err.message}`));
    }, heartbeatMs).unref();
    client = c;
    heartbeat = beat;
  };
  const reconnect = (): void => {
    if (!closed) setTimeout(() => { if (!closed) void connect().catch(reconnect); }, RECONNECT_MS).unref();
  };
  await connect();
  return {
    async close() {
      closed = true;
      clearInterval(heartbeat);
      // A connection gone silent would never confirm its end.
      await withTimeout(client?.end() ?? Promise.resolve(), timeoutMs).catch(() => undefined);
    },
  };
}

import pg from 'pg';
import type { Logger } from '../domain/logger.ts';
import { withTimeout } from '../domain/with-timeout.ts';
import { HEARTBEAT_DEFAULTS, startHeartbeat, type HeartbeatOptions } from '../domain/heartbeat.ts';

const RECONNECT_MS = 1000;

// A dedicated connection that LISTENs on Postgres channels and reconnects when it is lost (found by
// a `select 1` heartbeat too; timeoutMs also bounds connects and LISTENs).
// Notifications sent while it was away are missed, so callers use it for wake-ups and cache
// invalidation that also have a time bound, or catch up in `onReconnect` (called once it listens
// again), never as the only record of anything.
export async function listenPg(
  url: string, channels: Record<string, (payload: string) => void>, log: Logger, opts: HeartbeatOptions & { onReconnect?: () => void } = {},
): Promise<{ close(): Promise<void> }> {
  const { timeoutMs } = { ...HEARTBEAT_DEFAULTS, ...opts };
  // Named in pg_stat_activity for the people who look there.
  const applicationName = `taskbridge listen ${Object.keys(channels).join(',')}`.slice(0, 63);
  let client: pg.Client | undefined;
  let stopHeartbeat: (() => void) | undefined;
  let closed = false;
  const connect = async (): Promise<void> => {
    const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: timeoutMs, application_name: applicationName });
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
    const onLost = (why: string) => {
      if (lost || closed) return;
      lost = true;
      stopHeartbeat?.();
      log.warn({ why, channels: Object.keys(channels) }, 'Postgres listener lost its connection; reconnecting');
      c.end().catch(() => undefined);
      reconnect();
    };
    c.on('error', (err) => onLost(err.message));
    c.on('end', () => onLost('connection ended'));
    client = c;
    stopHeartbeat = startHeartbeat(() => c.query('select 1'), (err) => onLost(`heartbeat: ${err.message}`), opts);
  };
  const reconnect = (): void => {
    if (!closed) setTimeout(() => { if (!closed) void connect().then(caughtUp, reconnect); }, RECONNECT_MS).unref();
  };
  const caughtUp = (): void => {
    if (closed) return;
    try {
      opts.onReconnect?.();
    } catch (err) {
      log.warn({ err: { message: (err as Error).message } }, 'Postgres listener: catching up after a reconnect failed');
    }
  };
  await connect();
  return {
    async close() {
      closed = true;
      stopHeartbeat?.();
      // A connection gone silent would never confirm its end.
      await withTimeout(client?.end() ?? Promise.resolve(), timeoutMs).catch(() => undefined);
    },
  };
}

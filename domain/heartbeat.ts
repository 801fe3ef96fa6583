import { withTimeout } from './with-timeout.ts';

// Connections that only listen (the Postgres listener, the Redis subscriber) send nothing of their
// own, so one dropped silently as idle by a NAT gateway or load balancer (AWS's after 350 s) would
// stay dead without anyone knowing. A heartbeat keeps such a connection busy and finds it dead if
// it is.
export interface HeartbeatOptions {
  /** How often the connection is asked something. */
  heartbeatMs?: number;
  /** Longest an answer (or a connect) may take before the connection counts as lost. */
  timeoutMs?: number;
}

export const HEARTBEAT_DEFAULTS: Required<HeartbeatOptions> = { heartbeatMs: 30_000, timeoutMs: 10_000 };

/**
 * Calls `ping` every `heartbeatMs`, one at a time (a connection queues its commands), and `onSilent`
 * when one gets no answer within `timeoutMs` or fails. `ping` may return undefined to skip a beat
 * (the connection is closed or already reconnecting). Returns the function that stops it.
 */
export function startHeartbeat(ping: () => Promise<unknown> | undefined, onSilent: (err: Error) => void, opts: HeartbeatOptions = {}): () => void {
  const { heartbeatMs, timeoutMs } = { ...HEARTBEAT_DEFAULTS, ...opts };
  let beating = false;
  const timer = setInterval(() => {
    if (beating) return;
    const answer = ping();
    if (!answer) return;
    beating = true;
    withTimeout(answer, timeoutMs).then(() => { beating = false; }, (err: Error) => {
      beating = false;
      onSilent(err);
    });
  }, heartbeatMs).unref();
  return () => clearInterval(timer);
}

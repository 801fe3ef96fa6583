// Reading a Retry-After header (429, 503): push deliveries hold a webhook's config that long, and
// `definition apply` waits that long before asking the target again.

// Longest Retry-After honoured: a webhook cannot park its updates for hours, and the recovery pass
// (workers/recover-push-deliveries.ts) counts on each retry waiting no longer than this or its backoff.
export const RETRY_AFTER_MAX_MS = 60_000;

// A Retry-After value (delay seconds or an HTTP date) in ms from now, capped; undefined when unreadable.
export function retryAfterMs(value: string | undefined, now = Date.now()): number | undefined {
  if (value === undefined) return undefined;
  const ms = /^\s*\d+\s*$/.test(value) ? Number(value) * 1000 : Date.parse(value) - now;
  return Number.isNaN(ms) ? undefined : Math.min(Math.max(ms, 0), RETRY_AFTER_MAX_MS);
}

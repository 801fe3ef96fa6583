// Failed authentications per client address: past AUTH_FAILURES_PER_MINUTE wrong keys in a minute,
// an address gets 429 for the rest of that minute instead of a key lookup. Keys are far too long to
// guess, so this is about load and noise: a flood of made-up keys otherwise costs a Postgres lookup
// and a log line each, and unlike a key's requests no rate limit applies to them. Counted across the
// API processes as the per-key limit is (queues/fleet-counts.ts); a key verified lately (cached) passes
// all the same, so a client sharing an address with a guesser keeps working while it keeps using its key.
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';

const WINDOW_MS = 60_000;
const countsOf = (services: Services) => services.fleetCounts.window('auth_failures', WINDOW_MS);

/** Throws 429 when the address has used up its failures for this minute. */
export function refuseIfBlocked(services: Services, address: string): void {
  const limit = services.cfg.AUTH_FAILURES_PER_MINUTE;
  const refusedForMs = limit ? countsOf(services).reached(address, limit) : 0;
  if (refusedForMs) {
    const seconds = Math.max(1, Math.ceil(refusedForMs / 1000));
    throw new RateLimited(refusedForMs, `Too many failed authentications from this address; retry in ${seconds} s`);
  }
}

/** Counts a wrong key presented from the address. */
export function countFailure(services: Services, address: string): void {
  if (services.cfg.AUTH_FAILURES_PER_MINUTE) countsOf(services).add(address);
}

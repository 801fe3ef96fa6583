// Failed authentications per client address: past AUTH_FAILURES_PER_MINUTE wrong keys in a minute,
// an address gets 429 for the rest of that minute instead of a key lookup. Keys are far too long to
// guess, so this is about load and noise: a flood of made-up keys otherwise costs a Postgres lookup
// and a log line each, and unlike a key's requests no rate limit applies to them. Counted in each API
// process's memory, as the per-key limit is; a key verified lately (cached) passes all the same, so
// a client sharing an address with a guesser keeps working while it keeps using its key.
import { RateLimiterMemory } from 'rate-limiter-flexible';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';

const WINDOW_S = 60;
const limiters = new WeakMap<Services, RateLimiterMemory>();

function limiterOf(services: Services): RateLimiterMemory | undefined {
  const points = services.cfg.AUTH_FAILURES_PER_MINUTE;
  if (points === 0) return undefined;
  let limiter = limiters.get(services);
  if (!limiter) limiters.set(services, (limiter = new RateLimiterMemory({ points, duration: WINDOW_S })));
  return limiter;
}

/** Throws 429 when the address has used up its failures for this minute. */
export async function refuseIfBlocked(services: Services, address: string): Promise<void> {
  const limiter = limiterOf(services);
  const seen = await limiter?.get(address);
  if (limiter && seen && seen.consumedPoints >= limiter.points) {
    const seconds = Math.max(1, Math.ceil(seen.msBeforeNext / 1000));
    throw new RateLimited(seen.msBeforeNext, `Too many failed authentications from this address; retry in ${seconds} s`);
  }
}

/** Counts a wrong key presented from the address. */
export async function countFailure(services: Services, address: string): Promise<void> {
  // Consuming past the limit rejects: the count is what matters here, not the answer.
  await limiterOf(services)?.consume(address).catch(() => undefined);
}

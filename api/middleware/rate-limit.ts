// Per-key rate limit (SPEC section 1: 429 rate_limited with Retry-After), after authentication.
// Counted across the API processes in one-second windows (queues/fleet-counts.ts).
import type { Middleware } from 'koa';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';
import type { Principal } from './auth.ts';

export function rateLimit(services: Services): Middleware {
  const limit = services.cfg.RATE_LIMIT_PER_SECOND;
  if (limit === 0) return (_ctx, next) => next();
  const counts = services.fleetCounts.window('rate', 1000);
  return async (ctx, next) => {
    const refusedForMs = counts.take((ctx.state.principal as Principal).id, limit);
    if (refusedForMs) throw new RateLimited(refusedForMs);
    await next();
  };
}

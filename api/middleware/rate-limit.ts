// Per-key rate limit (SPEC section 1: 429 rate_limited with Retry-After), after authentication.
// Counted across the API processes in one-second windows (queues/fleet-counts.ts).
import type { Middleware } from 'koa';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';
import type { Principal } from './auth.ts';

export function rateLimit(services: Services): Middleware {
  if (services.cfg.RATE_LIMIT_PER_SECOND === 0) return (_ctx, next) => next();
  return async (ctx, next) => {
    takeRequests(services, ctx.state.principal as Principal, 1);
    await next();
  };
}

/** Counts `n` requests of the key against RATE_LIMIT_PER_SECOND (the members of an MCP batch past its first); 429 if they do not all fit this second. */
export function takeRequests(services: Services, principal: Principal, n: number): void {
  const limit = services.cfg.RATE_LIMIT_PER_SECOND;
  if (limit === 0 || n === 0) return;
  const refusedForMs = services.fleetCounts.window('rate', 1000).take(principal.id, limit, n);
  if (refusedForMs) throw new RateLimited(refusedForMs);
}

// Per-key rate limit (SPEC section 1: 429 rate_limited with Retry-After), after authentication.
// Counted across the API processes in one-second windows (queues/fleet-counts.ts).
import type { Context, Middleware } from 'koa';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';
import type { Principal } from './auth.ts';

export function rateLimit(services: Services): Middleware {
  const limit = services.cfg.RATE_LIMIT_PER_SECOND;
  if (limit === 0) return (_ctx, next) => next();
  return async (ctx, next) => {
    const now = Date.now();
    const refusedForMs = services.fleetCounts.window('rate', 1000).take((ctx.state.principal as Principal).id, limit, 1, now);
    if (refusedForMs) throw new RateLimited(refusedForMs);
    ctx.state.rateTakenAt = now;
    await next();
  };
}

/**
 * Counts the members of an MCP batch past its first (the middleware took that one) against
 * RATE_LIMIT_PER_SECOND; if they do not all fit this second, gives the first back as well and 429:
 * a refused batch costs nothing, as a refused single request does.
 */
export function takeBatchRest(services: Services, ctx: Context, size: number): void {
  const limit = services.cfg.RATE_LIMIT_PER_SECOND;
  if (limit === 0 || size <= 1) return;
  const counts = services.fleetCounts.window('rate', 1000);
  const { id } = ctx.state.principal as Principal;
  const refusedForMs = counts.take(id, limit, size - 1);
  if (!refusedForMs) return;
  counts.giveBack(id, 1, ctx.state.rateTakenAt as number);
  throw new RateLimited(refusedForMs);
}

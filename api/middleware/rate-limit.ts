// Per-key rate limit (SPEC section 1: 429 rate_limited with Retry-After), after authentication.
// Counted across the API processes in one-second windows (queues/fleet-counts.ts).
import type { Context, Middleware } from 'koa';
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

/**
 * Counts the members of an MCP batch past its first (the middleware took that one, for its POST)
 * against RATE_LIMIT_PER_SECOND; 429 if they do not all fit this second. The POST stays counted: its
 * body was read and parsed, and a refusal that cost nothing would let a key send such bodies without end.
 */
export function takeBatchRest(services: Services, ctx: Context, size: number): void {
  const limit = services.cfg.RATE_LIMIT_PER_SECOND;
  if (limit === 0 || size <= 1) return;
  const refusedForMs = services.fleetCounts.window('rate', 1000).take((ctx.state.principal as Principal).id, limit, size - 1);
  if (refusedForMs) throw new RateLimited(refusedForMs);
}

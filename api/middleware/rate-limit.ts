// Per-key rate limit (SPEC section 1: 429 rate_limited with Retry-After), after authentication.
// Counted in each API process's memory: a shared count in Redis cost a round trip per request
// (about a third of intake throughput in bench:a2a), so with N API processes a key may make up
// to N times RATE_LIMIT_PER_SECOND requests in all.
import type { Middleware } from 'koa';
import { RateLimiterMemory, RateLimiterRes } from 'rate-limiter-flexible';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';
import type { Principal } from './auth.ts';

const limiters = new WeakMap<Services, RateLimiterMemory>();

function limiterOf(services: Services): RateLimiterMemory {
  let limiter = limiters.get(services);
  if (!limiter) limiters.set(services, (limiter = new RateLimiterMemory({ points: services.cfg.RATE_LIMIT_PER_SECOND, duration: 1 })));
  return limiter;
}

export function rateLimit(services: Services): Middleware {
  if (services.cfg.RATE_LIMIT_PER_SECOND === 0) return (_ctx, next) => next();
  const limiter = limiterOf(services);
  return async (ctx, next) => {
    try {
      await limiter.consume((ctx.state.principal as Principal).id);
    } catch (res) {
      if (res instanceof RateLimiterRes) throw new RateLimited(res.msBeforeNext);
      throw res;
    }
    await next();
  };
}

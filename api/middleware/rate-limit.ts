// Per-key rate limit (SPEC section 1: 429 rate_limited with Retry-After), after authentication.
// Counts live in Redis so every API process shares them. When Redis is away the limit is kept
// per process instead, so an outage neither stalls nor refuses requests.
import type { Middleware } from 'koa';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';
import type { Principal } from './auth.ts';

const limiters = new WeakMap<Services, RateLimiterRedis>();

function limiterOf(services: Services): RateLimiterRedis {
  let limiter = limiters.get(services);
  if (!limiter) {
    const points = services.cfg.RATE_LIMIT_PER_SECOND;
    limiter = new RateLimiterRedis({
      storeClient: services.redis,
      keyPrefix: `${services.cfg.QUEUE_PREFIX}:rate-limit`,
      points,
      duration: 1,
      rejectIfRedisNotReady: true,
      insuranceLimiter: new RateLimiterMemory({ points, duration: 1 }),
    });
    limiters.set(services, limiter);
  }
  return limiter;
}

export function rateLimit(services: Services): Middleware {
  if (services.cfg.RATE_LIMIT_PER_SECOND === 0) return (_ctx, next) => next();
  const limiter = limiterOf(services);
  return async (ctx, next) => {
    const { id } = ctx.state.principal as Principal;
    try {
      await limiter.consume(id);
    } catch (res) {
      if (res instanceof RateLimiterRes) throw new RateLimited(res.msBeforeNext);
      // Neither store answered: serve rather than refuse.
      services.log.warn({ err: { message: (res as Error)?.message } }, 'rate limit not checked');
    }
    await next();
  };
}

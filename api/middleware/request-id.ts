import { randomUUID } from 'node:crypto';
import type { Middleware } from 'koa';
import type { Logger } from '../../domain/logger.ts';

const VALID = /^[A-Za-z0-9._:-]{1,128}$/;

// A sane incoming X-Request-Id, else a new one (also for answers written outside Koa: api/client-errors.ts).
export const requestIdFor = (incoming: string | undefined): string => (incoming !== undefined && VALID.test(incoming) ? incoming : randomUUID());

// Echoes a sane incoming X-Request-Id or mints one; gives the request a child logger carrying it.
export function requestId(log: Logger): Middleware {
  return async (ctx, next) => {
    const id = requestIdFor(ctx.get('X-Request-Id'));
    ctx.state.requestId = id;
    ctx.state.log = log.child({ req_id: id });
    ctx.set('X-Request-Id', id);
    const started = performance.now();
    try {
      await next();
    } finally {
      ctx.state.log.info({ method: ctx.method, path: ctx.path, status: ctx.status, ms: Math.round((performance.now() - started) * 10) / 10 }, 'request');
    }
  };
}

import { randomUUID } from 'node:crypto';
import type { Middleware } from 'koa';
import type { Logger } from '../../domain/logger.ts';

const VALID = /^[A-Za-z0-9._:-]{1,128}$/;

// Echoes a sane incoming X-Request-Id or mints one; gives the request a child logger carrying it.
export function requestId(log: Logger): Middleware {
  return async (ctx, next) => {
    const incoming = ctx.get('X-Request-Id');
    const id = VALID.test(incoming) ? incoming : randomUUID();
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

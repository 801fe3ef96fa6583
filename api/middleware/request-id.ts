import { randomUUID } from 'node:crypto';
import type { Middleware } from 'koa';
import type { Logger } from '../../domain/logger.ts';

const VALID = /^[A-Za-z0-9._:-]{1,128}$/;

// A sane incoming X-Request-Id (a header as Node gives it, repeated or absent), else a new one (also
// for answers written outside Koa: api/client-errors.ts).
export const requestIdFor = (incoming: string | string[] | undefined): string => (typeof incoming === 'string' && VALID.test(incoming) ? incoming : randomUUID());

// Echoes a sane incoming X-Request-Id or mints one; gives the request a child logger carrying it.
export function requestId(log: Logger): Middleware {
  return async (ctx, next) => {
    const id = requestIdFor(ctx.get('X-Request-Id'));
    ctx.state.requestId = id;
    ctx.state.log = log.child({ req_id: id });
    ctx.set('X-Request-Id', id);
    await next();
  };
}

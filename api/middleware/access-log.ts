import type { ServerResponse } from 'node:http';
import type { Context, Middleware } from 'koa';

// The route pattern a request matched (`/api/task/v1/:task_id`), else `unmatched`: the request
// line's `route` and the /metrics label (bounded, unlike paths, which carry ids).
export const UNMATCHED = 'unmatched';
export const matchedRoute = (ctx: Context): string => String((ctx as { _matchedRoute?: string | RegExp })._matchedRoute ?? UNMATCHED);

// Answers written on the socket outside Koa while a request was in it (api/client-errors.ts: its body
// not arrived within API_REQUEST_TIMEOUT_MS, 408, or not valid HTTP, 400): what the client got, which
// its request line and /metrics give as its status rather than what Koa made of the closed connection.
const answeredOutsideKoa = new WeakMap<ServerResponse, number>();
export const markAnsweredOutsideKoa = (res: ServerResponse, status: number): void => void answeredOutsideKoa.set(res, status);
export const statusSent = (ctx: Context): number => answeredOutsideKoa.get(ctx.res) ?? ctx.status;

// For a router mounted below a base path (bull-board's), which matches its patterns without it:
// the route is named in full, so that it does not read as one of the API's.
export function prefixMatchedRoute(ctx: Context, base: string): void {
  const route = ctx as { _matchedRoute?: string | RegExp };
  if (typeof route._matchedRoute === 'string' && !route._matchedRoute.startsWith(base)) route._matchedRoute = `${base}${route._matchedRoute}`;
}

// A request target as logged where it is not parsed: without the user info, query and fragment
// (each may carry a credential). The user info goes first: it may hold a `?` or `#` itself.
export const loggedTarget = (target: string): string => target.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/]*@/i, '$1').split(/[?#]/)[0];

// The request's path; of a target that is no URL (refused: api/app.ts), loggedTarget.
function pathOf(ctx: Context): string {
  try {
    return ctx.path;
  } catch {
    return loggedTarget(ctx.originalUrl);
  }
}

// Load balancers' probes and Prometheus' scrapes come every few seconds to every process: answered
// well, their request lines are debug, or a fleet's log is mostly them. A failed one stays info.
const POLLED = new Set(['/_internal/v1/health', '/_internal/v1/ready', '/metrics']);

// A line a request (method, path, route, status, duration) on the request's logger (requestId's),
// whatever the answer; written once the inner middleware has answered or thrown.
export function accessLog(): Middleware {
  return async (ctx, next) => {
    const started = performance.now();
    try {
      await next();
    } finally {
      const status = statusSent(ctx);
      const level = status < 400 && POLLED.has(matchedRoute(ctx)) ? 'debug' : 'info';
      ctx.state.log[level]({ method: ctx.method, path: pathOf(ctx), route: matchedRoute(ctx), status, ms: Math.round((performance.now() - started) * 10) / 10 }, 'request');
    }
  };
}

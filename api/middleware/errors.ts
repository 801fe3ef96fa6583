import type { Middleware } from 'koa';
import { AppError, jsonErrorWithoutExcerpt, logFailure, MethodNotAllowed, raceConflict, unavailability } from '../../domain/errors.ts';

// The one place where errors become HTTP responses with the Error body. `slashed`: the parameter a
// path no route matches would fill had its '/' been percent-encoded (api/route.ts slashedParameter).
export function errorHandler(slashed: (method: string, path: string) => string | undefined = () => undefined): Middleware {
  return async (ctx, next) => {
    try {
      await next();
      // The router answers 501 for a method it knows no route for at all (PROPFIND, TRACE): to a client
      // that is a wrong method on a known path, or an unknown path, as for any other method.
      if ((ctx.status === 405 || ctx.status === 501) && !ctx.body && ctx.response.get('Allow')) {
        throw new MethodNotAllowed(`Method ${ctx.method} is not allowed on ${ctx.path}`, ctx.response.get('Allow'));
      }
      if ((ctx.status === 404 || ctx.status === 501) && !ctx.body) {
        const param = slashed(ctx.method, ctx.path);
        const hint = param ? ` (if the ${param.replace(/_/g, ' ')} holds '/', send it percent-encoded: %2F)` : '';
        throw new AppError(404, 'not_found', `No route for ${ctx.method} ${ctx.path}${hint}`, { resource: 'route', id: ctx.path });
      }
    } catch (err) {
      const e = toAppError(err);
      logFailure(ctx.state.log, err, e, 'request failed');
      ctx.status = e.status;
      for (const [k, v] of Object.entries(e.headers)) ctx.set(k, v);
      ctx.body = errorBody(e);
    }
  };
}

// The Error body every non-2xx answer carries (also written by api/client-errors.ts).
export const errorBody = (e: AppError) => ({ message: e.message, data: { code: e.code, ...e.data } });

function toAppError(err: unknown): AppError {
  if (err instanceof AppError) return err;
  const e = err as { status?: number; expose?: boolean; message?: string; code?: string; name?: string };
  // The client went away mid-body: nothing to answer, and not our failure (nor Postgres or Redis
  // resetting a connection, which is the same code).
  if (e?.code === 'ECONNRESET' && e.message === 'aborted') return new AppError(400, 'invalid_request', 'The request was aborted before its body arrived');
  const known = raceConflict(err) ?? unavailability(err);
  if (known) return known;
  // Client errors of libraries (koa's, and co-body's unparsable JSON in the queue dashboard).
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500 && (e.expose || err instanceof SyntaxError)) {
    const message = err instanceof SyntaxError ? jsonErrorWithoutExcerpt(err.message) : e.message;
    return new AppError(e.status, e.status === 413 ? 'payload_too_large' : 'invalid_request', message ?? 'Bad request');
  }
  return new AppError(500, 'internal', 'Internal server error');
}

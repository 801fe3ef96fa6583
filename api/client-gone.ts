// A signal for calls that work on behalf of a waiting client (an A2A call, a bridge invocation):
// aborts when the client disconnects before its response is complete, also when it already has
// (its 'close' came while the body was read: a listener added now would never hear it).
import type { Context } from 'koa';

export function clientGone(ctx: Context): AbortSignal {
  const ac = new AbortController();
  if (ctx.res.destroyed) ac.abort();
  else ctx.res.once('close', () => { if (!ctx.res.writableFinished) ac.abort(); });
  return ac.signal;
}

// The signal of one outbound call made on behalf of a longer-lived one (an agent run's, a client's
// request): it aborts when that one does, when `abort` is called (the call's own timeout), and the
// link is let go by `release` once the call is over. Not AbortSignal.any: on Node 20 the longer-lived
// signal keeps an entry for every signal made from it for as long as it lives (nodejs/node#55351),
// so a run that polls a remote agent's task, or calls a provider, for hours grew with every call.
export interface CallSignal {
  signal: AbortSignal;
  abort(reason?: unknown): void;
  release(): void;
}

export function callSignal(caller: AbortSignal | undefined): CallSignal {
  const own = new AbortController();
  const follow = () => own.abort(caller!.reason);
  if (caller?.aborted) follow();
  else caller?.addEventListener('abort', follow, { once: true });
  return {
    signal: own.signal,
    abort: (reason) => own.abort(reason),
    release: () => caller?.removeEventListener('abort', follow),
  };
}

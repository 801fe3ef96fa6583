// The longest a Node timer can wait (about 24.8 days); a longer one fires at once (Node sets it to
// 1 ms), turning a long wait into none. Duration settings are at most this (domain/config.ts); a timer
// that adds a margin to one is cut to it.
export const MAX_TIMER_MS = 2 ** 31 - 1;
export const timerMs = (ms: number) => Math.min(ms, MAX_TIMER_MS);

// A promise that rejects once `ms` have passed without an answer (the work itself is not stopped).
export const withTimeout = <T>(p: Promise<T>, ms: number): Promise<T> =>
  Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms).unref())]);

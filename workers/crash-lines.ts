// What the worker process says of a promise an agent module left unawaited and of an exception
// thrown outside every promise: masked with the secrets runs read (secrets-read.ts) and cut, as a
// run's failure is. Nothing may throw from these handlers: that would end the process after all.
import type { Logger } from '../domain/logger.ts';
import { throttledWarn } from '../domain/throttled-warn.ts';
import { cutReason, failureReason } from './fail-run.ts';
import { maskSecretsRead } from './secrets-read.ts';

const describedSafely = (thrown: unknown): string => {
  try {
    return cutReason(maskSecretsRead(failureReason(thrown)));
  } catch {
    return 'a value that cannot be read (a getter or proxy trap threw)';
  }
};

export function logCrashesMasked(log: Logger): void {
  // An unawaited call that fails (a write refused after a cancel, say) must not take down the process
  // and every other run on it, as Node's default for unhandled rejections would. Its reason may quote
  // a secret an agent read, and be megabytes long; at most one line a second (masking is costly, and
  // an agent may leave one such call per run).
  const warnUnhandled = throttledWarn(log, 'unhandled promise rejection (an agent call not awaited?)', 1000);
  process.on('unhandledRejection', (reason) => warnUnhandled(() => ({ reason: describedSafely(reason) })));
  // An exception thrown in a timer an agent module set still ends the process, as Node's default
  // does, but logged as a rejection is: Node would print it, stack and all, unmasked.
  process.on('uncaughtException', (err) => {
    try {
      let stack: string | undefined;
      try {
        const s = (err as { stack?: unknown } | null)?.stack;
        if (typeof s === 'string') stack = describedSafely(s);
      } catch { /* a getter or proxy trap that throws: the line goes without it */ }
      log.fatal({ reason: describedSafely(err), stack }, 'uncaught exception: the worker exits (an agent module\'s timer or callback threw?)');
    } finally {
      process.exit(1);
    }
  });
}

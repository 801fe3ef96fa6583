// A failure that repeats while a backing service is away is logged at warn once a minute at most:
// unthrottled, BullMQ's workers report every failed Redis command (some 50,000 warn lines an hour a
// process, found by an ops audit), and the outbox a line per deferred send and per sweep. The
// others are logged at debug, and the next warn line counts them (`errors_since_last_line`).
import type { Logger } from './logger.ts';

// The monotonic clock: a wall clock stepped back (NTP) would keep every line at debug meanwhile.
// Fields given as a function are made only for a line that is written (costly ones: masked text).
type Fields = Record<string, unknown> | (() => Record<string, unknown>);
export function throttledWarn(log: Logger, msg: string, everyMs = 60_000): (fields: Fields) => void {
  let warnedAt = -Infinity;
  let quieted = 0;
  const made = (fields: Fields) => (typeof fields === 'function' ? fields() : fields);
  return (fields) => {
    if (performance.now() - warnedAt < everyMs) {
      quieted += 1;
      if (log.isLevelEnabled('debug')) log.debug(made(fields), msg);
      return;
    }
    log.warn({ ...made(fields), ...(quieted ? { errors_since_last_line: quieted } : {}) }, msg);
    // From the line's end: fields that took long to make (a masker built) do not use up the interval.
    warnedAt = performance.now();
    quieted = 0;
  };
}

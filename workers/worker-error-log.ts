// BullMQ reports each failed Redis command of a worker as an 'error': while Redis is away every queue's
// worker fails several a second (some 50,000 warn lines an hour a process, found by an ops audit).
// So a queue's errors are logged at warn once a minute at most, each such line counting those logged
// at debug since the last one.
import type { Logger } from '../domain/logger.ts';

export function workerErrorLog(log: Logger, queue: string, everyMs = 60_000): (err: Error) => void {
  let warnedAt = -Infinity;
  let quieted = 0;
  return (err) => {
    const fields = { err: { message: err.message }, queue };
    if (Date.now() - warnedAt < everyMs) {
      quieted += 1;
      log.debug(fields, 'worker error');
      return;
    }
    warnedAt = Date.now();
    log.warn({ ...fields, ...(quieted ? { errors_since_last_line: quieted } : {}) }, 'worker error');
    quieted = 0;
  };
}

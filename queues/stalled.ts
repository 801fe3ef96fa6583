// How BullMQ fails a job that stalled more than maxStalledCount times: its stalled-job check marks it,
// and the next worker to take it fails it with this UnrecoverableError (a deferred failure) without
// running the processor. Matched exactly: an agent's or key job's own error may mention stalling and
// is an ordinary failure, retried.
const STALLED_TOO_OFTEN = 'job stalled more than allowable limit';

export const stalledTooOften = (err: Error): boolean => err.name === 'UnrecoverableError' && err.message === STALLED_TOO_OFTEN;

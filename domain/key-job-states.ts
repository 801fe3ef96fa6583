// A key job's kinds and states, shared by its table's queries, its processors and its API shape.
export const MIGRATE_DEKS = 'migrate-deks';
export const ROTATE_ALIAS = 'rotate-alias';

// A key job is open (at most one migration per source key, one rotation per alias) until it has ended.
export const KEY_JOB_OPEN = ['queued', 'running'] as const;
export const KEY_JOB_ENDED = ['completed', 'failed', 'canceled'] as const;
export type KeyJobStatus = (typeof KEY_JOB_OPEN)[number] | (typeof KEY_JOB_ENDED)[number];

// A job its worker finds ended, not by a cancel: another worker took it over (this one stalled past
// its lock) and ended it, and said so.
export const endedElsewhere = (status: KeyJobStatus): boolean => status === 'completed' || status === 'failed';

export const isOpenKeyJob = (status: KeyJobStatus): boolean => (KEY_JOB_OPEN as readonly string[]).includes(status);

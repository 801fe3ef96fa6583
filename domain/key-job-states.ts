// A key job's kinds and states, shared by its table's queries, its processors and its API shape.
export const MIGRATE_DEKS = 'migrate-deks';
export const ROTATE_ALIAS = 'rotate-alias';

// A key job is open (at most one migration per source key, one rotation per alias) until it has ended.
export const KEY_JOB_OPEN = ['queued', 'running'] as const;
export const KEY_JOB_ENDED = ['completed', 'failed', 'canceled'] as const;
export type KeyJobStatus = (typeof KEY_JOB_OPEN)[number] | (typeof KEY_JOB_ENDED)[number];

export const isOpenKeyJob = (status: KeyJobStatus): boolean => (KEY_JOB_OPEN as readonly string[]).includes(status);

// Refreshing OAuth user credentials before they expire (SPEC.md section 7). Workers find the
// credentials whose next_rotation_time has passed and enqueue one job per credential (the job id),
// so a credential is never refreshed twice at once; the job exchanges the refresh
// token at the provider's token endpoint and writes the new tokens over the old ones. When the
// provider answers invalid_grant, the credential has no refresh token, or the last attempt fails,
// the instance becomes refresh_failed, unless the credential changed since the job read it: only
// brokering again revives it (or another run of the same refresh storing the tokens it got for the
// refresh token this run was refused). New tokens whose write fails
// for a transient reason are written again for CREDENTIAL_REFRESH_STORE_RETRY_MS, and tokens still
// not stored are kept for the job's next attempt on the same worker (UnstoredTokens): most providers
// rotate refresh tokens, so an attempt that exchanged the spent one again would end refresh_failed.
import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Queue } from 'bullmq';
import type { Services } from '../services.ts';
import * as repo from '../../db/bridge.ts';
import { writeUnderAlias } from '../keyring.ts';
import { credentialDef, providerDef } from './catalog.ts';
import { nextRotationTime, resourceServerCredential, sealCredential, unsealCredential } from './credentials.ts';
import { isInvalidGrant, refusal, requestedScopes, requestToken, withTokens } from './oauth-token.ts';
import { cappedBackoffMs, type JobPayloads } from '../../queues/names.ts';
import type { Config } from '../config.ts';
import type { Plain } from './types.ts';
import { outageOf, unavailability } from '../errors.ts';
import { timerMs } from '../with-timeout.ts';

type RefreshServices = Pick<Services, 'db' | 'cfg' | 'log' | 'bus'>;
export type RefreshOutcome = 'refreshed' | 'not due' | 'gone' | 'refresh_failed';

// Tokens a worker process obtained and has not stored, by credential id: from the token endpoint's
// answer, the refresh token they were exchanged for is spent, so while the credential still holds the
// value the exchange started from the job's next attempt on this process stores these rather than
// exchange it again. That value whole, not its refresh token: a provider that sends no new refresh
// token leaves it as it was when another worker refreshed the credential since, and these tokens,
// older than that worker's, would overwrite them. This only narrows the window in which they are
// lost: they live in this process's memory alone (while Postgres is out of reach nothing durable can
// hold them), so an attempt taken by another worker, or this process exiting (killed, or a stop that
// outlasts the store's retries) before the commit, still loses them.
type Unstored = { from: string; fresh: Plain; next: Date | null; readAt: Date };
export class UnstoredTokens {
  readonly #kept = new Map<string, Unstored & { timer: NodeJS.Timeout }>();
  readonly #keepMs: number;

  // Each is dropped once no attempt of its job can still come for it: else the refresh tokens of
  // credentials whose later jobs ran on other workers, or that were deleted, stayed here for good.
  // Three times an attempt and the longest backoff before the next, from when one last took them.
  constructor(cfg: Config) {
    this.#keepMs = 3 * (attemptBoundMs(cfg) + cappedBackoffMs(cfg, cfg.CREDENTIAL_REFRESH_BACKOFF_MS, Math.max(cfg.CREDENTIAL_REFRESH_ATTEMPTS - 1, 1)));
  }

  // The tokens kept for the credential if `value` (its decrypted value, as the job read it) is the one
  // their exchange started from; kept for another bound from now, for the attempt that takes them.
  take(credentialId: string, value: Plain): Unstored | undefined {
    const kept = this.#kept.get(credentialId);
    if (!kept || kept.from !== digest(value)) return undefined;
    this.keep(credentialId, kept);
    return kept;
  }

  keep(credentialId: string, tokens: Unstored): void {
    this.delete(credentialId);
    const timer = setTimeout(() => this.#kept.delete(credentialId), timerMs(this.#keepMs)).unref();
    this.#kept.set(credentialId, { ...tokens, timer });
  }

  delete(credentialId: string): void {
    clearTimeout(this.#kept.get(credentialId)?.timer);
    this.#kept.delete(credentialId);
  }
}

// A credential's decrypted value as a digest, its members in one order whatever the object's: kept
// rather than the value, which holds tokens.
const digest = (value: Plain): string => createHash('sha256').update(JSON.stringify(value, (_key, v: unknown) => (
  v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v))).digest('base64url');

// However short a lifetime the provider announces (expires_in 0: expired already), a credential just
// refreshed is not due again sooner: a refresh a minute at most, not one each scan.
const MIN_REFRESH_INTERVAL_MS = 60_000;
// The writes of new tokens back off so; the job's lock is renewed meanwhile (BullMQ,
// renew-retaken-lock.ts).
const STORE_BACKOFF_MS = { first: 250, max: 4000 };

// How long one attempt of a queued refresh may take: its token request (BRIDGE_TIMEOUT_MS), its
// writes of the new tokens (CREDENTIAL_REFRESH_STORE_RETRY_MS) and, should its worker stop, the wait
// before another takes the job over (WORKER_LOCK_MS, WORKER_STALLED_CHECK_MS). The scan skips a
// credential it queued for this long, and an attempt that fails extends that by its backoff
// (refreshRetrying); then the scan takes it again: a job lost with Redis's data is queued anew within
// about an attempt and a backoff (with the defaults, well within the 5 minutes its tokens have left,
// REFRESH_AHEAD_MS), one still there is not added twice (its id).
const attemptBoundMs = (cfg: Config) => cfg.BRIDGE_TIMEOUT_MS + cfg.CREDENTIAL_REFRESH_STORE_RETRY_MS + cfg.WORKER_LOCK_MS + cfg.WORKER_STALLED_CHECK_MS;

// A job per due credential, its id the credential's: while one waits or runs, workers scanning
// together add no other (jobs of this queue are removed when they end, so the next due time can
// have its own). Each due credential once, however many instances share it, the earliest due first,
// and not again while its refresh may still be under way (it may be retrying at a provider that is down).
export async function enqueueDueRefreshes(s: Pick<Services, 'db' | 'cfg'>, queue: Queue<JobPayloads['credential-refresh']>): Promise<number> {
  const due = await repo.markDueCredentialRefreshes(s.db, s.cfg.CREDENTIAL_REFRESH_SCAN_LIMIT, attemptBoundMs(s.cfg));
  if (!due.length) return 0;
  try {
    await queue.addBulk(due.map((c) => ({ name: 'refresh', data: { credential_id: c.id }, opts: { jobId: `refresh_${c.id}` } })));
  } catch (err) {
    // Not queued: taken again by the next scan, not once the bound passes (unless this fails too).
    await repo.unmarkCredentialRefreshes(s.db, due.map((c) => c.id)).catch(() => undefined);
    throw err;
  }
  return due.length;
}

// An attempt failed and is retried after `backoffMs`: the scan goes on skipping the credential until the
// next attempt may have ended. Not extended (Postgres out of reach), the mark passes sooner and the scan
// adds the job again, which is still there under its id: nothing is queued twice.
export async function refreshRetrying(s: RefreshServices, credentialId: string, backoffMs: number): Promise<void> {
  await repo.extendCredentialRefreshMark(s.db, credentialId, backoffMs + attemptBoundMs(s.cfg)).catch((err: Error) => {
    s.log.warn({ credential_id: credentialId, err: { message: err.message } }, 'could not extend the refresh scan\'s skip of a credential whose refresh is retried');
  });
}

// The value the job read, when it got that far: only while the credential still holds it is the
// instance marked. A stalled job run twice exchanges the same refresh token twice; with a provider
// that rotates them, one run stores new tokens and the other is refused, and must not undo that.
type Seen = { value?: Record<string, unknown> };

async function giveUp(s: RefreshServices, credentialId: string, seen: Seen, reason: string): Promise<RefreshOutcome> {
  // The refresh is over, whether or not the credential changed since: the scan's mark goes with it,
  // or an instance that shares the credential later (or a revived one) waited for the mark to lapse.
  const instances = await s.db.transaction(async (trx) => {
    const marked = await repo.setInstanceStatusOfUserCredential(trx, credentialId, seen.value, 'refresh_failed');
    await repo.unmarkCredentialRefreshes(trx, [credentialId]);
    return marked;
  });
  if (seen.value && !instances.length) {
    s.log.info({ credential_id: credentialId, reason }, 'credential refresh failed, but the credential changed since this job read it (refreshed or brokered again): the instance is not marked');
    return 'not due';
  }
  s.log.warn({ credential_id: credentialId, provider_instance_ids: instances, reason }, 'credential refresh gave up: instance is refresh_failed');
  return 'refresh_failed';
}

export async function refreshCredential(s: RefreshServices, credentialId: string, finalAttempt: boolean, unstored: UnstoredTokens): Promise<RefreshOutcome> {
  const seen: Seen = {};
  try {
    const outcome = await refresh(s, credentialId, seen, unstored, finalAttempt);
    unstored.delete(credentialId);
    return outcome;
  } catch (err) {
    // Tokens not stored stay for the next attempt.
    if (!finalAttempt) throw err;
    // Whatever failed, the last attempt leaves the instance marked rather than silently stale.
    unstored.delete(credentialId);
    return giveUp(s, credentialId, seen, (err as Error).message);
  }
}

// A refresh job that ended for good without the last attempt's give-up above: one failed before its
// last attempt (an UnrecoverableError, a backoff answering -1) or whose give-up failed. The instance
// is marked as that give-up would have, while the credential is still due and holds the value read
// here: a run of the job still going that stores new tokens later revives it, as after another run's
// give-up. Run again, it marks nothing more. Not for a job that stalled too often (requeueRefresh).
export async function abandonRefresh(s: RefreshServices, credentialId: string, reason: string): Promise<RefreshOutcome> {
  const due = await repo.credentialDueForRefresh(s.db, credentialId);
  if (!due) return 'gone';
  if (!due.due) return 'not due';
  return giveUp(s, credentialId, { value: due.row.value }, reason);
}

// A refresh job that stalled too often (its workers killed or blocked during it) says nothing of the
// credential, and refresh_failed would hold until the user consents again: only the scan's mark ends,
// so the next scan queues the refresh again if the credential is still due.
export async function requeueRefresh(s: RefreshServices, credentialId: string, reason: string): Promise<void> {
  await repo.unmarkCredentialRefreshes(s.db, [credentialId]);
  s.log.warn({ credential_id: credentialId, reason }, 'credential refresh job stalled too often (its workers stopped during it): not given up, the instance is left as it is; the next scan queues the refresh again');
}

async function refresh(s: RefreshServices, credentialId: string, seen: Seen, unstored: UnstoredTokens, finalAttempt: boolean): Promise<RefreshOutcome> {
  // Due by the database's clock, the one the scan used.
  const due = await repo.credentialDueForRefresh(s.db, credentialId);
  if (!due) return 'gone';
  if (!due.due) return 'not due'; // refreshed since the job was queued
  const { row, instance, readAt } = due;
  seen.value = row.value;
  const provider = providerDef(instance.provider_controller_type_id);
  const cc = credentialDef(provider, instance.credential_controller_type_id);
  const user = await unsealCredential(s, cc, row);
  if (typeof user.refresh_token !== 'string') return giveUp(s, credentialId, seen, 'the credential has no refresh token');
  // Kept tokens whose exchange started from another value than the credential's are stale (tokens
  // stored since, or brokered again).
  let tokens = unstored.take(credentialId, user);
  if (!tokens) {
    const { plain: rs } = await resourceServerCredential(s, cc, instance);
    const answer = await requestToken(s.cfg, provider, rs, { grant_type: 'refresh_token', refresh_token: user.refresh_token });
    if (answer.status >= 400 && isInvalidGrant(answer)) return giveUp(s, credentialId, seen, 'the provider answered invalid_grant');
    if (answer.status >= 400) throw refusal('refresh token', answer);
    const fresh = withTokens(answer, user, requestedScopes(provider, rs));
    const rotation = nextRotationTime(cc, 'user', fresh);
    tokens = { from: digest(user), fresh, next: rotation && new Date(Math.max(rotation.getTime(), Date.now() + MIN_REFRESH_INTERVAL_MS)), readAt };
    // Kept before anything else can fail.
    unstored.keep(credentialId, tokens);
  }
  const { fresh, next, readAt: exchangedAfter } = tokens;
  // The tokens just obtained must not be lost: the value may have been sealed anew meanwhile (an
  // alias rotation), so the write is retried over what is there now, as long as it is still this
  // instance's credential (brokering again replaces it with another); and a write that fails for a
  // transient reason is tried again.
  const storing = storeRetrier(s, { credential_id: credentialId, provider_instance_id: instance.id }, finalAttempt);
  let current: repo.CredentialRow | undefined = row;
  for (let tries = 0; tries < 3; tries++) {
    if (!current) return 'gone';
    const base: repo.CredentialRow = current;
    // Another run of this refresh that was refused the refresh token this one spent may have given
    // up before this write (its check holds the credential row as this write does, so it cannot
    // land after), and after this run read the credential (it was refused once this run's exchange
    // spent the token): what it marked is undone with the write.
    const written = await storing(() => writeUnderAlias(s, base.dek_alias, async (trx, dekId) => {
      const replaced = await repo.replaceCredentialValue(trx, base.id, base.value, {
        value: await sealCredential(s, cc, 'user', fresh, dekId, trx), dek_id: dekId, next_rotation_time: next,
      });
      return replaced && { revived: await repo.reviveRefreshFailedInstances(trx, base.id, exchangedAfter) };
    }));
    if (written) {
      s.log.info({ credential_id: credentialId, provider_instance_id: instance.id, ...(written.revived.length ? { revived_provider_instance_ids: written.revived } : {}) }, 'credential refreshed');
      return 'refreshed';
    }
    current = (await storing(() => repo.credentialDueForRefresh(s.db, credentialId)))?.row;
  }
  throw new Error('the credential kept changing while it was being refreshed');
}

// Runs the steps that store refreshed tokens, each tried again with backoff while Postgres is out of
// reach or its statements time out (a lock held long), until CREDENTIAL_REFRESH_STORE_RETRY_MS after
// the first such failure. Logged once when retrying starts, and at error when the attempt gives up on
// them, saying what becomes of them: kept for the next attempt, or dropped with the last (never the
// tokens: the errors of pg and knex name no values).
function storeRetrier(s: RefreshServices, ids: Record<string, string>, finalAttempt: boolean) {
  const seconds = s.cfg.CREDENTIAL_REFRESH_STORE_RETRY_MS / 1000;
  let deadline: number | undefined;
  return async <T>(step: () => Promise<T>): Promise<T> => {
    for (let wait = STORE_BACKOFF_MS.first; ; wait = Math.min(wait * 2, STORE_BACKOFF_MS.max)) {
      try {
        return await step();
      } catch (err) {
        if (!unavailability(err)) throw err;
        const failure = { ...ids, reason: (err as Error).message, service: outageOf(err) };
        if (deadline === undefined) {
          deadline = Date.now() + s.cfg.CREDENTIAL_REFRESH_STORE_RETRY_MS;
          s.log.warn(failure, `could not store the refreshed tokens; retrying for up to ${seconds} s`);
        }
        if (Date.now() >= deadline) {
          s.log.error(failure, finalAttempt
            ? `the refreshed tokens could not be stored within ${seconds} s, and this was the job's last attempt: they are dropped and the refresh gives up, which makes the instance refresh_failed unless the credential changed since: then, once Postgres answers again, broker its user credential again`
            : `the refreshed tokens could not be stored within ${seconds} s: kept for the job's next attempt on this worker; should another worker take that attempt, or this one stop first, they are lost, and a provider that rotates refresh tokens refuses the old one, which makes the instance refresh_failed: then, once Postgres answers again, broker its user credential again`);
          throw err;
        }
        await sleep(Math.min(wait, deadline - Date.now()));
      }
    }
  };
}

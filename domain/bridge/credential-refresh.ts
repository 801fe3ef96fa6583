// Refreshing OAuth user credentials before they expire (SPEC.md section 7). Workers find the
// credentials whose next_rotation_time has passed and enqueue one job per credential (the job id),
// so a credential is never refreshed twice at once; the job exchanges the refresh
// token at the provider's token endpoint and writes the new tokens over the old ones. When the
// provider answers invalid_grant, the credential has no refresh token, or the last attempt fails,
// the instance becomes refresh_failed: only brokering again revives it.
import type { Queue } from 'bullmq';
import type { Services } from '../services.ts';
import * as repo from '../../db/bridge.ts';
import { writeUnderAlias } from '../keyring.ts';
import { credentialDef, providerDef } from './catalog.ts';
import { nextRotationTime, resourceServerCredential, sealCredential, unsealCredential } from './credentials.ts';
import { isInvalidGrant, refusal, requestedScopes, requestToken, withTokens } from './oauth-token.ts';
import type { JobPayloads } from '../../queues/names.ts';

type RefreshServices = Pick<Services, 'db' | 'cfg' | 'log' | 'bus'>;
export type RefreshOutcome = 'refreshed' | 'not due' | 'gone' | 'refresh_failed';

const PAGE = 500;
// However short a lifetime the provider announces (expires_in 0: expired already), a credential just
// refreshed is not due again sooner: a refresh a minute at most, not one each scan.
const MIN_REFRESH_INTERVAL_MS = 60_000;

// A job per due credential, its id the credential's: while one waits or runs, workers scanning
// together add no other (jobs of this queue are removed when they end, so the next due time can
// have its own).
export async function enqueueDueRefreshes(s: Pick<Services, 'db'>, queue: Queue<JobPayloads['credential-refresh']>): Promise<number> {
  const due = await repo.dueCredentialRefreshes(s.db, PAGE);
  if (due.length) {
    await queue.addBulk(due.map((c) => ({ name: 'refresh', data: { credential_id: c.id }, opts: { jobId: `refresh_${c.id}` } })));
  }
  return due.length;
}

async function giveUp(s: RefreshServices, credentialId: string, reason: string): Promise<RefreshOutcome> {
  const instances = await repo.setInstanceStatusOfUserCredential(s.db, credentialId, 'refresh_failed');
  s.log.warn({ credential_id: credentialId, provider_instance_ids: instances, reason }, 'credential refresh gave up: instance is refresh_failed');
  return 'refresh_failed';
}

export async function refreshCredential(s: RefreshServices, credentialId: string, finalAttempt: boolean): Promise<RefreshOutcome> {
  try {
    return await refresh(s, credentialId);
  } catch (err) {
    // Whatever failed, the last attempt leaves the instance marked rather than silently stale.
    if (finalAttempt) return giveUp(s, credentialId, (err as Error).message);
    throw err;
  }
}

async function refresh(s: RefreshServices, credentialId: string): Promise<RefreshOutcome> {
  // Due by the database's clock, the one the scan used.
  const due = await repo.credentialDueForRefresh(s.db, credentialId);
  if (!due) return 'gone';
  if (!due.due) return 'not due'; // refreshed since the job was queued
  const { row, instance } = due;
  const provider = providerDef(instance.provider_controller_type_id);
  const cc = credentialDef(provider, instance.credential_controller_type_id);
  const user = await unsealCredential(s, cc, row);
  if (typeof user.refresh_token !== 'string') return giveUp(s, credentialId, 'the credential has no refresh token');
  const { plain: rs } = await resourceServerCredential(s, cc, instance);
  const answer = await requestToken(s.cfg, provider, rs, { grant_type: 'refresh_token', refresh_token: user.refresh_token });
  if (answer.status >= 400 && isInvalidGrant(answer)) return giveUp(s, credentialId, 'the provider answered invalid_grant');
  if (answer.status >= 400) throw refusal('refresh token', answer);
  const fresh = withTokens(answer, user, requestedScopes(provider, rs));
  const rotation = nextRotationTime(cc, 'user', fresh);
  const next = rotation && new Date(Math.max(rotation.getTime(), Date.now() + MIN_REFRESH_INTERVAL_MS));
  // The tokens just obtained must not be lost: the value may have been sealed anew meanwhile (an
  // alias rotation), so the write is retried over what is there now, as long as it is still this
  // instance's credential (brokering again replaces it with another).
  let current: repo.CredentialRow | undefined = row;
  for (let tries = 0; tries < 3; tries++) {
    if (!current) return 'gone';
    const base: repo.CredentialRow = current;
    const written = await writeUnderAlias(s, base.dek_alias, async (trx, dekId) => repo.replaceCredentialValue(trx, base.id, base.value, {
      value: await sealCredential(s, cc, 'user', fresh, dekId, trx), dek_id: dekId, next_rotation_time: next,
    }));
    if (written) {
      s.log.info({ credential_id: credentialId, provider_instance_id: instance.id }, 'credential refreshed');
      return 'refreshed';
    }
    current = (await repo.credentialDueForRefresh(s.db, credentialId))?.row;
  }
  throw new Error('the credential kept changing while it was being refreshed');
}

// Refreshing OAuth user credentials before they expire (SPEC.md section 7). Workers find the
// credentials whose next_rotation_time has passed and enqueue one job per credential and due time
// (the job id), so a credential is never refreshed twice at once; the job exchanges the refresh
// token at the provider's token endpoint and writes the new tokens over the old ones. When the
// provider answers invalid_grant, the credential has no refresh token, or the last attempt fails,
// the instance becomes refresh_failed: only brokering again revives it.
import type { Queue } from 'bullmq';
import type { Services } from '../services.ts';
import * as repo from '../../db/bridge.ts';
import { writeUnderAlias } from '../keyring.ts';
import { credentialDef, providerDef } from './catalog.ts';
import { nextRotationTime, sealCredential, unsealCredential } from './credentials.ts';
import { isInvalidGrant, refusal, requestToken, withTokens } from './oauth-token.ts';
import { resourceServerCredential } from './brokering.ts';
import type { JobPayloads } from '../../queues/names.ts';
import type { Plain } from './types.ts';

type RefreshServices = Pick<Services, 'db' | 'cfg' | 'log' | 'bus'>;
export type RefreshOutcome = 'refreshed' | 'not due' | 'gone' | 'refresh_failed';

const PAGE = 500;

// A job per due credential; its id names the due time, so workers scanning together add one.
export async function enqueueDueRefreshes(s: Pick<Services, 'db'>, queue: Queue<JobPayloads['credential-refresh']>): Promise<number> {
  const due = await repo.dueCredentialRefreshes(s.db, PAGE);
  if (due.length) {
    await queue.addBulk(due.map((c) => ({ name: 'refresh', data: { credential_id: c.id }, opts: { jobId: `${c.id}_${c.next_rotation_time.getTime()}` } })));
  }
  return due.length;
}

async function giveUp(s: RefreshServices, credentialId: string, reason: string): Promise<RefreshOutcome> {
  const instances = await repo.setInstanceStatusOfUserCredential(s.db, credentialId, 'refresh_failed');
  s.log.warn({ credential_id: credentialId, provider_instance_ids: instances, reason }, 'credential refresh gave up: instance is refresh_failed');
  return 'refresh_failed';
}

export async function refreshCredential(s: RefreshServices, credentialId: string, finalAttempt: boolean): Promise<RefreshOutcome> {
  const [row] = await repo.getCredentials(s.db, [credentialId]);
  const instance = row && await repo.instanceOfUserCredential(s.db, credentialId);
  if (!row || !instance || !['active', 'disabled'].includes(instance.status)) return 'gone';
  // Refreshed since the job was queued (its due time moved on).
  if (!row.next_rotation_time || row.next_rotation_time.getTime() > Date.now()) return 'not due';
  const provider = providerDef(instance.provider_controller_type_id);
  const cc = credentialDef(provider, instance.credential_controller_type_id);
  const user = await unsealCredential(s, cc, row);
  if (typeof user.refresh_token !== 'string') return giveUp(s, credentialId, 'the credential has no refresh token');
  let fresh: Plain;
  try {
    const { plain: rs } = await resourceServerCredential(s, cc, instance);
    const answer = await requestToken(s.cfg, provider, rs, { grant_type: 'refresh_token', refresh_token: user.refresh_token });
    if (answer.status >= 400 && isInvalidGrant(answer)) return giveUp(s, credentialId, 'the provider answered invalid_grant');
    if (answer.status >= 400) throw refusal('refresh token', answer);
    fresh = withTokens(answer, user, rs);
  } catch (err) {
    if (finalAttempt) return giveUp(s, credentialId, (err as Error).message);
    throw err;
  }
  const written = await writeUnderAlias(s, row.dek_alias, async (trx, dekId) => repo.replaceCredentialValue(trx, row.id, row.value, {
    value: await sealCredential(s, cc, 'user', fresh, dekId, trx), dek_id: dekId, next_rotation_time: nextRotationTime(cc, 'user', fresh),
  }));
  // Replaced meanwhile (brokered again): the new credential has its own due time.
  if (!written) return 'gone';
  s.log.info({ credential_id: credentialId, provider_instance_id: instance.id }, 'credential refreshed');
  return 'refreshed';
}

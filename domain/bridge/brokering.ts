// OAuth 2.0 authorization-code brokering of user credentials (SPEC.md section 7): the broker call
// returns the provider's authorize URL (state of 256 random bits, single use, 10 minutes; PKCE
// S256); the provider sends the user back to the generic callback, which exchanges the code at the
// provider's token endpoint, stores the tokens as the instance's user credential (encrypted) and
// makes the instance active. A token endpoint that gives no answer leaves the state for a retry.
// The first flow of an instance to complete ends its others, their code exchanges under way included.
// Deleting the instance ends its flows too, even when another is made under its id meanwhile.
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import type { Knex } from 'knex';
import type { Services } from '../services.ts';
import { AppError, Gone, InvalidRequest, NoAnswer, NotFound, Unavailable, Upstream } from '../errors.ts';
import * as repo from '../../db/bridge.ts';
import { deleteBrokerStatesExpiredBefore, deleteBrokerStatesOf, insertBrokerState, putBackBrokerState, takeBrokerState, type BrokerStateRow, type TakenBrokerState } from '../../db/broker-states.ts';
import type { BrokerState, Credential } from '../shapes/bridge.ts';
import { writeUnderAlias } from '../keyring.ts';
import { credentialDef, providerDef } from './catalog.ts';
import { resourceServerCredential, storeCredential, toCredential, unsealCredential } from './credentials.ts';
import type { CredentialControllerDef, Plain } from './types.ts';
import { oauthOf, refusal, requestedScopes, requestToken, withTokens } from './oauth-token.ts';

const STATE_TTL_MS = 10 * 60 * 1000;
// Expired states are kept this long, so a late callback learns its state expired (410), not that it never existed.
const EXPIRED_KEPT_MS = 24 * 60 * 60 * 1000;

type BrokerServices = Pick<Services, 'db' | 'cfg' | 'log' | 'bus'>;

export type CallbackOutcome = { type: 'user_credential'; credential: Credential } | { type: 'redirect'; url: string };

const sha256 = (v: string) => createHash('sha256').update(v).digest('hex');
const base64url = (b: Buffer) => b.toString('base64url');

function toBrokerState(row: BrokerStateRow, instance: repo.ProviderInstanceRow, authorizeUrl: string): BrokerState {
  return {
    type: 'broker_state', id: row.id, provider_instance_id: instance.id, provider_controller_type_id: instance.provider_controller_type_id,
    credential_controller_type_id: instance.credential_controller_type_id, metadata: row.metadata,
    action: { Redirect: { url: authorizeUrl } }, created_at: row.created_at, updated_at: row.updated_at,
  } as unknown as BrokerState; // Dates serialise to RFC 3339 in the response
}

export async function startBrokering(s: BrokerServices, providerTypeId: string, credentialTypeId: string, instanceId: string): Promise<BrokerState> {
  const provider = providerDef(providerTypeId);
  const cc = credentialDef(provider, credentialTypeId);
  if (!cc.requires_brokering) throw new InvalidRequest(`Credential controller '${cc.type_id}' does not broker user credentials`);
  const oauth = oauthOf(provider);
  const instance = await repo.getProviderInstance(s.db, instanceId);
  if (!instance) throw new NotFound('provider_instance', instanceId);
  if (instance.provider_controller_type_id !== provider.type_id || instance.credential_controller_type_id !== cc.type_id) {
    throw new InvalidRequest(`Provider instance '${instanceId}' is a ${instance.provider_controller_type_id} instance with ${instance.credential_controller_type_id}, not ${provider.type_id} with ${cc.type_id}`,
      [{ path: 'body.provider_instance_id', message: 'belongs to another provider or credential controller' }]);
  }
  const { plain: rs } = await resourceServerCredential(s, cc, instance);
  const state = base64url(randomBytes(32));
  const verifier = base64url(randomBytes(32));
  const url = new URL(s.cfg[oauth.authorizeUrlSetting]);
  const scopes = requestedScopes(provider, rs);
  for (const [k, v] of Object.entries({
    response_type: 'code', client_id: String(rs.client_id), redirect_uri: String(rs.redirect_uri), state,
    code_challenge: base64url(createHash('sha256').update(verifier).digest()), code_challenge_method: 'S256',
    ...(scopes.length ? { scope: scopes.join(' ') } : {}), ...oauth.authorizeParams,
  })) url.searchParams.set(k, v);
  const row = await insertBrokerState(s.db, {
    id: randomUUID(), state_hash: sha256(state), provider_instance_id: instance.id, code_verifier: verifier,
    metadata: {}, expires_at: new Date(Date.now() + STATE_TTL_MS),
  });
  if (!row) throw new NotFound('provider_instance', instanceId);
  s.log.info({ provider_instance_id: instance.id, broker_state_id: row.id }, 'oauth brokering started');
  return toBrokerState(row, instance, url.toString());
}

// States of flows abandoned long ago (workers/housekeeping.ts); expired ones younger than
// EXPIRED_KEPT_MS stay so their late callbacks still get 410.
export async function purgeExpiredBrokerStates(s: Pick<Services, 'db'>): Promise<number> {
  return deleteBrokerStatesExpiredBefore(s.db, new Date(Date.now() - EXPIRED_KEPT_MS));
}

export async function completeBrokering(
  s: BrokerServices, query: { state?: string; code?: string; error?: string; error_description?: string },
): Promise<CallbackOutcome> {
  if (!query.state) throw new InvalidRequest('The callback has no state', [{ path: 'query.state', message: 'is required' }]);
  // A callback that is neither answer leaves the state unused: it is not the provider's redirect.
  const { error, code } = query;
  const reply: { error: string } | { code: string } | undefined = error ? { error } : code ? { code } : undefined;
  if (!reply) throw new InvalidRequest('The callback has neither a code nor an error', [{ path: 'query.code', message: 'is required' }]);
  const state = await takeBrokerState(s.db, sha256(query.state));
  if (!state) throw noFlowWaits();
  if (state.expires_at.getTime() < Date.now()) throw new Gone('The brokering state expired: start the flow again');
  if ('error' in reply) {
    const detail = query.error_description ? `: ${query.error_description}` : '';
    throw new InvalidRequest(`The provider refused the authorization: ${reply.error}${detail}`, [{ path: 'query.error', message: reply.error }]);
  }
  const instance = flowInstance(await repo.getProviderInstance(s.db, state.provider_instance_id), state);
  if (!instance) throw voided(s, state, 'its instance was deleted');
  const provider = providerDef(instance.provider_controller_type_id);
  const cc = credentialDef(provider, instance.credential_controller_type_id);
  const { row: rsRow, plain: rs } = await resourceServerCredential(s, cc, instance);
  const answer = await requestToken(s.cfg, provider, rs, {
    grant_type: 'authorization_code', code: reply.code, redirect_uri: String(rs.redirect_uri), code_verifier: state.code_verifier,
  }).catch(async (err: unknown) => {
    throw err instanceof NoAnswer ? await keptForRetry(s, state, err) : err;
  });
  if (answer.status >= 400) throw refusal('code', answer);
  const tokens = withTokens(answer, { code: reply.code }, requestedScopes(provider, rs));
  // The tokens are sealed under the alias of the instance's resource server credential.
  const store = (previous: PreviousToken | undefined, last: boolean) => writeUnderAlias(s, rsRow.dek_alias, async (trx, dekId) => {
    const current = flowInstance(await repo.getProviderInstance(trx, instance.id, 'update'), state);
    if (!current) throw voided(s, state, 'its instance was deleted during its code exchange');
    // Another flow of the instance completed during this one's code exchange, when this state was
    // taken already and so escaped its delete: that flow stands, as if the delete had reached this one.
    if (current.user_credential_id !== state.instance_user_credential_id) throw voided(s, state, 'another flow of the instance completed during its code exchange');
    const plain = await keepingRefreshToken(trx, current, tokens, previous, last);
    const stored = await storeCredential(s, trx, { kind: 'user', providerTypeId: provider.type_id, cc, plain, metadata: {}, dekId, alias: rsRow.dek_alias });
    await repo.setUserCredential(trx, instance.id, stored.id);
    if (current.user_credential_id) await repo.deleteOrphanCredentials(trx, [current.user_credential_id]);
    // The instance's other flows end with this one: their callbacks answer as a used state's.
    await deleteBrokerStatesOf(trx, instance.id);
    return { credential: stored, refreshable: Boolean(plain.refresh_token) };
  });
  const previousRow = tokens.refresh_token || !tokens.sub || !state.instance_user_credential_id
    ? undefined : (await repo.getCredentials(s.db, [state.instance_user_credential_id]))[0];
  const { credential, refreshable } = await store(await previousToken(s, cc, instance, tokens, previousRow), false).catch(async (err: unknown) => {
    // A refresh stored new tokens since the previous credential was decrypted: its refresh token is
    // the one to keep (at a provider that rotates them, the one decrypted is spent), so the credential
    // as it was then locked is decrypted, outside again, and stored once more. Changed once more, its
    // refresh token is dropped (the warning below says so) rather than racing refreshes without end.
    if (!(err instanceof PreviousChanged)) throw err;
    return store(await previousToken(s, cc, instance, tokens, err.row), true);
  });
  if (!refreshable) s.log.warn({ provider_instance_id: instance.id }, 'the token endpoint sent no refresh token: the instance becomes refresh_failed when its tokens expire');
  s.log.info({ provider_instance_id: instance.id, broker_state_id: state.id }, 'oauth brokering completed');
  const back = instance.return_on_successful_brokering;
  if (back && URL.canParse(back.url)) return { type: 'redirect', url: back.url };
  // One stored before creation checked it cannot be redirected to: the credential is answered instead.
  if (back) s.log.warn({ provider_instance_id: instance.id }, 'return_on_successful_brokering.url is not a URL: answering the user credential');
  return { type: 'user_credential', credential: toCredential(credential) };
}

// Providers often send a refresh token only at the first consent. Brokered again by the same user (the
// ID tokens name the same `sub`), the instance keeps the refresh token it had. For another user, or one
// no ID token names, that token would act for someone else: the new credential has none.
// The previous credential (`row`) is decrypted before the storing transaction, not in it: a DEK not
// cached is a KMS call, which would hold the instance and credential locks, and a statement of the
// decrypt that failed there would abort the transaction, losing the tokens of a code already redeemed.
type PreviousToken = { row: repo.CredentialRow; refreshToken: string };
async function previousToken(s: BrokerServices, cc: CredentialControllerDef, instance: repo.ProviderInstanceRow, plain: Plain, row: repo.CredentialRow | undefined): Promise<PreviousToken | undefined> {
  if (!row) return undefined;
  // The code is redeemed: a previous credential that does not open (its DEK or envelope key unusable,
  // KMS failing) costs its refresh token, not the new tokens. Postgres failing is no reason to think so.
  const previous = await unsealCredential(s, cc, row).catch((err: unknown) => {
    if (!(err instanceof AppError) || err instanceof Unavailable) throw err;
    s.log.warn({ provider_instance_id: instance.id, err: err.message }, 'the previous user credential does not open: its refresh token is not kept');
    return undefined;
  });
  if (previous?.sub !== plain.sub || typeof previous?.refresh_token !== 'string') return undefined;
  return { row, refreshToken: previous.refresh_token };
}

// The credential changed between its decrypt and the storing transaction: `row` is as then locked.
class PreviousChanged extends Error {
  constructor(readonly row: repo.CredentialRow) {
    super('the previous user credential changed since it was decrypted');
  }
}

// The refresh token is kept only from a credential this brokering deletes (no other instance uses it):
// were it copied from one another instance keeps, two credentials would hold one refresh token, and at
// a provider that rotates them the first refresh of either spends the other's. Checked in the storing
// transaction, the instance locked and then the credential (in that order, as a refresh's writes take
// them): an instance being created with the credential is waited for and then counted, and a refresh
// that stored new tokens meanwhile is waited for and seen (PreviousChanged; on the `last` try, dropped).
async function keepingRefreshToken(trx: Knex.Transaction, instance: repo.ProviderInstanceRow, plain: Plain, previous: PreviousToken | undefined, last: boolean): Promise<Plain> {
  if (!previous) return plain;
  const row = await repo.lockedUserCredentialOnlyOf(trx, previous.row.id, instance.id);
  if (!row) return plain;
  if (row.dek_id !== previous.row.dek_id || !isDeepStrictEqual(row.value, previous.row.value)) {
    if (last) return plain;
    throw new PreviousChanged(row);
  }
  return { ...plain, refresh_token: previous.refreshToken };
}

// The state is not echoed (it is the flow's proof) and has no other id: data names no id.
function noFlowWaits(): NotFound {
  return new NotFound('broker_state', { message: 'No brokering flow waits for this state: it is unknown, was used already, or its callback is under way' });
}

// The instance the flow was started for, undefined once it is deleted: one made again under its id
// since (created later) is another, whose user has not consented to this flow.
function flowInstance(row: repo.ProviderInstanceRow | undefined, state: TakenBrokerState): repo.ProviderInstanceRow | undefined {
  return row?.created_at.getTime() === state.instance_created_at.getTime() ? row : undefined;
}

// A flow ended while its code was exchanged (another flow of its instance completed, or the instance
// was deleted) answers as a used state, as its state's delete would have made it.
function voided(s: BrokerServices, state: TakenBrokerState, why: string): NotFound {
  s.log.info({ provider_instance_id: state.provider_instance_id, broker_state_id: state.id }, `oauth brokering voided: ${why}`);
  return noFlowWaits();
}

// The token endpoint gave no answer, so the code may never have been redeemed: the state goes back
// (same id and expiry) for the same callback to be tried again. Taken meanwhile, it made a
// concurrent callback a 404: one exchange at a time. Any answer of the provider's uses it up.
async function keptForRetry(s: BrokerServices, state: TakenBrokerState, err: NoAnswer): Promise<Upstream | NotFound> {
  if (!(await putBackBrokerState(s.db, state))) {
    return voided(s, state, 'another flow of the instance completed, or the instance was deleted, during its code exchange');
  }
  s.log.warn({ provider_instance_id: state.provider_instance_id, broker_state_id: state.id }, 'token endpoint gave no answer: broker state kept for a retry');
  return new Upstream(`${err.message}; the state is kept: the same callback may be retried until it expires`, err.data);
}

// A provider's OAuth token endpoint, as brokering (authorization_code) and refresh (refresh_token)
// call it: client_secret_post, JSON answer. Throws Upstream when it cannot be reached or fails;
// a refusal (4xx) comes back for the caller to judge.
import type { Config } from '../config.ts';
import { InvalidRequest, Upstream } from '../errors.ts';
import { callUpstream, refusalMessage, successObject, type UpstreamAnswer } from './upstream.ts';
import type { Plain, ProviderControllerDef } from './types.ts';
import { assertBearerType, assertHeaderToken, oauthAuthFlow } from './credential-controllers.ts';
import { checkAgainst } from './catalog.ts';
import { findUnstorable } from '../storable-json.ts';

const DEFAULT_TOKEN_TTL_S = 3600;
// A longer announced lifetime (some endpoints send huge ones for "does not expire") is treated as
// this one: refreshed in ten years, and still a valid date.
const MAX_TOKEN_TTL_S = 10 * 365 * 86400;

export function oauthOf(provider: ProviderControllerDef): NonNullable<ProviderControllerDef['oauth']> {
  if (!provider.oauth) throw new InvalidRequest(`Provider '${provider.type_id}' has no OAuth endpoints`);
  return provider.oauth;
}

// The scopes a grant asks for: the resource server credential's, or the provider's default.
export function requestedScopes(provider: ProviderControllerDef, rs: Plain): string[] {
  const named = rs.scopes as string[] | undefined;
  return named?.length ? named : oauthOf(provider).defaultScopes;
}

export async function requestToken(cfg: Config, provider: ProviderControllerDef, rs: Plain, grant: Record<string, string>): Promise<UpstreamAnswer> {
  return callUpstream('token endpoint', cfg[oauthOf(provider).tokenUrlSetting], {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
    body: new URLSearchParams({ ...grant, client_id: String(rs.client_id), client_secret: String(rs.client_secret) }).toString(),
  }, cfg.BRIDGE_TIMEOUT_MS);
}

export const isInvalidGrant = (answer: UpstreamAnswer) => (answer.body as { error?: unknown } | undefined)?.error === 'invalid_grant';

export const refusal = (what: string, answer: UpstreamAnswer) =>
  new Upstream(`token endpoint refused the ${what}: ${refusalMessage(answer)}`, { upstream: 'token endpoint', upstream_status: answer.status });

// The user credential after a token answer: `previous` with the new access token and expiry, the
// new refresh token if one came (else the previous one) and the granted scopes if named (else
// those granted before, or for a first grant those `requested`: RFC 6749 5.1).
export function withTokens(answer: UpstreamAnswer, previous: Plain, requested: string[]): Plain {
  const body = successObject('token endpoint', answer);
  if (typeof body.access_token !== 'string' || !body.access_token) throw new Upstream('token endpoint: answered without an access_token', { upstream: 'token endpoint' });
  assertHeaderToken(body.access_token);
  assertBearerType(body.token_type);
  const scopes = typeof body.scope === 'string' ? body.scope.split(' ').filter(Boolean) : (previous.scopes as string[] | undefined) ?? requested;
  const refresh = typeof body.refresh_token === 'string' && body.refresh_token ? body.refresh_token : previous.refresh_token;
  const sub = idTokenSubject(body.id_token) ?? previous.sub;
  return storable({
    ...previous, access_token: body.access_token,
    ...(refresh ? { refresh_token: refresh } : {}),
    ...(sub ? { sub } : {}),
    expiry_time: new Date(Date.now() + lifetimeS(body.expires_in) * 1000).toISOString(),
    ...(scopes?.length ? { scopes } : {}),
  });
}

// expires_in in seconds, as a number or (as some endpoints send it) a string of digits; absent, the
// default. 0 is expired already: due for refresh at once (how often again: credential-refresh.ts).
function lifetimeS(value: unknown): number {
  if (value === undefined || value === null) return DEFAULT_TOKEN_TTL_S;
  const ttl = typeof value === 'number' ? value : typeof value === 'string' && /^\d+(\.\d+)?$/.test(value) ? Number(value) : NaN;
  if (!(ttl >= 0)) throw new Upstream('token endpoint: answered an expires_in that is not a number of seconds (0 or more)', { upstream: 'token endpoint' });
  return Math.min(ttl, MAX_TOKEN_TTL_S);
}

// The answer becomes the stored user credential: one Postgres cannot store (a NUL in `scope`), or
// that the credential's own schema refuses (its export would not import again), is the endpoint's fault.
function storable(value: Plain): Plain {
  const unstorable = findUnstorable(value, 'credential');
  if (unstorable) throw new Upstream(`token endpoint: answered a ${unstorable.path} that ${unstorable.message}`, { upstream: 'token endpoint' });
  try {
    checkAgainst(oauthAuthFlow.userCredential!, value, 'credential');
  } catch (err) {
    if (!(err instanceof InvalidRequest)) throw err;
    throw new Upstream(`token endpoint: answered tokens that do not fit the user credential (${err.message})`, { upstream: 'token endpoint' });
  }
  return value;
}

// The user an OpenID Connect ID token names. Its signature is not checked: it came straight from
// the token endpoint over the connection we opened (OpenID Connect Core 3.1.3.7), and `sub` only
// labels the credential.
function idTokenSubject(idToken: unknown): string | undefined {
  if (typeof idToken !== 'string') return undefined;
  try {
    const claims = JSON.parse(Buffer.from(idToken.split('.')[1] ?? '', 'base64url').toString('utf8')) as { sub?: unknown };
    return typeof claims.sub === 'string' && claims.sub.length > 0 && claims.sub.length <= 8192 ? claims.sub : undefined;
  } catch {
    return undefined;
  }
}

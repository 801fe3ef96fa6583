// The ways a provider instance authenticates to its provider's API (SPEC.md section 7).
import { createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';
import { Type } from '@sinclair/typebox';
import { Conflict, InvalidRequest, Upstream } from '../errors.ts';
import { assertOutboundUrl } from '../webhook-url.ts';
import { callUpstream, refusalMessage } from './upstream.ts';
import type { CredentialControllerDef, Plain, UpstreamOptions } from './types.ts';
import { worded } from '../schema-check.ts';
import { HttpUrl } from '../shapes/common.ts';

const Str = (description: string) => Type.String({ minLength: 1, maxLength: 8192, description });
// Values sent in an Authorization header: printable ASCII, or every call would fail.
const HEADER_TOKEN_CHARS = '[\\x21-\\x7e]';
const HEADER_TOKEN_WORDS = 'must be printable ASCII without spaces';
export const HEADER_TOKEN_PATTERN = worded(`^${HEADER_TOKEN_CHARS}+$`, HEADER_TOKEN_WORDS);
// The OAuth callback's code, checked before it is redeemed: what a user credential's `code` holds, or
// empty (the callback then says it has no code).
export const HEADER_TOKEN_OR_EMPTY_PATTERN = worded(`^${HEADER_TOKEN_CHARS}*$`, HEADER_TOKEN_WORDS);
export const MAX_TOKEN_LENGTH = 8192;
const HEADER_TOKEN = new RegExp(HEADER_TOKEN_PATTERN);
// A token endpoint's access_token that cannot go in an Authorization header would fail every call
// it authorizes (fetch refuses the header before connecting): the endpoint's fault, said so.
export function assertHeaderToken(token: string): void {
  if (token.length > MAX_TOKEN_LENGTH || !HEADER_TOKEN.test(token)) {
    throw new Upstream(`token endpoint: answered an access_token that cannot be sent in an Authorization header (printable ASCII, at most ${MAX_TOKEN_LENGTH} characters)`, { upstream: 'token endpoint' });
  }
}
// Tokens are sent as `Authorization: Bearer`; another type (DPoP, bound to a key we do not hold)
// would be refused by the provider at each call, so it is refused here instead (RFC 6749 7.1).
// Absent is taken as bearer.
export function assertBearerType(tokenType: unknown): void {
  if (tokenType != null && String(tokenType).toLowerCase() !== 'bearer') {
    throw new Upstream('token endpoint: answered a token_type that is not bearer: only bearer tokens are supported', { upstream: 'token endpoint' });
  }
}
const Token = (description: string) => Type.String({ minLength: 1, maxLength: MAX_TOKEN_LENGTH, pattern: HEADER_TOKEN_PATTERN, description: `${description} (printable ASCII)` });
const Scopes = Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { maxItems: 100 }));
const Strict = { additionalProperties: false };

const bearer = (token: unknown) => `Bearer ${String(token)}`;

export const apiKey: CredentialControllerDef = {
  type_id: 'api_key',
  name: 'API key',
  documentation: 'A secret API key sent as a bearer token. Stored only encrypted.',
  requires_brokering: false,
  requires_resource_server_credential_refreshing: false,
  requires_user_credential_refreshing: false,
  resourceServer: Type.Object({ api_key: Type.String({ minLength: 1, maxLength: 4096, pattern: HEADER_TOKEN_PATTERN, description: 'printable ASCII, no spaces' }) }, Strict),
  userCredential: null,
  sensitive: { resource_server: ['api_key'], user: [] },
  authorization: async (rs) => bearer(rs!.api_key),
};

export const oauthAuthFlow: CredentialControllerDef = {
  type_id: 'oauth_auth_flow',
  name: 'OAuth 2.0 authorization code',
  documentation: 'A user grants access through the provider\'s consent page; the user credential holds the tokens. Client secret and tokens are stored only encrypted.',
  requires_brokering: true,
  requires_resource_server_credential_refreshing: false,
  requires_user_credential_refreshing: true,
  resourceServer: Type.Object({
    client_id: Str('OAuth client id'),
    client_secret: Str('OAuth client secret'),
    redirect_uri: HttpUrl,
    scopes: Scopes,
  }, Strict),
  userCredential: Type.Object({
    code: Type.Optional(Token('the authorization code it came from')),
    access_token: Token('access token'),
    refresh_token: Type.Optional(Token('refresh token')),
    expiry_time: Type.String({ format: 'date-time' }),
    sub: Type.Optional(Str('the user the tokens act for')),
    scopes: Scopes,
  }, Strict),
  sensitive: { resource_server: ['client_secret'], user: ['code', 'access_token', 'refresh_token'] },
  // expiry_time is stored as RFC 3339 UTC, the form every later comparison and refresh relies on.
  async normalize(kind, value) {
    if (kind !== 'user') return value;
    const t = Date.parse(String(value.expiry_time));
    const year = new Date(t).getUTCFullYear();
    if (!Number.isFinite(t) || year < 1970 || year > 9999) {
      throw new InvalidRequest('value.expiry_time is not a usable time (RFC 3339, years 1970..9999)', [{ path: 'body.value.expiry_time', message: 'must be an RFC 3339 time between 1970 and 9999' }]);
    }
    return { ...value, expiry_time: new Date(t).toISOString() };
  },
  authorization: async (_rs, user) => (user ? bearer(user.access_token) : undefined),
};

const JWT_BEARER = 'urn:ietf:params:oauth:grant-type:jwt-bearer';
const MIN_RSA_BITS = 2048;
const b64url = (v: unknown) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');

function signsAndVerifies(key: KeyObject): boolean {
  const probe = Buffer.from('taskbridge key check');
  try {
    return verify('sha256', probe, createPublicKey(key), sign('sha256', probe, key));
  } catch {
    return false;
  }
}

// RFC 7523: a JWT signed with the client's private key, exchanged at token_uri for an access token.
async function jwtBearerToken(rs: Plain, user: Plain | undefined, opts: UpstreamOptions): Promise<string> {
  const tokenUri = String(rs.token_uri);
  const now = Math.floor(Date.now() / 1000);
  const claims: Plain = { iss: rs.client_id, aud: tokenUri, iat: now, exp: now + 3600 };
  const scopes = rs.scopes as string[] | undefined;
  if (scopes?.length) claims.scope = scopes.join(' ');
  const sub = user?.sub ?? rs.sub;
  if (sub) claims.sub = sub;
  const unsigned = `${b64url({ alg: 'RS256', typ: 'JWT' })}.${b64url(claims)}`;
  let signature: Buffer;
  try {
    signature = sign('sha256', Buffer.from(unsigned), String(rs.private_key));
  } catch {
    // A key stored before normalize tried signing with it.
    throw new Conflict("The credential's private_key cannot sign (its RSA components do not fit together); store a new credential");
  }
  const assertion = `${unsigned}.${signature.toString('base64url')}`;
  // token_uri's name is looked up once, when connecting, within the invocation's limit; unless
  // private targets are allowed, the address it resolves to now is checked there (it may have
  // changed since the credential was stored).
  const answer = await callUpstream('token endpoint', tokenUri, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
    body: new URLSearchParams({ grant_type: JWT_BEARER, assertion }).toString(),
    signal: opts.signal,
  }, opts.timeoutMs, { publicOnly: !opts.allowPrivate, deadline: opts.deadline });
  const body = answer.body as { access_token?: unknown; token_type?: unknown } | undefined;
  const token = body?.access_token;
  if (answer.status >= 400 || typeof token !== 'string' || !token) {
    throw new Upstream(`token endpoint refused the assertion: ${refusalMessage(answer)}`, { upstream: 'token endpoint', upstream_status: answer.status });
  }
  assertHeaderToken(token);
  assertBearerType(body!.token_type);
  return token;
}

export const oauthJwtBearer: CredentialControllerDef = {
  type_id: 'oauth2_jwt_bearer_assertion_flow',
  name: 'OAuth 2.0 JWT bearer assertion',
  documentation: 'A service account: each call signs a JWT (RS256) with the private key and exchanges it at token_uri for an access token. The private key is stored only encrypted.',
  requires_brokering: false,
  requires_resource_server_credential_refreshing: false,
  requires_user_credential_refreshing: false,
  resourceServer: Type.Object({
    client_id: Str('issuer of the assertion (the service account)'),
    private_key: Str('PEM private key (RSA)'),
    token_uri: HttpUrl,
    scopes: Scopes,
    sub: Type.Optional(Str('the user to act for (domain-wide delegation)')),
  }, Strict),
  userCredential: null,
  sensitive: { resource_server: ['private_key'], user: [] },
  async normalize(kind, value, opts) {
    if (kind !== 'resource_server') return value;
    let bits: number | undefined;
    let key: KeyObject;
    try {
      key = createPrivateKey(String(value.private_key));
      if (key.asymmetricKeyType !== 'rsa') throw new Error('not RSA');
      bits = key.asymmetricKeyDetails?.modulusLength;
    } catch {
      throw new InvalidRequest('value.private_key is not a PEM RSA private key', [{ path: 'body.value.private_key', message: 'must be a PEM RSA private key' }]);
    }
    // RS256 with a shorter key can be forged (RFC 7518 section 3.3 requires 2048 bits or more).
    if (bits === undefined || bits < MIN_RSA_BITS) {
      throw new InvalidRequest(`value.private_key is ${bits === undefined ? 'an RSA key of unknown size' : `a ${bits}-bit RSA key`}; RS256 needs ${MIN_RSA_BITS} bits or more`, [{ path: 'body.value.private_key', message: `must be an RSA key of at least ${MIN_RSA_BITS} bits` }]);
    }
    // A key can parse and still not sign (components that do not fit together): refused now rather
    // than failing every call.
    if (!signsAndVerifies(key)) {
      throw new InvalidRequest('value.private_key cannot sign: its RSA components do not fit together', [{ path: 'body.value.private_key', message: 'must be a consistent RSA private key' }]);
    }
    await assertOutboundUrl(String(value.token_uri), opts.allowPrivate, 'token_uri', 'BRIDGE_ALLOW_PRIVATE');
    return value;
  },
  authorization: async (rs, user, opts) => bearer(await jwtBearerToken(rs!, user, opts)),
};

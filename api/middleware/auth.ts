import type { Middleware } from 'koa';
import { Forbidden, Unauthenticated, unavailability } from '../../domain/errors.ts';
import { hasScope, resolveApiKey, type Principal, type Scope } from '../../domain/api-keys.ts';
import { activeIds, revokedWithin, touchLastUsed } from '../../db/api-keys.ts';
import type { Services } from '../../domain/services.ts';
import { endStreamsOf, REVOKED_KEPT_MS, streamHolders } from '../a2a-stream-quota.ts';
import { lookUpFrom } from './auth-failures.ts';

export type { Principal, Scope };

const TOUCH_EVERY_MS = 60_000;
const lastTouched = new Map<string, number>();

// Resolved keys are cached briefly so a request costs no key lookup; a revocation removes them
// at once in this process and, through a Postgres notification sent by a trigger on api_keys
// (db/migrations/0005), in every API process, whoever revoked the key.
export const API_KEY_REVOKED = 'api_key_revoked';
const CACHE_TTL_MS = 10_000;
const CACHE_MAX = 10_000;
// served: when this process last answered a request with it. doubted: a revocation notice may have
// been lost since it was looked up (the listener was away).
const cache = new Map<string, { principal: Principal; expires: number; served: number; doubted?: true }>();

let revocations = 0;

// A revoked key: no longer cached, and its A2A streams in this process end.
export function forgetApiKey(id: string): void {
  revocations++;
  lastTouched.delete(id);
  for (const [token, entry] of cache) if (entry.principal.id === id) cache.delete(token);
  endStreamsOf(id);
}

// The revocation notices that came while the listener was away are lost: every cached key is looked
// up again, and what a notice does is done for the keys revoked lately (a request authenticated
// before may still open a stream) and for stream holders whose key is gone.
export async function catchUpOnRevocations(services: Services): Promise<void> {
  revocations++;
  for (const entry of cache.values()) Object.assign(entry, { expires: 0, doubted: true });
  for (const id of await revokedWithin(services.db, REVOKED_KEPT_MS)) forgetApiKey(id);
  const holders = streamHolders().filter((id) => !id.startsWith('env:'));
  if (!holders.length) return;
  const active = await activeIds(services.db, holders);
  for (const id of holders) if (!active.has(id)) forgetApiKey(id);
}

function cached(token: string): Principal | undefined {
  const hit = cache.get(token);
  const now = Date.now();
  if (!hit || hit.expires <= now) return undefined;
  hit.served = now;
  return hit.principal;
}

async function lookUp(services: Services, token: string): Promise<Principal | null> {
  const generation = revocations;
  let principal: Principal | null;
  try {
    principal = await resolveApiKey(services.db, token, services.cfg.ADMIN_API_KEY);
  } catch (err) {
    // Postgres out of reach: a key taken before, whose entry only expired, is taken still (revoking
    // it is a write to Postgres, whose notice removes the entry), so that what needs no Postgres
    // (/metrics, the queue dashboard) keeps answering through the outage rather than 503.
    const known = cache.get(token);
    if (known && !known.doubted && unavailability(err)) return known.principal;
    throw err;
  }
  // A revocation that arrived during the lookup may concern this key: do not cache that answer.
  if (principal && generation === revocations) {
    if (cache.size >= CACHE_MAX) cache.clear();
    const now = Date.now();
    cache.set(token, { principal, expires: now + CACHE_TTL_MS, served: now });
  } else {
    cache.delete(token);
  }
  return principal;
}

/**
 * The key's principal, for a request from `address`: from the cache, else looked up (and cached). A
 * key not served lately is refused (429) from an address past its failures; a wrong one counts
 * against the address (auth-failures.ts). Null for a wrong key.
 */
export async function verifyKey(services: Services, address: string, token: string): Promise<Principal | null> {
  const known = cached(token);
  if (known) return known;
  // A key in use is still looked up again once its entry expires (a revocation whose notice was lost
  // ends it then), but not refused for its address's failures: a client sharing the address with a
  // guesser keeps working while it keeps using its key.
  if ((cache.get(token)?.served ?? 0) > Date.now() - CACHE_TTL_MS) return lookUp(services, token);
  // Requests held back behind others' lookups may find their key cached by then.
  return lookUpFrom(services, address, async () => cached(token) ?? lookUp(services, token));
}

export function bearerToken(header: string | undefined): string | undefined {
  const m = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '');
  return m?.[1];
}

export function authenticate(services: Services): Middleware {
  return async (ctx, next) => {
    if (!ctx.state.principal) {
      const header = ctx.get('Authorization');
      const token = bearerToken(header);
      if (!token) throw new Unauthenticated(header ? 'Authorization header must be "Bearer <api key>"' : 'Missing API key: send Authorization: Bearer <api key>');
      const principal = await verifyKey(services, ctx.ip, token);
      if (!principal) throw new Unauthenticated('Unknown or revoked API key');
      ctx.state.principal = principal;
      // last_used_at is advisory: written at most once a minute per key and process.
      const now = Date.now();
      if (!principal.id.startsWith('env:') && (lastTouched.get(principal.id) ?? 0) < now - TOUCH_EVERY_MS) {
        // Bounded like the cache: a key missing here costs one more advisory write.
        if (lastTouched.size >= CACHE_MAX) lastTouched.clear();
        lastTouched.set(principal.id, now);
        touchLastUsed(services.db, principal.id).catch((err) => (ctx.state.log ?? services.log).warn({ err }, 'could not record key use'));
      }
    }
    await next();
  };
}

// Every scope listed is needed (admin holds them all); the first one missing is named.
export function requireScope(scopes: Scope | readonly Scope[]): Middleware {
  const needed = typeof scopes === 'string' ? [scopes] : scopes;
  return async (ctx, next) => {
    const missing = needed.find((s) => !hasScope(ctx.state.principal as Principal, s));
    if (missing) throw new Forbidden(missing);
    await next();
  };
}

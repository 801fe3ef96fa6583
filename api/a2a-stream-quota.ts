// Streams open per API key (A2A_STREAMS_PER_KEY), counted across the API processes
// (queues/stream-places.ts): a stream holds a connection and re-reads Postgres every few seconds for
// as long as its task lives, which may be for ever. This process's own streams are counted here too:
// for a revoked key's streams to end (endStreamsOf, called wherever this process learns of a
// revocation), for /metrics, and as the limit while Redis is out of reach.
import { RateLimited, Unauthenticated } from '../domain/errors.ts';
import type { Services } from '../domain/services.ts';

const RETRY_AFTER_MS = 5000;
const openStreams = new Map<string, Set<AbortController>>();
// Keys this process learned were revoked, and when: a request authenticated just before the news
// (from the key cache) must not open a stream after it, which nothing would end. Such a request
// has its body within the server's request timeout (Node's default: 5 minutes), so a revocation
// is remembered for twice that: older ones are dropped when the next revocation comes.
const revoked = new Map<string, number>();
export const REVOKED_KEPT_MS = 10 * 60_000;
// As the key's next request is refused (api/middleware/auth.ts).
const revokedKey = () => new Unauthenticated('Unknown or revoked API key');

export interface HeldStream {
  /** Aborts when the key is revoked, its reason the Unauthenticated error the key's next call gets. */
  signal: AbortSignal;
  release(): void;
}

/** Takes one of the key's stream places (429 when it has none left here or across the API processes). */
export async function holdStream(services: Services, keyId: string): Promise<HeldStream> {
  if (revoked.has(keyId)) throw revokedKey();
  const held = openStreams.get(keyId) ?? new Set<AbortController>();
  const limit = services.cfg.A2A_STREAMS_PER_KEY;
  const refuse = (open: number) => new RateLimited(RETRY_AFTER_MS, `This API key holds ${open} A2A streams open, the most A2A_STREAMS_PER_KEY allows; close one, or retry later`, { open, limit });
  if (limit && held.size >= limit) throw refuse(held.size);
  // Counted here before Redis answers, so that streams opened here meanwhile count it; a revocation
  // meanwhile aborts it.
  const stream = new AbortController();
  held.add(stream);
  openStreams.set(keyId, held);
  const releaseHere = () => {
    held.delete(stream);
    if (!held.size && openStreams.get(keyId) === held) openStreams.delete(keyId);
  };
  const place = limit ? await services.streamPlaces.take(keyId, limit) : undefined;
  if (place && 'open' in place) {
    releaseHere();
    throw refuse(place.open);
  }
  // Revoked while Redis answered: refused as a revoked key is, before the call does anything.
  if (stream.signal.aborted) {
    releaseHere();
    place?.release();
    throw revokedKey();
  }
  return {
    signal: stream.signal,
    release: () => {
      releaseHere();
      place?.release();
    },
  };
}

/** The keys holding streams open here. */
export function streamHolders(): string[] {
  return [...openStreams.keys()];
}

/** Streams open here, and the most any one key holds (for /metrics, against A2A_STREAMS_PER_KEY). */
export function streamCounts(): { open: number; mostPerKey: number } {
  let open = 0;
  let mostPerKey = 0;
  for (const held of openStreams.values()) {
    open += held.size;
    mostPerKey = Math.max(mostPerKey, held.size);
  }
  return { open, mostPerKey };
}

export function endStreamsOf(keyId: string): void {
  const now = Date.now();
  // Oldest first (insertion order): stops at the first one still kept.
  for (const [id, at] of revoked) {
    if (at > now - REVOKED_KEPT_MS) break;
    revoked.delete(id);
  }
  revoked.delete(keyId);
  revoked.set(keyId, now);
  for (const stream of openStreams.get(keyId) ?? []) stream.abort(revokedKey());
}

// Streams open per API key in this process (A2A_STREAMS_PER_KEY): a stream holds a connection and
// re-reads Postgres every few seconds for as long as its task lives, which may be for ever.
import { RateLimited } from '../domain/errors.ts';
import type { Services } from '../domain/services.ts';

const RETRY_AFTER_MS = 5000;
const openStreams = new WeakMap<Services, Map<string, number>>();

/** Takes one of the key's stream places (429 when it has none left); returns what gives it back. */
export function holdStream(services: Services, keyId: string): () => void {
  let counts = openStreams.get(services);
  if (!counts) openStreams.set(services, (counts = new Map()));
  const open = counts.get(keyId) ?? 0;
  const limit = services.cfg.A2A_STREAMS_PER_KEY;
  if (limit && open >= limit) {
    throw new RateLimited(RETRY_AFTER_MS, `This API key holds ${open} A2A streams open here, the most A2A_STREAMS_PER_KEY allows; close one, or retry later`, { open, limit });
  }
  counts.set(keyId, open + 1);
  return () => {
    const left = (counts.get(keyId) ?? 1) - 1;
    if (left > 0) counts.set(keyId, left);
    else counts.delete(keyId);
  };
}

// Failed authentications per client address: past AUTH_FAILURES_PER_MINUTE wrong keys in a minute,
// an address gets 429 for the rest of that minute instead of a key lookup. Keys are far too long to
// guess, so this is about load and noise: a flood of made-up keys otherwise costs a Postgres lookup
// and a log line each, and unlike a key's requests no rate limit applies to them. Counted across the
// API processes as the per-key limit is (queues/fleet-counts.ts); a key the process served lately passes
// all the same (auth.ts), so a client sharing an address with a guesser keeps working while it keeps using its key.
import { clientOf } from '../../domain/client-address.ts';
import { RateLimited } from '../../domain/errors.ts';
import type { Services } from '../../domain/services.ts';

const WINDOW_MS = 60_000;
const countsOf = (services: Services) => services.fleetCounts.window('auth_failures', WINDOW_MS);

// Key lookups under way in this process per client (clientOf), and the requests waiting for one of them to end.
// Any lookup may find a wrong key: were they not held back, keys sent at once would all be looked up
// before the first failure was counted.
const underWay = new Map<string, { lookups: number; waiting: (() => void)[] }>();

/**
 * The key `lookup` finds (null for a wrong one, counted against its client) for a request from
 * `address`, counted with the others of its client (clientOf: an IPv6 address's /64). 429 once the
 * client has used up its failures for this minute; while the lookups under way from it could fail as
 * often as it has failures left, it first waits for one of them to end.
 */
export async function lookUpFrom<T>(services: Services, address: string, lookup: () => Promise<T | null>): Promise<T | null> {
  const limit = services.cfg.AUTH_FAILURES_PER_MINUTE;
  if (!limit) return lookup();
  const client = clientOf(address);
  const counts = countsOf(services);
  for (;;) {
    const refusedForMs = counts.reached(client, limit);
    if (refusedForMs) {
      const seconds = Math.max(1, Math.ceil(refusedForMs / 1000));
      throw new RateLimited(refusedForMs, `Too many failed authentications from this address; retry in ${seconds} s`);
    }
    const busy = underWay.get(client);
    if (!busy || counts.count(client) + busy.lookups < limit) break;
    await new Promise<void>((resolve) => busy.waiting.push(resolve));
  }
  let place = underWay.get(client);
  if (!place) underWay.set(client, (place = { lookups: 0, waiting: [] }));
  place.lookups++;
  try {
    const found = await lookup();
    if (!found) counts.add(client);
    return found;
  } finally {
    place.lookups--;
    // Those waiting look again: a key found gave back the failure it might have been, a wrong one used it.
    for (const wake of place.waiting.splice(0)) wake();
    if (!place.lookups) underWay.delete(client);
  }
}

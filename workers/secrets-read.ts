// The secret values this process's agent runs read: while each run goes, and for LINGER_MS after
// it. A promise an agent left unawaited may reject once its run is over, with an error quoting one
// (a provider refusing a key), and the process's unhandled-rejection line (workers/crash-lines.ts) is
// masked with them. Runs that read nothing are not kept past their end (a run hands out no value once
// it is over: workers/run-agent-task.ts).
import { secretMasker } from '../domain/secret-mask.ts';

const LINGER_MS = 60_000;
const going = new Set<ReadonlySet<string>>();
const ended: { until: number; values: ReadonlySet<string> }[] = []; // oldest first

function prune(now: number): void {
  let expired = 0;
  while (expired < ended.length && ended[expired].until <= now) expired++;
  if (expired) ended.splice(0, expired);
}

/** Registers a run's set of values read (filled as it reads); call what it returns when the run ends. */
export function holdSecretsRead(read: ReadonlySet<string>): () => void {
  going.add(read);
  return () => {
    going.delete(read);
    if (!read.size) return;
    const now = Date.now();
    prune(now);
    ended.push({ until: now + LINGER_MS, values: read });
  };
}

// The masker of the values last seen: built again only when they change, as V8 compiles its
// expressions on their first use (tens to hundreds of milliseconds for a few long secrets).
let cached: { values: Set<string>; mask: (text: string) => string } | undefined;

/** `text` with every value a run going, or ended in the last minute, read masked. */
export function maskSecretsRead(text: string): string {
  prune(Date.now());
  const values = new Set<string>();
  for (const read of going) for (const v of read) values.add(v);
  for (const { values: read } of ended) for (const v of read) values.add(v);
  if (!values.size) {
    cached = undefined; // no value kept past its minute
    return text;
  }
  if (!cached || cached.values.size !== values.size || [...values].some((v) => !cached!.values.has(v))) cached = { values, mask: secretMasker([...values]) };
  return cached.mask(text);
}

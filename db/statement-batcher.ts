// Coalesces concurrent calls of a hot statement into multi-row statements. An item is written at
// once when fewer than `maxInFlight` statements are running, so a lone call waits for nothing;
// under load, items that arrive while statements run go together into the next one. Postgres then
// pays one execution, one commit and one round trip per batch instead of per item.
import { DatabaseBusy } from '../domain/errors.ts';

export interface BatcherOptions<I> {
  maxBatch?: number;
  maxInFlight?: number;
  /** Items with the same key are never written at the same time (e.g. two changes of one task): the later waits. */
  key?: (item: I) => string;
  /** Rough size of an item in bytes; a statement carries at most `maxBatchBytes` (and at least one item). */
  size?: (item: I) => number;
  maxBatchBytes?: number;
  /** Items beyond this many waiting are refused (503) instead of queued without bound. */
  maxQueued?: number;
  /** An item still waiting after this long is refused (503), as a request waiting for a connection would be. */
  queueTimeoutMs?: number;
}

interface Pending<I, O> { item: I; at: number; resolve(out: O): void; reject(err: unknown): void }

// Errors of one item's data (SQLSTATE classes 22 and 23: bad value, constraint): the others of its
// batch deserve a statement without it.
const isDataError = (err: unknown) => /^2[23]/.test(String((err as { code?: unknown })?.code ?? ''));
// Lock conflicts between concurrent statements: the same batch may simply be run again.
const isRetryable = (err: unknown) => ['40001', '40P01'].includes(String((err as { code?: unknown })?.code ?? ''));

export class StatementBatcher<I, O> {
  private queue: Pending<I, O>[] = [];
  private inFlight = 0;
  private readonly busyKeys = new Set<string>();
  private readonly opts: Required<Omit<BatcherOptions<I>, 'key' | 'size'>> & Pick<BatcherOptions<I>, 'key' | 'size'>;

  /** `run` writes the items in ONE statement and returns one result per item, in order. */
  constructor(private readonly run: (items: I[]) => Promise<O[]>, opts: BatcherOptions<I> = {}) {
    this.opts = { maxBatch: 100, maxInFlight: 2, maxBatchBytes: 8 * 1024 * 1024, maxQueued: 10_000, queueTimeoutMs: 10_000, ...opts };
  }

  /** Resolves with the item's result once its statement has committed. */
  execute(item: I): Promise<O> {
    if (this.queue.length >= this.opts.maxQueued) return Promise.reject(new DatabaseBusy('Too many writes are waiting for the database; retry shortly'));
    return new Promise((resolve, reject) => {
      this.queue.push({ item, at: Date.now(), resolve, reject });
      this.drain();
    });
  }

  private drain(): void {
    while (this.inFlight < this.opts.maxInFlight && this.queue.length) {
      const batch = this.take();
      if (!batch.length) return;
      this.inFlight += 1;
      void this.flush(batch).finally(() => {
        this.inFlight -= 1;
        if (this.opts.key) for (const p of batch) this.busyKeys.delete(this.opts.key(p.item));
        this.drain();
      });
    }
  }

  private take(): Pending<I, O>[] {
    const { key, size, maxBatch, maxBatchBytes, queueTimeoutMs } = this.opts;
    const now = Date.now();
    const batch: Pending<I, O>[] = [];
    const rest: Pending<I, O>[] = [];
    const seen = new Set<string>();
    let bytes = 0;
    let i = 0;
    for (; i < this.queue.length && batch.length < maxBatch; i++) {
      const p = this.queue[i];
      if (now - p.at > queueTimeoutMs) {
        p.reject(new DatabaseBusy('The database is too busy to take this write; retry shortly'));
        continue;
      }
      const k = key?.(p.item);
      // A key already in a running statement, or met earlier in the queue, keeps its later items waiting, in order.
      if (k !== undefined && (this.busyKeys.has(k) || seen.has(k))) {
        seen.add(k);
        rest.push(p);
        continue;
      }
      if (k !== undefined) seen.add(k);
      const s = size?.(p.item) ?? 0;
      if (batch.length && bytes + s > maxBatchBytes) break;
      bytes += s;
      batch.push(p);
    }
    this.queue = rest.concat(this.queue.slice(i));
    if (key) for (const p of batch) this.busyKeys.add(key(p.item));
    return batch;
  }

  private async runChecked(items: I[]): Promise<O[]> {
    const out = await Promise.resolve().then(() => this.run(items));
    if (out.length !== items.length) throw new Error(`statement returned ${out.length} results for ${items.length} items`);
    return out;
  }

  private async flush(batch: Pending<I, O>[]): Promise<void> {
    const items = batch.map((p) => p.item);
    let out: O[];
    try {
      out = await this.runChecked(items).catch((err) => (isRetryable(err) ? this.runChecked(items) : Promise.reject(err)));
    } catch (err) {
      if (batch.length > 1 && isDataError(err)) {
        // One bad item must not fail the others: write them one at a time to find it.
        for (const p of batch) await this.runChecked([p.item]).then((o) => p.resolve(o[0]), p.reject);
      } else {
        for (const p of batch) p.reject(err);
      }
      return;
    }
    batch.forEach((p, i) => p.resolve(out[i]));
  }
}

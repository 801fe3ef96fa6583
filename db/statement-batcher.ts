// Coalesces concurrent calls of a hot statement into multi-row statements. An item is written at
// once when fewer than `maxInFlight` statements are running, so a lone call waits for nothing;
// under load, items that arrive while statements run go together into the next one. Postgres then
// pays one execution, one commit and one round trip per batch instead of per item.
export interface BatcherOptions<I> {
  maxBatch?: number;
  maxInFlight?: number;
  /** Items with the same key never share a statement (e.g. two changes of one task): the later waits. */
  key?: (item: I) => string;
}

interface Pending<I, O> { item: I; resolve(out: O): void; reject(err: unknown): void }

export class StatementBatcher<I, O> {
  private queue: Pending<I, O>[] = [];
  private inFlight = 0;
  private readonly maxBatch: number;
  private readonly maxInFlight: number;

  /** `run` writes the items in ONE statement and returns one result per item, in order. */
  constructor(private readonly run: (items: I[]) => Promise<O[]>, private readonly opts: BatcherOptions<I> = {}) {
    this.maxBatch = opts.maxBatch ?? 100;
    this.maxInFlight = opts.maxInFlight ?? 2;
  }

  /** Resolves with the item's result once its statement has committed. */
  execute(item: I): Promise<O> {
    return new Promise((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      this.drain();
    });
  }

  private drain(): void {
    while (this.inFlight < this.maxInFlight && this.queue.length) {
      const batch = this.take();
      this.inFlight += 1;
      void this.flush(batch).finally(() => {
        this.inFlight -= 1;
        this.drain();
      });
    }
  }

  private take(): Pending<I, O>[] {
    const { key } = this.opts;
    if (!key) return this.queue.splice(0, this.maxBatch);
    const batch: Pending<I, O>[] = [];
    const rest: Pending<I, O>[] = [];
    const keys = new Set<string>();
    // Walks the whole queue so a key already seen keeps all its later items in order for later.
    for (const p of this.queue) {
      const k = key(p.item);
      if (batch.length < this.maxBatch && !keys.has(k)) batch.push(p);
      else rest.push(p);
      keys.add(k);
    }
    this.queue = rest;
    return batch;
  }

  private async flush(batch: Pending<I, O>[]): Promise<void> {
    try {
      const out = await this.run(batch.map((p) => p.item));
      batch.forEach((p, i) => p.resolve(out[i]));
    } catch (err) {
      if (batch.length === 1) return batch[0].reject(err);
      // One bad item must not fail the others: write each alone to find it.
      await Promise.all(batch.map((p) => this.run([p.item]).then((o) => p.resolve(o[0]), p.reject)));
    }
  }
}

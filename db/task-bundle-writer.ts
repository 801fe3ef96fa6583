import type { Knex } from 'knex';
import { insertTaskBundles, type TaskBundle } from './tasks.ts';

interface Pending { bundle: TaskBundle; resolve(seqs: number[]): void; reject(err: unknown): void }

// Coalesces concurrent task intakes into multi-row statements. A bundle is written at once when
// fewer than `maxInFlight` statements are running, so a lone request waits for nothing; under
// load, bundles that arrive while statements run are written together by the next one. Postgres
// then pays parse/plan-free execution, one commit and one round trip per batch instead of per task.
export class TaskBundleWriter {
  private queue: Pending[] = [];
  private inFlight = 0;

  constructor(private readonly db: Knex, private readonly maxBatch = 100, private readonly maxInFlight = 2) {}

  /** Resolves with the bundle's timeline seqs once its rows are committed. */
  write(bundle: TaskBundle): Promise<number[]> {
    return new Promise((resolve, reject) => {
      this.queue.push({ bundle, resolve, reject });
      this.drain();
    });
  }

  private drain(): void {
    while (this.inFlight < this.maxInFlight && this.queue.length) {
      const batch = this.queue.splice(0, this.maxBatch);
      this.inFlight += 1;
      void this.flush(batch).finally(() => {
        this.inFlight -= 1;
        this.drain();
      });
    }
  }

  private async flush(batch: Pending[]): Promise<void> {
    try {
      const seqs = await insertTaskBundles(this.db, batch.map((p) => p.bundle));
      batch.forEach((p, i) => p.resolve(seqs[i]));
    } catch (err) {
      if (batch.length === 1) return batch[0].reject(err);
      // One bad bundle must not fail the others: write each alone to find it.
      await Promise.all(batch.map((p) => insertTaskBundles(this.db, [p.bundle]).then((s) => p.resolve(s[0]), p.reject)));
    }
  }
}

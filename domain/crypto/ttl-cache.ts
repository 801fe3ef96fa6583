// A small per-process cache with a bounded lifetime and size (unwrapped DEKs, key wrappers).
export class TtlCache<V> {
  private entries = new Map<string, { value: V; expires: number }>();

  constructor(private readonly ttlMs: () => number, private readonly maxEntries = 10_000) {}

  get(key: string): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (e.expires <= Date.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return e.value;
  }

  set(key: string, value: V): void {
    const ttl = this.ttlMs();
    if (ttl <= 0) return;
    this.entries.delete(key);
    // Maps iterate in insertion order, so the first key is the oldest entry.
    if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(key, { value, expires: Date.now() + ttl });
  }

  delete(key: string): void {
    this.entries.delete(key);
  }

  clear(): void {
    this.entries.clear();
  }
}

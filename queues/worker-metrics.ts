// Metrics of the work the worker processes do (job durations and outcomes, enqueue lag, stalled
// jobs, agent runs' ends, credential refreshes), reported by any API process's /metrics. Each worker adds what it observed to
// counters in Redis, one hash per metric, once a second; a scrape reads the totals of all workers.
// They are Prometheus counters and histograms: they only grow, whichever process answers.
import type { Redis } from 'ioredis';
import type { MetricValueWithName, Registry } from 'prom-client';
import { RUN_RESULTS } from '../domain/task-states.ts';
import type { RefreshOutcome } from '../domain/bridge/credential-refresh.ts';
import { QUEUE_NAMES } from './names.ts';

const MAX_PENDING_SERIES = 10_000;
const BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600];

export const WORKER_METRICS = {
  taskbridge_job_duration_seconds: {
    type: 'histogram', labels: ['queue', 'outcome'],
    help: 'Time a worker spent on a job attempt, by queue and outcome of the job (completed; failed: for good; retrying: the attempt failed and the job will run again)',
  },
  taskbridge_job_enqueue_lag_seconds: {
    type: 'histogram', labels: ['queue'],
    help: "Time from a job's enqueue (or the end of its delay) to the start of its first attempt",
  },
  taskbridge_jobs_stalled_total: {
    type: 'counter', labels: ['queue'],
    help: 'Jobs found stalled (their worker died or was blocked past WORKER_LOCK_MS) and moved back to wait, by queue',
  },
  // A job's outcome is not its task's: a run that fails its task on the last attempt completes its job.
  taskbridge_agent_runs_total: {
    type: 'counter', labels: ['outcome'],
    help: 'Agent runs by the status they ended their task in (completed, failed, canceled, rejected, input-required, auth-required), counted when that status is written',
  },
  taskbridge_credential_refreshes_total: {
    type: 'counter', labels: ['outcome'],
    help: 'Credential refresh jobs by outcome (refreshed, not_due, gone, refresh_failed: gave up; retrying: an attempt failed; error: the last attempt failed to record that)',
  },
} as const;
type Name = keyof typeof WORKER_METRICS;

// Every series a worker can report, shown at 0 until it does: a rate or an alert on one then works
// from the start, not only once the first such job has run (an absent series reads as no data).
const perQueue = QUEUE_NAMES.map((queue) => ({ queue }));
const outcomes = (values: readonly string[]) => values.map((outcome) => ({ outcome: outcome.replaceAll(' ', '_') }));
const REFRESH_OUTCOMES = Object.keys({ refreshed: 1, 'not due': 1, gone: 1, refresh_failed: 1 } satisfies Record<RefreshOutcome, 1>);
const KNOWN_SERIES: Record<Name, readonly Record<string, string>[]> = {
  taskbridge_job_duration_seconds: perQueue.flatMap((q) => ['completed', 'failed', 'retrying'].map((outcome) => ({ ...q, outcome }))),
  taskbridge_job_enqueue_lag_seconds: perQueue,
  taskbridge_jobs_stalled_total: perQueue,
  taskbridge_agent_runs_total: outcomes(RUN_RESULTS),
  taskbridge_credential_refreshes_total: outcomes([...REFRESH_OUTCOMES, 'retrying', 'error']),
};
type Histogram = { [K in Name]: (typeof WORKER_METRICS)[K]['type'] extends 'histogram' ? K : never }[Name];
type Counter = Exclude<Name, Histogram>;
type Labels<N extends Name> = Record<(typeof WORKER_METRICS)[N]['labels'][number], string>;

const hashKey = (prefix: string, name: Name) => `${prefix}:metrics:${name}`;
// A hash field is one series of the metric: its label values, then the part (a bucket's bound, sum
// or count), i.e. JSON.stringify([labels, part]), built from the labels' JSON made once per observation.
const field = (series: string, part: string) => `[${series},${JSON.stringify(part)}]`;
const BUCKET_PARTS = BUCKETS.map(String);

interface Increment { by: number; float: boolean }

// Worker side: observations are added up in memory and flushed in one round trip a second.
export class WorkerMetrics {
  private pending = new Map<Name, Map<string, Increment>>();
  private timer?: NodeJS.Timeout;

  constructor(private readonly redis: Redis, private readonly prefix: string, private readonly flushMs = 1000) {}

  private add(name: Name, f: string, by: number, float = false) {
    let m = this.pending.get(name);
    if (!m) this.pending.set(name, (m = new Map()));
    const inc = m.get(f);
    if (inc) inc.by += by;
    else m.set(f, { by, float });
  }

  // A series' hash fields (its buckets', +Inf, sum, count), built once per series: an observation
  // (two a job) then builds no strings.
  private fieldsOf = new Map<string, { buckets: string[]; inf: string; sum: string; count: string }>();

  private seriesFields(labels: Record<string, string>) {
    const series = JSON.stringify(labels);
    let f = this.fieldsOf.get(series);
    if (!f) {
      if (this.fieldsOf.size >= MAX_PENDING_SERIES) this.fieldsOf.clear();
      this.fieldsOf.set(series, (f = { buckets: BUCKET_PARTS.map((p) => field(series, p)), inf: field(series, '+Inf'), sum: field(series, 'sum'), count: field(series, 'count') }));
    }
    return f;
  }

  observe<N extends Histogram>(name: N, labels: Labels<N>, seconds: number): void {
    const value = Math.max(0, seconds);
    const f = this.seriesFields(labels);
    for (let i = 0; i < BUCKETS.length; i++) if (value <= BUCKETS[i]) this.add(name, f.buckets[i], 1);
    this.add(name, f.inf, 1);
    this.add(name, f.sum, value, true);
    this.add(name, f.count, 1);
  }

  count<N extends Counter>(name: N, labels: Labels<N>): void {
    this.add(name, field(JSON.stringify(labels), 'count'), 1);
  }

  // A batch Redis did not take (connection lost) is kept for the next flush, unless too many series
  // wait already, so a blip loses nothing. Sums are floats in Redis, everything else integers.
  async flush(): Promise<void> {
    if (!this.pending.size) return;
    const batch = this.pending;
    this.pending = new Map();
    const multi = this.redis.multi();
    let series = 0;
    for (const [name, fields] of batch) {
      const key = hashKey(this.prefix, name);
      for (const [f, { by, float }] of fields) {
        series++;
        if (float) multi.hincrbyfloat(key, f, by);
        else multi.hincrby(key, f, by);
      }
    }
    let results;
    try {
      results = await multi.exec();
    } catch (err) {
      if (series <= MAX_PENDING_SERIES) for (const [name, fields] of batch) for (const [f, { by, float }] of fields) this.add(name, f, by, float);
      throw err;
    }
    // Inside a transaction the other increments were applied: nothing to keep.
    const failed = results?.find(([err]) => err)?.[0];
    if (failed) throw failed;
  }

  start(onError: (err: Error) => void): void {
    this.timer = setInterval(() => this.flush().catch(onError), this.flushMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }
}

type Stored = Record<string, string>;

// API side: the metrics as prom-client collectors that read their hash at scrape time. `guard`
// wraps each read; undefined from it (Redis down, api/metrics.ts) leaves the metric's series out.
export function registerWorkerMetrics(
  registry: Registry, redis: Redis, prefix: string,
  guard: (name: Name, read: () => Promise<Stored>) => Promise<Stored | undefined> = (_, read) => read(),
): void {
  for (const [name, def] of Object.entries(WORKER_METRICS) as [Name, (typeof WORKER_METRICS)[Name]][]) {
    // prom-client formats any object with get(); its typings want a whole Metric class.
    registry.registerMetric({
      name, help: def.help, type: def.type,
      async get() {
        const stored = await guard(name, () => redis.hgetall(hashKey(prefix, name)));
        const series = new Map<string, { labels: Record<string, string>; parts: Map<string, number> }>();
        // Redis not answering leaves the metric out rather than showing zeros nobody counted.
        if (stored) for (const labels of KNOWN_SERIES[name]) series.set(JSON.stringify(labels), { labels, parts: new Map() });
        for (const [f, v] of Object.entries(stored ?? {})) {
          const [labels, part] = JSON.parse(f) as [Record<string, string>, string];
          const id = JSON.stringify(labels);
          if (!series.has(id)) series.set(id, { labels, parts: new Map() });
          series.get(id)!.parts.set(part, Number(v));
        }
        const values: MetricValueWithName<string>[] = [];
        for (const { labels, parts } of series.values()) {
          if (def.type === 'counter') {
            values.push({ labels, value: parts.get('count') ?? 0 });
            continue;
          }
          for (const le of [...BUCKETS.map(String), '+Inf']) values.push({ metricName: `${name}_bucket`, labels: { ...labels, le }, value: parts.get(le) ?? 0 });
          values.push({ metricName: `${name}_sum`, labels, value: parts.get('sum') ?? 0 });
          values.push({ metricName: `${name}_count`, labels, value: parts.get('count') ?? 0 });
        }
        return { name, help: def.help, type: def.type, aggregator: 'sum', values };
      },
    } as never);
  }
}

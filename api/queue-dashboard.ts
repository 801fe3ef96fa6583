// The standard BullMQ dashboard (bull-board) at /admin/queues, for the people who watch the
// queues. Browsers cannot send bearer tokens, so it takes HTTP basic auth: any user name, an API
// key with scope admin as the password.
import type { Context, Middleware } from 'koa';
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { KoaAdapter } from '@bull-board/koa';
import type { Services } from '../domain/services.ts';
import { hasScope } from '../domain/api-keys.ts';
import { AppError, Forbidden, Unauthenticated } from '../domain/errors.ts';
import { verifyKey } from './middleware/auth.ts';
import { readJsonBody } from './middleware/body.ts';
import { BACKOFF_TYPES, JOB_PAYLOAD_SCHEMAS, QUEUE_NAMES, type QueueName } from '../queues/names.ts';
import { MAX_TIMER_MS } from '../domain/with-timeout.ts';
import { checkValid, compileSchema, worded } from '../domain/schema-check.ts';
import type { ValidateFunction } from 'ajv';
import { Type, type TSchema } from '@sinclair/typebox';
import { rateLimit } from './middleware/rate-limit.ts';
import { prefixMatchedRoute } from './middleware/access-log.ts';

export const DASHBOARD_PATH = '/admin/queues';

function basicPassword(header: string): string | undefined {
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header);
  if (!m) return undefined;
  const decoded = Buffer.from(m[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon >= 0 ? decoded.slice(colon + 1) : undefined;
}

// A browser sends its cached basic credentials with requests that pages of other sites make it send
// (a form post, a no-cors fetch): a change (add, retry, clean, pause) must come from a page of the
// dashboard's own origin, and never as a form, which needs no permission to be posted from elsewhere.
// Its origin is the browser's word (Sec-Fetch-Site), else the Host it was sent to or PUBLIC_URL's
// (a proxy may rewrite Host).
function sentFromElsewhere(ctx: Context, publicHost: string): boolean {
  if (['GET', 'HEAD', 'OPTIONS'].includes(ctx.method)) return false;
  if (ctx.is('urlencoded', 'multipart', 'text/plain')) return true;
  const site = ctx.get('Sec-Fetch-Site');
  if (site === 'same-origin') return false;
  if (site && site !== 'none') return true;
  const origin = ctx.get('Origin');
  if (!origin) return false;
  try {
    const host = new URL(origin).host;
    return host !== ctx.host && host !== publicHost;
  } catch {
    return true;
  }
}

// A job id BullMQ takes: it refuses a number, and a string that reads as an integer (`0`, `12`) or NaN or holds ':'.
const JobId = Type.String({ minLength: 1, pattern: worded('^(?!-?\\d+$|NaN$)[^:]+$', "must be a job id: not an integer or NaN, and without ':'") });
// The bodies of bull-board's add (`data`, `options`) and edit (`jobData`) of a job, by queue.
const bodyChecks = (body: (payload: TSchema) => TSchema) => Object.fromEntries(QUEUE_NAMES.map((q) => [q, compileSchema(body(JOB_PAYLOAD_SCHEMAS[q]))])) as Record<QueueName, ValidateFunction>;
// A body checked alike on every queue.
const everyQueue = (body: TSchema) => bodyChecks(() => body);
// Matched as bull-board's router matches them: any case, a trailing slash, the queue name decoded.
const queueRoute = (rest: string) => new RegExp(`^${DASHBOARD_PATH}/api/queues/([^/]+)/${rest}/?$`, 'i');
// An edit of one job: bull-board routes `job-schedulers/<id>` to its scheduler edit first, so a
// scheduler named `delay` or `update-data` is not a job of id job-schedulers.
const jobRoute = (action: string) => queueRoute(`(?!job-schedulers/)[^/]+/${action}`);
const Integer = (minimum: number, maximum: number) => Type.Integer({ minimum, maximum });
// A job added by hand takes the options an operator sets on one, bounded: BullMQ took any it knows
// as sent (a delay of 1e308 put the job at score inf, never to run; a parent, a repeat, a
// deduplication or a size limit of its own, a made-up timestamp). The add form's duplicate of a job
// sends that job's options, which hold its queue's defaults (attempts, backoff, removeOn*).
const MAX_DELAY_MS = 365 * 86_400_000;
const MAX_PRIORITY = 2_097_151; // BullMQ's PRIORITY_LIMIT
const MAX_ATTEMPTS = 100; // as the *_ATTEMPTS settings
const MAX_KEPT_JOBS = 1_000_000;
const MAX_KEPT_AGE_S = 365 * 86_400;
// true or false, else how many finished jobs to keep and for how long (s).
const KeepJobs = Type.Unsafe<boolean | { count?: number; age?: number }>({
  type: ['boolean', 'object'], properties: { count: Integer(0, MAX_KEPT_JOBS), age: Integer(1, MAX_KEPT_AGE_S) }, additionalProperties: false,
});
const JobOptions = Type.Object({
  jobId: Type.Optional(JobId),
  delay: Type.Optional(Integer(0, MAX_DELAY_MS)),
  priority: Type.Optional(Integer(0, MAX_PRIORITY)),
  lifo: Type.Optional(Type.Boolean()),
  attempts: Type.Optional(Integer(1, MAX_ATTEMPTS)),
  backoff: Type.Optional(Type.Object({ type: Type.Union(BACKOFF_TYPES.map((t) => Type.Literal(t))), delay: Integer(0, MAX_TIMER_MS) }, { additionalProperties: false })),
  removeOnComplete: Type.Optional(KeepJobs),
  removeOnFail: Type.Optional(KeepJobs),
}, { additionalProperties: false });
// bull-board takes any integer from 0 up (1e308 is one) and BullMQ stores it as written: 309 digits
// of concurrency, or a rate limit's duration that Redis's PEXPIRE refuses each time a worker takes a
// job, the job then stuck in active. 0 removes the limit: the dashboard's form sends it for an empty field.
const MAX_GLOBAL_CONCURRENCY = 100_000;
const MAX_RATE_LIMIT_JOBS = 1_000_000;
const MAX_RATE_LIMIT_MS = 86_400_000;
// A delayed job's new run time (ms since 1970) up to the end of the year 9999: bull-board took any
// finite number, and 1e308 put the job in the delayed set at score inf, never to run.
const LAST_RUN_AT = Date.UTC(9999, 11, 31, 23, 59, 59, 999);
// A job scheduler's schedule as bull-board's edit form sends it: a cron pattern (with its time zone)
// or an interval, a limit of runs, an end date; null a limit or end date of none. bull-board and
// BullMQ took an interval or limit of 1e308 (stored as 1: a run every millisecond), a fraction, a
// time zone for an interval, members they then ignore. bull-board keeps the template (name, data,
// options) as stored, so one sent is refused rather than dropped unsaid. A past end date is
// bull-board's 400.
const MIN_EVERY_MS = 1000;
const MAX_SCHEDULER_RUNS = 1_000_000_000;
const CRON_FIELD = '[0-9A-Za-z*,/?#-]+';
const SchedulerEdit = Type.Object({
  pattern: Type.Optional(Type.String({
    maxLength: 128,
    pattern: worded(`^(@[a-z]+|${CRON_FIELD}( ${CRON_FIELD}){4,5})$`, 'must be a cron pattern: 5 or 6 fields (digits, letters, * , - / ? # ) or an @ alias such as @daily'),
  })),
  tz: Type.Optional(Type.String({ maxLength: 64, format: 'time-zone' })),
  every: Type.Optional(Integer(MIN_EVERY_MS, MAX_DELAY_MS)),
  limit: Type.Optional(Type.Union([Integer(1, MAX_SCHEDULER_RUNS), Type.Null()])),
  endDate: Type.Optional(Type.Union([Integer(0, LAST_RUN_AT), Type.Null()])),
}, { additionalProperties: false, oneOf: [{ required: ['pattern'] }, { required: ['every'] }], dependencies: { tz: ['pattern'] } });
const BODY_CHECKS = [
  {
    method: 'POST', path: queueRoute('add'),
    check: bodyChecks((data) => Type.Object({ data, options: Type.Optional(JobOptions) })),
  },
  { method: 'PATCH', path: jobRoute('update-data'), check: bodyChecks((jobData) => Type.Object({ jobData })) },
  { method: 'PATCH', path: jobRoute('delay'), check: everyQueue(Type.Object({ runAt: Integer(0, LAST_RUN_AT) })) },
  { method: 'PATCH', path: jobRoute('priority'), check: everyQueue(Type.Object({ priority: Integer(0, MAX_PRIORITY) })) },
  { method: 'PATCH', path: queueRoute('job-schedulers/[^/]+'), check: everyQueue(SchedulerEdit) },
  { method: 'PUT', path: queueRoute('concurrency'), check: everyQueue(Type.Object({ concurrency: Integer(0, MAX_GLOBAL_CONCURRENCY) })) },
  {
    // {} or a null max removes the limit (the form's empty fields); a duration alone would remove it too.
    method: 'PUT', path: queueRoute('rate-limit'),
    check: everyQueue(Type.Object(
      { max: Type.Optional(Type.Union([Integer(1, MAX_RATE_LIMIT_JOBS), Type.Null()])), duration: Type.Optional(Integer(1, MAX_RATE_LIMIT_MS)) },
      { dependencies: { duration: ['max'] }, if: { required: ['max'], properties: { max: { type: 'integer' } } }, then: { required: ['duration'] } },
    )),
  },
];
const decoded = (segment: string) => { try { return decodeURIComponent(segment); } catch { return segment; } };

// A job added or edited by hand holds what its queue's worker reads: one that does not (data null, a
// task id that is no UUID) would fail in the worker, where no one who sent it sees why. A queue's
// settings are held to what its workers can run with.
function checkBody(ctx: Context): void {
  for (const route of BODY_CHECKS) {
    const match = ctx.method === route.method ? route.path.exec(ctx.path) : null;
    const queue = match && decoded(match[1]);
    if (queue && (QUEUE_NAMES as readonly string[]).includes(queue)) checkValid(route.check[queue as QueueName], (ctx.request as { body?: unknown }).body, 'body');
  }
}

export function queueDashboard(services: Services): Middleware {
  const adapter = new KoaAdapter();
  adapter.setBasePath(DASHBOARD_PATH);
  createBullBoard({ queues: QUEUE_NAMES.map((q) => new BullMQAdapter(services.queues[q], { jobDataSchema: JOB_PAYLOAD_SCHEMAS[q] })), serverAdapter: adapter });
  // bull-board's own handler answers every failure 500, unlogged: passed on instead to the API's
  // (api/middleware/errors.ts), Redis out of reach is 503 with Retry-After at warn, a fault 500 at error.
  adapter.setErrorHandler((err) => { throw err; });
  const board = adapter.registerPlugin() as unknown as Middleware;
  const publicHost = new URL(services.cfg.PUBLIC_URL).host;
  const limited = rateLimit(services);
  return async (ctx, next) => {
    if (ctx.path !== DASHBOARD_PATH && !ctx.path.startsWith(`${DASHBOARD_PATH}/`)) return next();
    const password = basicPassword(ctx.get('Authorization'));
    const principal = password ? await verifyKey(services, ctx.ip, password) : null;
    if (!principal) {
      throw new Unauthenticated('The queue dashboard needs an admin API key as the basic-auth password', 'Basic realm="taskbridge queues", charset="UTF-8"');
    }
    // Its requests count against the key's RATE_LIMIT_PER_SECOND as the API's do, before the scope as there.
    ctx.state.principal = principal;
    await limited(ctx, async () => {
      if (!hasScope(principal, 'admin')) throw new Forbidden('admin');
      if (sentFromElsewhere(ctx, publicHost)) {
        throw new AppError(403, 'forbidden', 'The queue dashboard takes changes only from its own pages (same origin, JSON or no body)');
      }
      // Read as the API reads bodies (nesting, NUL, size), so bull-board's own parser is skipped: a job
      // nested thousands deep overflowed the stack when BullMQ wrote it, a 500.
      if (!['GET', 'HEAD', 'OPTIONS'].includes(ctx.method)) (ctx.request as { body?: unknown }).body = await readJsonBody(ctx, services.cfg.BODY_LIMIT_BYTES) ?? {};
      checkBody(ctx);
      try {
        await board(ctx, next);
      } finally {
        prefixMatchedRoute(ctx, DASHBOARD_PATH);
      }
    });
  };
}

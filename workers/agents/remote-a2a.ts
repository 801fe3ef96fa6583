// AGENT_KIND=remote: the agent is another A2A server. Each local task is mirrored by one remote
// task (kept across turns in remote_agent_tasks): the user's message is forwarded with the
// @a2a-js/sdk 0.3 client, the remote task is streamed (or polled when the remote cannot stream),
// and its messages, working updates and artifacts are copied into the local task; the run ends
// with the remote task's final or interrupted state; a remote that answers with a message instead
// of a task completes the run with it. Canceling the local task cancels the remote one:
// the run does it, and a housekeeping pass does it for tasks canceled between runs.
//
// AGENT_REMOTE_URL is the remote agent's base URL (its card is read from
// <url>/.well-known/agent-card.json) or the full URL of its agent card (ending in .json);
// AGENT_REMOTE_API_KEY, when set, is sent as a bearer token with every request to that URL's origin
// (and to AGENT_REMOTE_KEY_ORIGINS), never to another origin the remote's card names.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Knex } from 'knex';
import type {
  Artifact, Message as A2AMessage, Part, Task as A2ATask, TaskState as A2AState, TaskStatus,
} from '@a2a-js/sdk';
import {
  ClientFactory, DefaultAgentCardResolver, JsonRpcTransportFactory, TaskNotCancelableError, TaskNotFoundError, type Client,
} from '@a2a-js/sdk/client';
import {
  forgetRemoteAgentTask, getRemoteAgentTask, remoteContextOf, remoteTaskIdsOf, takeRemoteTasksToCancel, saveFirstRemoteAgentTask, saveRemoteAgentTask,
  recordAnswering, type AnsweredInterruption, type RemoteAgentTaskRow, type RemoteInterruption,
} from '../../db/remote-agent-tasks.ts';
import { listArtifactItems } from '../../db/timeline-views.ts';
import { ownStore } from './own-store.ts';
import type { Logger } from '../../domain/logger.ts';
import { jsonErrorWithoutExcerpt, publicReason, refusedByRuntime } from '../../domain/errors.ts';
import { assertOutboundUrl } from '../../domain/webhook-url.ts';
import { maskUrlCredentials } from '../../domain/config.ts';
import { secretMasker } from '../../domain/secret-mask.ts';
import { callSignal } from '../../domain/call-signal.ts';
import { fetchPublicOnly, fetchUntimed } from '../../domain/bridge/upstream.ts';
import { artifactsFromTimeline, fromA2APart, toA2APart } from '../../domain/a2a/mapping.ts';
import { chunkBetween, chunkChanges, HeldArtifacts } from '../../domain/a2a/artifact-merge.ts';
import type { MessagePart } from '../../domain/shapes/task.ts';
import { sameAsStored, storableText } from '../../domain/storable-json.ts';
import { RUN_TAKE, type Agent, type AgentContext, type AgentResult, type Reply } from './types.ts';
import { checkEvent, type StreamEvent } from './remote-answers.ts';
import { cutReason } from '../fail-run.ts';

const FINAL_STATES: Partial<Record<A2AState, NonNullable<AgentResult['status']>>> = {
  completed: 'completed',
  failed: 'failed',
  rejected: 'rejected',
  canceled: 'canceled',
  'input-required': 'input-required',
  'auth-required': 'auth-required',
};
const INTERRUPTED = { 'input-required': true, 'auth-required': true };
// How much of a remote task's history a run reads: what was mirrored already, and what is new.
const SEEN_HISTORY = 1000;
const POLL_MIN_MS = 100;
const POLL_MAX_MS = 2000;
const CANCEL_TIMEOUT_MS = 5000;
// How often a left remote task the remote would not cancel is asked again (by whichever worker takes it).
const CANCEL_RETRY_MS = 60_000;
// A pass takes left remote tasks a few at a time: a batch whose cancels all time out
// (CANCEL_TIMEOUT_MS each) is done before CANCEL_RETRY_MS, so no other worker takes its rows again meanwhile.
const CANCEL_BATCH = 10;
const CANCELS_PER_PASS = 100;
// How many status messages and artifacts a run notes without the local task holding them (a status
// message of another state than working, an artifact of no parts), at most: each is kept to tell a
// repeat, and nothing stored counts against the task's limits, so a remote sending fresh ones without
// end would fill the worker's memory. Ids are not forgotten instead: a repeat would then be mirrored again.
const MAX_UNHELD = 500;

// What the SDK reads whole (a card, a call's answer) and each line of a stream, at most: it buffers
// both without a bound, so an endless answer or line (or a gzip bomb: this counts decoded bytes)
// would fill the worker's memory.
const MAX_ANSWER_BYTES = 16 * 1024 * 1024;
const REMOTE_TIMEOUT_MS = 30_000;
// What the SDK writes after a remote's JSON-RPC error message (its one capturing group keeps it in a split).
const SDK_ERROR_CODE = /( \(Code: [^)]*\)(?: Data: )?)/;
// How long a card read serves the runs that follow it (see connect).
const CARD_MAX_AGE_MS = 5 * 60_000;

// The signals of message/stream calls the remote took (HTTP 200, an event stream): from then on the
// message may have reached it. The SDK hands a call's signal to fetch as it was given.
const streamsTaken = new WeakSet<AbortSignal>();

// The JSON-RPC method a call sends, if its body names one.
function methodOf(init: RequestInit | undefined): unknown {
  if (typeof init?.body !== 'string') return undefined;
  try {
    return (JSON.parse(init.body) as { method?: unknown }).method;
  } catch {
    return undefined;
  }
}

// fetch's own error says only "fetch failed"; why (a refused connection, a name that does not
// resolve, a reset, a certificate) is in its cause, which the failure reason would otherwise leave out.
function unreached(err: unknown): unknown {
  const cause = (err as { cause?: { message?: unknown; code?: unknown } }).cause;
  const why = cause?.message || cause?.code;
  return err instanceof TypeError && typeof why === 'string' ? new Error(`the remote agent could not be reached: ${why}`, { cause: err }) : err;
}

// The SDK parses a call's answer with Response.json(), whose error is the parser's words alone (a
// failure reason that names no party), and a stream's line with JSON.parse, its error quoting the
// line's first 100 characters (the parser's error its cause). Both quote what the remote sent, which
// may echo the request, Authorization header and all, cut anywhere: said in our words and the
// parser's, without its excerpt, and without the SDK's error as the cause (a logged error's cause is
// printed with it). The SDK's HTTP errors (a proxy's 502 page) also carry a parse error as their
// cause, but their own message says the status, which is kept (its quote of the body is masked as
// every failure reason is).
const SSE_LINE_NOT_JSON = 'Failed to parse SSE event data';
function notJson(err: unknown): unknown {
  const parse = err instanceof SyntaxError ? err
    : err instanceof Error && err.message.startsWith(SSE_LINE_NOT_JSON) && err.cause instanceof SyntaxError ? err.cause : undefined;
  return parse ? new Error(`the remote agent answered what is not JSON: ${jsonErrorWithoutExcerpt(parse.message)}`) : err;
}

// The SDK sets no timeout, and reads the card without any signal: a remote that trickles an answer
// would hold the run, and every later run waiting on the same card read, for ever. A card or call
// answer must arrive whole within `timeoutMs`; a stream, which lasts as long as its remote task,
// must start within it, and its lines are bounded instead. A message/send (to a remote that cannot
// stream) is not timed: a remote may answer it only once its task ends, blocking: false being a
// hint, and a retry would send the message again; the run's cancel still ends it.
async function boundedFetch(call: (init: RequestInit) => Promise<Response>, init: RequestInit | undefined, timeoutMs: number): Promise<Response> {
  // Linked to the run's signal until the answer is read whole (or the stream ends): each poll of a
  // remote task is a call, and a run may poll for hours (domain/call-signal.ts).
  const linked = callSignal(init?.signal ?? undefined);
  const late = new Error(`the remote agent did not answer within ${timeoutMs} ms`);
  let timedOut = false;
  // An explicit timer: on Node 20 an AbortSignal.timeout can be garbage-collected unfired.
  const timer = methodOf(init) === 'message/send' ? undefined : setTimeout(() => { timedOut = true; linked.abort(late); }, timeoutMs);
  const over = () => {
    clearTimeout(timer);
    linked.release();
  };
  let res: Response;
  try {
    res = await call({ ...init, signal: linked.signal });
  } catch (err) {
    over();
    throw timedOut ? late : unreached(err);
  }
  // Refused by its status (RemoteRefused): the SDK would report it in its words, and not at all
  // when the body is a JSON-RPC error.
  if (res.status === 401 || res.status === 403) {
    over();
    await res.body?.cancel().catch(() => undefined);
    throw new RemoteRefused(`the remote agent answered HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`);
  }
  // Requests go with redirect: 'manual' (clientFactory): a followed redirect re-sent the user's
  // message, or read a card, wherever its Location pointed, internal addresses too, and the SDK then
  // quoted that page. The Location is not quoted: it names whatever the remote chose.
  if (res.status >= 300 && res.status < 400) {
    over();
    await res.body?.cancel().catch(() => undefined);
    throw new Error(`the remote agent answered HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''}: redirects are not followed (set AGENT_REMOTE_URL to the final address)`);
  }
  // A stream only where one was asked for and granted: the SDK reads any other answer whole (a card,
  // a call, a refused stream), whatever its type, so that one keeps its time and size bounds.
  const stream = res.ok && methodOf(init) === 'message/stream' && /^text\/event-stream/i.test(res.headers.get('content-type') ?? '');
  if (stream) clearTimeout(timer);
  if (stream && init?.signal) streamsTaken.add(init.signal);
  if (!res.body) {
    over();
    return res;
  }
  let size = 0;
  const counted = res.body.pipeThrough(new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, out) {
      const newline = stream ? chunk.lastIndexOf(10) : -1;
      size = newline >= 0 ? chunk.length - newline - 1 : size + chunk.length;
      if (size > MAX_ANSWER_BYTES) {
        over();
        throw new Error(`the remote agent answered ${stream ? 'a stream line' : 'a body'} longer than ${MAX_ANSWER_BYTES} bytes`);
      }
      out.enqueue(chunk);
    },
    flush: over,
  }));
  return new Response(counted, { status: res.status, statusText: res.statusText, headers: res.headers });
}

// The SDK's error for a stream event that is a JSON-RPC error.
const SSE_EVENT_ERROR = 'SSE event contained an error';

// A stream the remote took that failed before it named a task for the message (see send): the run
// fails at once, `cause` saying why, rather than sending the message again.
class SentUnnamed extends Error {
  constructor(readonly why: unknown) {
    super('the remote agent named no task');
  }
}

// The SDK's "Expected 3, got 3." for an answer whose JSON-RPC id is the request's in another JSON
// type (the string "3" for the number 3) reads as no mismatch at all.
function idMismatch(err: unknown): unknown {
  const ids = err instanceof Error ? /^JSON-RPC response ID mismatch.*\. Expected (.*), got (.*)\.$/s.exec(err.message) : null;
  return ids && ids[1] === ids[2] ? new Error(`the remote agent answered with JSON-RPC id ${ids[2]} of another JSON type than the request's (a string for a number)`) : err;
}

// An answer's 401 or 403 status, as boundedFetch reports it (for the card read, a call or a stream):
// the remote refused this worker's key, or its lack of one. Told apart by its class, not its text: a
// 401 or 403 in the remote's own words (its error message, an answer quoted) is no refusal of our key.
// The SDK passes a fetch's error on as it is; where we reword one, `reworded` keeps its class.
class RemoteRefused extends Error {}
// The remote named its task, and the row that would let a retry follow it could not be saved (a
// database failure).
class RemoteTaskUnrecorded extends Error {
  constructor(remoteTaskId: string, cause: unknown) {
    // publicReason: a database error's text quotes our SQL, and this may become the task's status message.
    super(`the remote task ${remoteTaskId} could not be recorded: ${publicReason(cause)}`, { cause });
  }
}
const reworded = (err: unknown, message: string): Error => (err instanceof RemoteRefused ? new RemoteRefused(message) : new Error(message));
const isEnd = (state: A2AState) => state in FINAL_STATES || state === 'unknown';
const partsOf = (parts: Part[] | undefined): MessagePart[] => (parts ?? []).map(fromA2APart);
// A remote message as the local task stores it, with its metadata.
const replyOf = (m: A2AMessage): Reply => (m.metadata && Object.keys(m.metadata).length ? { parts: partsOf(m.parts), metadata: m.metadata } : partsOf(m.parts));

// The run's result for a remote status that ends it; its message is left out when it was
// already mirrored as a reply.
function resultOf(status: TaskStatus, withMessage: boolean): AgentResult {
  const message = withMessage && status.message?.parts.length ? replyOf(status.message) : undefined;
  const mapped = FINAL_STATES[status.state];
  if (mapped === 'canceled') return { status: mapped, message: message ?? 'The remote agent canceled its task' };
  if (mapped) return { status: mapped, ...(message ? { message } : {}) };
  return { status: 'failed', message: message ?? `The remote agent ended its task as '${status.state}'` };
}

// The card path is resolved against the base URL, which drops a last segment without a slash:
// http://host/api/a2a/v1 would be read as http://host/api/a2a/.well-known/agent-card.json.
function cardLocation(url: string): [string, string | undefined] {
  if (/\.json$/i.test(new URL(url).pathname)) return [url, ''];
  return [url.endsWith('/') ? url : `${url}/`, undefined];
}

// The key goes only to the origins trusted with it: AGENT_REMOTE_URL's, and AGENT_REMOTE_KEY_ORIGINS.
// A card is the remote's own word on where its endpoint is; without this, a card pointing elsewhere
// would hand the key to whoever it names. For the same reason another origin the card names must be
// on a public address (unless AGENT_REMOTE_ALLOW_PRIVATE): checked before each call and again when
// connecting (DNS rebinding), or a card could aim the worker's calls at internal services. No
// request follows a redirect (boundedFetch fails it), AGENT_REMOTE_URL's origin's neither.
// `withheld` collects the origins the key was kept from.
function clientFactory(apiKey: string | undefined, trusted: ReadonlySet<string>, allowPrivate: boolean, timeoutMs: number, log: Logger, withheld: Set<string>): ClientFactory {
  const fetchImpl: typeof fetch = (input, init) => boundedFetch((bounded) => unbounded(input, bounded), init, timeoutMs);
  // Each call goes without undici's own limits on an answer (300 s, see fetchUntimed), boundedFetch's
  // instead: with them, a stream silent for 5 minutes while its remote task worked broke ("terminated",
  // a failed attempt), and a message/send answered that late failed too, to be sent again.
  const unbounded = async (input: Parameters<typeof fetch>[0], init: RequestInit): Promise<Response> => {
    const target = new URL(input instanceof Request ? input.url : input);
    const headers = new Headers(init?.headers);
    if (trusted.has(target.origin)) {
      if (apiKey) headers.set('authorization', `Bearer ${apiKey}`);
      return fetchUntimed(target.href, { ...init, headers, redirect: 'manual' });
    }
    if (apiKey && !withheld.has(target.origin)) {
      withheld.add(target.origin);
      log.warn({ origin: target.origin }, 'AGENT_REMOTE_API_KEY withheld from a remote agent endpoint outside the trusted origins (AGENT_REMOTE_URL and AGENT_REMOTE_KEY_ORIGINS)');
    }
    if (allowPrivate) return fetchUntimed(target.href, { ...init, headers, redirect: 'manual' });
    await assertOutboundUrl(target.href, false, `The remote agent endpoint ${target.origin} that its card names`, 'AGENT_REMOTE_ALLOW_PRIVATE');
    return fetchPublicOnly(target.href, { ...init, headers }, { untimed: true });
  };
  // JSON-RPC only (the SDK's defaults add HTTP+JSON): its REST transport writes a stream line it
  // cannot parse to stderr whole, key and all if the remote echoes it, past the log's masking.
  return new ClientFactory({ transports: [new JsonRpcTransportFactory({ fetchImpl })], cardResolver: new DefaultAgentCardResolver({ fetchImpl }) });
}

export interface RemoteAgentOptions {
  url: string;
  apiKey?: string;
  /** Origins besides url's that apiKey may be sent to (the card may name its endpoint elsewhere). */
  keyOrigins?: readonly string[];
  /** Whether other origins the card names may be on private, loopback or link-local addresses. */
  allowPrivate?: boolean;
  /** Longest a card or call answer may take to arrive whole, and a stream to start. */
  timeoutMs?: number;
  /** The worker's database: the remote task ids of local tasks live there. */
  db: Knex;
  log: Logger;
}

export function remoteAgent({ url, apiKey, keyOrigins = [], allowPrivate = false, timeoutMs = REMOTE_TIMEOUT_MS, db, log }: RemoteAgentOptions): Agent {
  const [base, cardPath] = cardLocation(url);
  const trusted = new Set([new URL(url).origin, ...keyOrigins]);
  const withheld = new Set<string>();
  // A refusal by an endpoint the key was kept from says why: the failure reason is all a client sees.
  const explained = <T,>(err: T): T | Error => (withheld.size && err instanceof RemoteRefused
    ? reworded(err, `${err.message} (AGENT_REMOTE_API_KEY was withheld from ${[...withheld].join(', ')}: neither AGENT_REMOTE_URL's origin nor in AGENT_REMOTE_KEY_ORIGINS)`)
    : err);
  // The SDK's errors quote the remote's error answer, which may quote the request it refused,
  // Authorization header and all, in any encoding; their text reaches the task's status message, the log and the job.
  const maskKey = secretMasker(apiKey ? [`Bearer ${apiKey}`, apiKey] : []);
  // The SDK follows the remote's own error message with ` (Code: n)` and its data: a quote of the
  // key cut short at the message's end would no longer be at the text's end, where the masker looks
  // for one. Each piece between them is masked as a text of its own.
  const withoutKey = (text: string) => text.split(SDK_ERROR_CODE).map((piece, i) => (i % 2 ? piece : maskKey(piece))).join('');
  const keyless = <T,>(err: T): T | Error => (err instanceof Error && withoutKey(err.message) !== err.message ? reworded(err, withoutKey(err.message)) : err);
  // The client made from the card, read again once it is CARD_MAX_AGE_MS old and after an attempt
  // that ended by an error: a remote that moved its endpoint or changed its capabilities is followed
  // without a worker restart (a card naming an endpoint refused failed every later run until one).
  let client: { madeAt: number; made: Promise<Client> } | undefined;
  const forgetCard = () => { client = undefined; };
  // Read again at the next run, the client kept should that read fail (the card's URL down while
  // its endpoint still answers).
  const ageCard = () => { if (client) client.madeAt = -Infinity; };
  const connect = (): Promise<Client> => {
    if (client && performance.now() - client.madeAt < CARD_MAX_AGE_MS) return client.made;
    // Read again for its age only: a read that fails leaves the client before it in use.
    const aged = client?.made;
    const made = clientFactory(apiKey, trusted, allowPrivate, timeoutMs, log, withheld).createFromUrl(base, cardPath).catch((err: Error) => {
      if (aged) return aged;
      if (client?.made === made) forgetCard();
      // AGENT_REMOTE_URL may carry credentials (user info, a token parameter), and this reason reaches
      // the task's status message and the log: it shows the URL as runtime_config does, in the
      // client's own words (which may quote it) too.
      const masked = (text: string) => text.replace(/\bhttps?:\/\/[^\s'"<>]+/gi, maskUrlCredentials);
      throw reworded(err, `the remote agent card at ${masked(url)} could not be read: ${withoutKey(masked((notJson(err) as Error).message))}`);
    });
    client = { madeAt: performance.now(), made };
    return made;
  };

  // A refused key fails the run at once: every retry would be refused alike until an operator mends
  // the configuration.
  const handler = (ctx: AgentContext): Promise<AgentResult> => follow(ctx).catch((thrown: unknown) => {
    ageCard();
    const err = keyless(notJson(thrown));
    if (!ctx.signal.aborted && err instanceof RemoteRefused) {
      return { status: 'failed', message: `The remote agent refused this worker's credentials (not retried; check AGENT_REMOTE_API_KEY): ${explained(err).message}` };
    }
    // Every retry would look for it alike: the turn cannot go on. The SDK's error of a JSON-RPC
    // answer has no message of its own: the remote's is quoted.
    if (!ctx.signal.aborted && thrown instanceof TaskNotFoundError) {
      const said = (thrown as { errorResponse?: { error?: { message?: unknown } } }).errorResponse?.error?.message;
      const why = typeof said === 'string' && said ? withoutKey(said) : (err as Error).message;
      return { status: 'failed', message: storableText(cutReason(`The remote agent no longer has the task this one follows (not retried: it may have restarted, losing the tasks it kept in memory, or expired it): ${why}`)) };
    }
    throw explained(err);
  });

  async function follow(ctx: AgentContext): Promise<AgentResult> {
    const remote = await connect();
    const known = await ownStore(() => getRemoteAgentTask(db, ctx.task.id));
    const mirror = new Mirror(ctx, db, known?.remote_task_id);
    const link = new AbortController();
    const onAbort = () => link.abort(ctx.signal.reason);
    if (ctx.signal.aborted) onAbort();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    try {
      // A later turn: what the remote task already shows was mirrored by earlier runs. A remote task
      // still running on this run's message means this run is a retry after the send: follow it. One
      // running on an earlier message (a client answered while that run was going) is sent this one.
      const current = known ? await readTask(remote, known.remote_task_id, link.signal) : undefined;
      const running = current && (current.status.state === 'submitted' || current.status.state === 'working');
      // The message went out if the remote's history shows it (a crash between the send and the
      // remote's first answer leaves last_message_id behind), or if the row names it: it is written
      // once the remote has answered the send, so it holds whatever the remote's history shows (none,
      // its own messages only, cut short) and whatever state the remote task is in since. Rows from
      // before migration 0015 name no message: a history decides, or else the task still running.
      const inHistory = current?.history?.length ? current.history.some((m) => m.messageId === ctx.message.id) : undefined;
      const sent = inHistory || known?.last_message_id === ctx.message.id || (inHistory === undefined && running && known?.last_message_id == null);
      if (current && sent) {
        // A retry (the worker before stopped or died): what the remote did since is mirrored now
        // unless the local task has it, and the turn may have ended meanwhile.
        await mirror.resume(current, known?.answering);
        const done = await mirror.apply(current);
        if (done) return done;
      } else if (current && known) { // (current implies known)
        if (isEnd(current.status.state) && !(current.status.state in INTERRUPTED)) return resultOf(current.status, true);
        mirror.seen(current);
        // What the message answers, recorded before it goes out: a retry after a send that broke
        // before the remote took it up tells by this that the remote shows the question still (resume).
        if (current.status.state in INTERRUPTED) {
          await ownStore(() => recordAnswering(db, ctx.task.id, known.remote_task_id, { ...interruptionOf(current.status), answer: ctx.message.id }));
        }
      }
      if (!sent) {
        // A first turn goes to the remote context of the local context's earlier tasks, as A2A groups them.
        const remoteContext = known ? known.remote_context_id : await ownStore(() => remoteContextOf(db, ctx.task.context_id, ctx.task.id));
        // Tasks the message refers to are named to the remote by their remote ids: ours mean nothing there.
        const references = await ownStore(() => remoteTaskIdsOf(db, ctx.message.reference_task_ids));
        const done = await send(remote, mirror, ctx, known, { contextId: remoteContext ?? undefined, referenceTaskIds: references }, link.signal).catch((err: unknown) => {
          if (!(err instanceof SentUnnamed)) throw err;
          const why = keyless(notJson(idMismatch(err.why)));
          // Cut as a thrown failure's reason is (the SDK's error quotes the event whole: megabytes), and
          // made storable (a cut may split a surrogate pair; an id echoed back may hold a NUL), or the
          // task's status message would be refused instead of saying this.
          return { status: 'failed' as const, message: storableText(`The remote agent's stream failed before it named a task for the message, which may have reached it (not retried, so that the remote does not get it again): ${cutReason(why instanceof Error ? why.message : String(why))}`) };
        });
        if (done) return done;
      }
      // The stream ended before the remote task did, or the remote cannot stream: the client then
      // sent a non-blocking message/send, so the remote task's id is known at once and it can be
      // followed (and canceled) while it runs.
      if (!mirror.remoteTaskId) throw new Error('the remote agent answered without a message or a task');
      for (let wait = POLL_MIN_MS; ; wait = Math.min(wait * 2, POLL_MAX_MS)) {
        await sleep(wait, undefined, { signal: link.signal });
        const done = await mirror.apply(await readTask(remote, mirror.remoteTaskId, link.signal));
        if (done) return done;
      }
    } catch (err) {
      // A worker shutting down hands the run to another worker, which follows the same remote task; a
      // run the task was taken from (a client set it waiting, and may have answered) leaves the remote
      // task to the run that takes over. A canceled or ended task cancels it, and so does the runtime
      // refusing what the remote sent, or the remote refusing the key (the run fails at once: nothing
      // would follow the remote task).
      // So is a first turn's remote task that could not be recorded: a retry, which cannot know of
      // it, sends the message again (a later turn's is the one the task's row names already). No row
      // lets the housekeeping pass try its cancel again. Its save may still have landed, unanswered
      // (Postgres out of reach): the row naming it is forgotten first, and while that fails it is
      // left running, for the retry to follow by that row (canceled, it would end the local task canceled).
      const unrecorded = err instanceof RemoteTaskUnrecorded && !known;
      const reason = ctx.signal.reason as { shutdown?: boolean; superseded?: boolean } | undefined;
      const over = (!ctx.signal.aborted && err instanceof RemoteRefused) || refusedByRuntime(err) || (ctx.signal.aborted && !reason?.shutdown && !reason?.superseded) || unrecorded;
      const remoteTaskId = mirror.remoteTaskId;
      if (over && remoteTaskId) {
        const forget = () => forgetRemoteAgentTask(db, ctx.task.id, remoteTaskId).then(() => true, () => false);
        if (unrecorded && !(await forget())) {
          ctx.log.warn({ remote_task_id: remoteTaskId }, 'remote task not recorded, and its row could not be checked: left running for the retry, which follows it if the row was saved');
        } else if (await cancelRemote(remote, remoteTaskId, ctx.log, 'remote task canceled', withoutKey, !unrecorded) && !unrecorded) {
          await forget();
        }
      }
      throw err;
    } finally {
      ctx.signal.removeEventListener('abort', onAbort);
      // Closes a stream the run left before its end (the SDK's reader only lets go of it).
      link.abort();
    }
  }
  const leftRemoteTasks = 'remote tasks of canceled or failed tasks';
  return {
    handler,
    housekeeping: { [leftRemoteTasks]: (stopping) => cancelLeftRemoteTasks(connect, db, log, withoutKey, stopping) },
    // A task canceled between runs (waiting for input, or for a retry) has its remote task canceled in seconds.
    afterCancel: [leftRemoteTasks],
  };
}

// Cancels the remote tasks of local tasks canceled with no run going, or failed after the remote's
// last word (its final message refused), then forgets them; one the remote no longer has, or that has
// ended, is forgotten too. An unreachable remote is tried again a minute later, for a day.
async function cancelLeftRemoteTasks(connect: () => Promise<Client>, db: Knex, log: Logger, withoutKey: (text: string) => string, stopping: AbortSignal): Promise<void> {
  let remote: Client | undefined;
  for (let taken = 0; taken < CANCELS_PER_PASS && !stopping.aborted; taken += CANCEL_BATCH) {
    const rows = await takeRemoteTasksToCancel(db, 24, CANCEL_RETRY_MS, CANCEL_BATCH);
    if (!rows.length) return;
    remote ??= await connect();
    for (const row of rows) {
      const rowLog = log.child({ task_id: row.task_id });
      const why = row.status === 'canceled' ? 'its local task was canceled between runs' : 'its local task failed';
      if (await cancelRemote(remote, row.remote_task_id, rowLog, `remote task canceled: ${why}`, withoutKey)) await forgetRemoteAgentTask(db, row.task_id, row.remote_task_id);
    }
  }
}

// Forwards the user's message and mirrors the remote's stream; the run's result if it ended.
// A run stopped (`link` aborted) once the message went out, before the remote named its task, still
// reads on to the first event that names it, for CANCEL_TIMEOUT_MS at most, and records it: given up
// at once, the remote task would go on with nobody to cancel it.
async function send(
  remote: Client, mirror: Mirror, ctx: AgentContext, known: RemoteAgentTaskRow | undefined,
  { contextId, referenceTaskIds }: { contextId?: string; referenceTaskIds: string[] }, link: AbortSignal,
): Promise<AgentResult | undefined> {
  const message: A2AMessage = {
    kind: 'message',
    role: 'user',
    messageId: ctx.message.id,
    parts: ctx.message.parts.map(toA2APart),
    // The client's own metadata and extensions are for the agent, which is the remote one.
    ...(Object.keys(ctx.message.metadata).length ? { metadata: ctx.message.metadata } : {}),
    ...(ctx.message.extensions?.length ? { extensions: ctx.message.extensions } : {}),
    ...(known ? { taskId: known.remote_task_id } : {}),
    ...(contextId ? { contextId } : {}),
    ...(referenceTaskIds.length ? { referenceTaskIds } : {}),
  };
  // What our client accepts of the reply is for the remote agent to go by.
  const modes = ctx.message.accepted_output_modes;
  const configuration = { blocking: false, ...(modes?.length ? { acceptedOutputModes: modes } : {}) };
  // Stopped before anything went out: nothing to follow up.
  if (link.aborted) throw new Error('the run was stopped');
  const forward = new AbortController();
  let giveUp: NodeJS.Timeout | undefined;
  const onStop = () => {
    if (mirror.remoteTaskId) forward.abort(link.reason);
    else giveUp = setTimeout(() => forward.abort(link.reason), CANCEL_TIMEOUT_MS);
  };
  link.addEventListener('abort', onStop, { once: true });
  try {
    for await (const event of remote.sendMessageStream({ message, configuration }, { signal: forward.signal })) {
      if (link.aborted) {
        await mirror.named(event);
        throw new Error('the run was stopped');
      }
      const done = await mirror.apply(event);
      if (done) return done;
    }
    // Taken and ended with no event naming a task: as a stream that failed so (below).
    if (streamsTaken.has(forward.signal) && !mirror.remoteTaskId) throw new Error('the remote agent ended its stream before an event named a task');
    return undefined;
  } catch (err) {
    // The remote took the stream, but it failed before an event named the remote task (one refused,
    // a line not JSON or too long): the message may have made a task there that no run knows. A retry
    // would send it again, each try making a task nobody cancels. A JSON-RPC error is the remote's
    // word that the request failed, and a stopped run ends as its stop says: both as before.
    const remoteError = err instanceof Error && err.message.startsWith(SSE_EVENT_ERROR);
    if (streamsTaken.has(forward.signal) && !mirror.remoteTaskId && !link.aborted && !remoteError) throw new SentUnnamed(err);
    throw err;
  } finally {
    link.removeEventListener('abort', onStop);
    clearTimeout(giveUp);
    forward.abort();
  }
}

// The remote task, checked as the events of a stream are, and to be the task asked for: another's
// state would end this turn, its content mirrored here. With its history: messages the remote added
// and moved past between two polls are mirrored too.
async function readTask(remote: Client, id: string, signal: AbortSignal): Promise<A2ATask> {
  const task: unknown = await remote.getTask({ id, historyLength: SEEN_HISTORY }, { signal });
  checkEvent(task, ['task']);
  const answered = (task as A2ATask).id;
  if (answered !== undefined && answered !== id) throw new Error(`the remote agent answered tasks/get for its task ${id} with task ${answered}`);
  return task as A2ATask;
}

// Cancels a remote task; true once it is done with (canceled, or ended or unknown on the remote),
// false when it should be tried again (the housekeeping pass does: cancelLeftRemoteTasks, from the
// task's row; `triedAgain` false: there is none).
async function cancelRemote(remote: Client, remoteTaskId: string, log: Logger, canceled: string, withoutKey: (text: string) => string, triedAgain = true): Promise<boolean> {
  try {
    await remote.cancelTask({ id: remoteTaskId }, { signal: AbortSignal.timeout(CANCEL_TIMEOUT_MS) });
    log.info({ remote_task_id: remoteTaskId }, canceled);
    return true;
  } catch (err) {
    if (err instanceof TaskNotCancelableError || err instanceof TaskNotFoundError) return true;
    // Cut as a run's failure is: the SDK's message quotes the remote's answer, up to 16 MiB, and this
    // line comes again each housekeeping pass.
    log.warn({ remote_task_id: remoteTaskId, reason: cutReason(withoutKey((err as Error).message)) }, triedAgain ? 'remote task could not be canceled; will retry' : 'remote task could not be canceled, nor recorded: it is not tried again');
    return false;
  }
}

// An interruption as the task's row records it (RemoteInterruption): made storable, a time stamp
// longer than any is left out. Compared as recorded, so the same status always records alike. All
// of it must be storable: a write Postgres refused would hand the run back to the queue (ownStore)
// for ever.
function interruptionOf({ state, timestamp, message }: TaskStatus): RemoteInterruption {
  return {
    state,
    ...(typeof timestamp === 'string' && timestamp && timestamp.length <= 100 ? { timestamp: storableText(timestamp) } : {}),
    ...(message ? { messageId: storableText(message.messageId) } : {}),
  };
}

// Whether two reports show the same interruption: of the same status message where both have one
// (a new question may come with the old time stamp, from a coarse clock), and by the same time stamp
// or, without those, the same status message. A remote that gives neither cannot be told to report
// one again.
function sameInterruption(a: RemoteInterruption, b: RemoteInterruption): boolean {
  if (a.state !== b.state) return false;
  if (a.messageId !== undefined && b.messageId !== undefined && a.messageId !== b.messageId) return false;
  if (a.timestamp !== undefined && b.timestamp !== undefined) return a.timestamp === b.timestamp;
  return a.messageId !== undefined && a.messageId === b.messageId;
}

// An artifact with A2A's members only: what else a remote sends is not ours to store (nor accepted).
const artifactMembers = ({ artifactId, name, description, parts, metadata, extensions }: Artifact): Artifact =>
  Object.fromEntries(Object.entries({ artifactId, name, description, parts, metadata, extensions }).filter(([, v]) => v !== undefined)) as unknown as Artifact;

// Copies what the remote reports into the local task, once each: messages by id, artifacts by
// their content. Returns the run's result once the remote task has ended or is interrupted.
class Mirror {
  private readonly seenMessages = new Set<string>();
  // Each artifact as the local task holds it, as far as this run knows (updates merged by the task's
  // own rule, domain/a2a/artifact-merge.ts). A snapshot of the remote task (every poll) shows each
  // artifact whole: one the remote grew since is extended by a chunk of its new parts. Stored whole at
  // every poll, an artifact the remote grew in chunks took the task over TASK_ARTIFACTS_MAX_BYTES at a
  // fraction of that size.
  private readonly artifacts = new HeldArtifacts();
  // The interruption this turn answers. A remote may report it again before it takes up the answer
  // (a stream opened with the task as it stands, as taskbridge's own do): that is not this turn's end.
  private answering?: TaskStatus;
  private unheld = 0;

  constructor(private readonly ctx: AgentContext, private readonly db: Knex, public remoteTaskId: string | undefined) {
    this.seenMessages.add(ctx.message.id);
  }

  /** Marks everything a remote task already shows as mirrored. */
  seen(task: A2ATask): void {
    for (const m of task.history ?? []) this.seenMessages.add(m.messageId);
    if (task.status.message) this.seenMessages.add(task.status.message.messageId);
    for (const a of task.artifacts ?? []) this.artifacts.set(artifactMembers(a));
    if (task.status.state in INTERRUPTED) this.answering = task.status;
  }

  /**
   * For a retry of this turn: marks as mirrored what of the remote task the local task has, by
   * content (the local copies have ids of their own): the remote's history up to this run's message,
   * the agent messages since that match the local task's since, and artifacts stored as they are.
   * A history without this run's message (the remote keeps its own messages only, or cut it short)
   * may start before this turn: its messages are matched against the earlier turns' copies too.
   * A remote that keeps no history shows its status message and artifacts only: those are matched.
   * The interruption the message answered, as recorded when it went out, shown still: the remote
   * has not taken the answer up, unless its history shows an agent message after the answer.
   */
  async resume(task: A2ATask, recorded: AnsweredInterruption | null | undefined): Promise<void> {
    const history = task.history ?? [];
    const at = history.findIndex((m) => m.messageId === this.ctx.message.id);
    for (const m of history.slice(0, at + 1)) this.seenMessages.add(m.messageId);
    const status = task.status.message;
    const asked = status ? history.findIndex((m) => m.messageId === status.messageId) : -1;
    const movedOn = at >= 0 && history.slice(at + 1).some((m) => m.role === 'agent');
    const stillAsked = recorded?.answer === this.ctx.message.id && !movedOn && sameInterruption(recorded, interruptionOf(task.status));
    if (stillAsked && status) this.seenMessages.add(status.messageId);
    // Still showing the question this run's message answers (asked before it): not taken up yet.
    if (task.status.state in INTERRUPTED && (stillAsked || (asked >= 0 && asked < at))) this.answering = task.status;
    const since = this.ctx.history.findIndex((m) => m.id === this.ctx.message.id);
    const local = this.ctx.history.flatMap((m, i) => (m.role === 'agent' && (at < 0 || i > since) ? [{ parts: m.parts, earlier: i < since }] : []));
    const theirs = history.slice(at + 1).filter((m) => m.role === 'agent');
    // A status message the remote's history does not place is this turn's, unless it is the question answered.
    if (status && asked < 0 && !stillAsked) theirs.push(status);
    // In order, each local copy matched once: a message the remote repeated is a copy only if the local task repeated it too.
    for (const m of theirs) {
      const isStatus = m.messageId === status?.messageId;
      const copy = local.findIndex((l) => (asked >= 0 || !isStatus || !l.earlier) && sameAsStored(l.parts, partsOf(m.parts)));
      if (copy < 0) continue;
      this.seenMessages.add(m.messageId);
      // A question from before this run's message, still shown: the one it answers, not taken up yet.
      if (isStatus && local[copy].earlier && task.status.state in INTERRUPTED) this.answering = task.status;
      local.splice(copy, 1);
    }
    // The local copies as they are: one the remote changed since is updated by apply.
    for (const held of artifactsFromTimeline(await ownStore(() => listArtifactItems(this.db, this.ctx.task.id)))) this.artifacts.set(held);
  }

  // The interruption being answered, reported again: in an update the remote says is not its last,
  // else by the same time stamp or, without those, the same status message. A remote that gives
  // none of these cannot be told apart: its interruption ends the turn.
  private reportedAgain(status: TaskStatus, final?: boolean): boolean {
    const a = this.answering;
    if (!a || status.state !== a.state) return false;
    // An update the remote says is not its last (`final: false`): a stream opened by replaying the
    // task as it stands, stamped anew, with its question or without: the answer is yet to be taken up.
    // One with another status message is a new question (the Python SDK's requires_input() sends
    // it so by default): taken for the old one, it was followed by polling for ever.
    if (final === false) {
      if (status.message && a.message && status.message.messageId !== a.message.messageId) return false;
      // As it now stands, should the turn go on by polling; a replay without the question keeps it
      // to tell a new one by.
      this.answering = { ...status, ...(status.message ?? a.message ? { message: status.message ?? a.message } : {}) };
      return true;
    }
    return sameInterruption(interruptionOf(a), interruptionOf(status));
  }

  // The remote task, and that it was sent this run's message, once the remote answers about it.
  private sentRecorded = false;
  // Whether the remote has answered this turn with a task or an update of one.
  private tasked = false;

  // A message before any task is the remote's whole answer (A2A 0.3), whatever task id it names:
  // the SDK's server names the id it had ready for a task, which the message means it never creates.
  // Not on a later turn of a remote task already known: that task exists, and is followed.
  private answer(event: StreamEvent): A2AMessage | undefined {
    return event.kind === 'message' && !this.tasked && !this.remoteTaskId ? event : undefined;
  }

  /** Records the remote task an event names (all a stopped run does with an event). */
  async named(event: StreamEvent): Promise<void> {
    checkEvent(event);
    if (this.answer(event)) return;
    this.tasked = true;
    const [taskId, contextId] = event.kind === 'task' ? [event.id, event.contextId] : [event.taskId, event.contextId];
    if (!taskId) return;
    // A remote answers about the task it was sent the message for: following another would mirror
    // its content here, and a cancel of this task would cancel that one.
    if (this.remoteTaskId && taskId !== this.remoteTaskId) {
      throw new Error(`the remote agent sent an event of task ${taskId} while following its task ${this.remoteTaskId}`);
    }
    await this.track(taskId, contextId);
  }

  private async track(taskId: string, contextId: string | undefined): Promise<void> {
    if (this.remoteTaskId === taskId && this.sentRecorded) return;
    const firstTurn = this.remoteTaskId === undefined;
    // Known before the save: a run that fails on it still cancels the remote task (follow's catch).
    this.remoteTaskId = taskId;
    const row = { task_id: this.ctx.task.id, remote_task_id: taskId, remote_context_id: contextId ?? null, last_message_id: this.ctx.message.id };
    const take = this.ctx[RUN_TAKE];
    let saved: boolean;
    try {
      saved = await ownStore(() => (firstTurn && take !== undefined
        ? saveFirstRemoteAgentTask(this.db, row, take)
        : saveRemoteAgentTask(this.db, row).then(() => true)));
    } catch (err) {
      throw new RemoteTaskUnrecorded(taskId, err);
    }
    // Another take of the run's job has the task (this one's worker stalled past the job's lock): it
    // sent the message again and follows the remote task it records. This one's is canceled (follow's
    // catch), not recorded over that one, which the task's cancel and next turn would then miss.
    if (!saved) throw new RemoteTaskUnrecorded(taskId, new Error('another take of the run has the task'));
    this.sentRecorded = true;
  }

  // Something new from the remote (a message, an artifact) means it has taken up the answer.
  private async message(m: A2AMessage): Promise<void> {
    if (m.role !== 'agent' || this.seenMessages.has(m.messageId)) return;
    this.seenMessages.add(m.messageId);
    this.answering = undefined;
    // A2A allows a message of no parts; a local message holds at least one.
    if (!m.parts.length) return this.noteUnheld();
    await this.ctx.reply(replyOf(m));
  }

  // An artifact-update event, stored as sent (store() says when it is not).
  private async artifactUpdate(a: Artifact, { append, lastChunk }: { append?: boolean; lastChunk?: boolean }): Promise<void> {
    await this.store(artifactMembers(a), { append, lastChunk });
  }

  // An artifact as a snapshot of the remote task shows it: stored as a chunk of its new parts (and
  // changed name, description, metadata) when it grew, else whole.
  private async artifactOf(a: Artifact): Promise<void> {
    const known = this.artifacts.get(a.artifactId);
    const own = artifactMembers(a);
    const chunk = known && chunkBetween(known, own);
    await this.store(chunk || own, { append: !!chunk });
  }

  // Stores an artifact update in the local task, noting the artifact as the task then holds it; one
  // that leaves the artifact as it stands (sent again, a chunk of no parts adding nothing) is not
  // stored. An artifact of no parts is not stored either: a task holds none without parts, and a
  // remote may still make one (its first chunk empty, an artifact emptied), which would otherwise
  // fail the whole run. It is noted as the remote holds it, so that parts the remote adds later are
  // stored as the artifact they make, whole: with the name, description and metadata it came with,
  // and without the parts it was emptied of. A chunk of no parts (a remote closing its artifact: the
  // SDK takes it) is no update an agent may store either: what it changes is stored as the artifact
  // it makes.
  private async store(artifact: Artifact, { append, lastChunk }: { append?: boolean; lastChunk?: boolean }): Promise<void> {
    const held = this.artifacts.get(artifact.artifactId);
    // A chunk of parts appended always changes the artifact: not compared, as that reads the whole
    // artifact so far (a remote streaming a token a chunk made it quadratic).
    if (held && (append ? !artifact.parts.length && !chunkChanges(held, artifact) : sameAsStored(held, artifact))) return;
    // Read before the chunk is applied, which may add to `held` in place.
    const whole = (held && !held.parts.length) || !artifact.parts.length;
    const made = this.artifacts.apply(artifact, append);
    // Each change counts: chunks of no parts that add metadata keys would grow it here without bound.
    if (!made.parts.length) return this.noteUnheld();
    this.answering = undefined;
    await this.ctx.emitArtifact({ ...(whole ? made : artifact), ...(append && !whole ? { append } : {}), ...(lastChunk ? { lastChunk } : {}) });
  }

  private async status(status: TaskStatus, final?: boolean): Promise<AgentResult | undefined> {
    if (this.reportedAgain(status, final)) return undefined;
    // Once the remote has moved on, an interruption is a new one, whatever it looks like.
    this.answering = undefined;
    const fresh = !!status.message && !this.seenMessages.has(status.message.messageId);
    if (status.message) this.seenMessages.add(status.message.messageId);
    if (isEnd(status.state)) return resultOf(status, fresh);
    if (status.state === 'working' && fresh && status.message?.parts.length) await this.ctx.setStatus('working', replyOf(status.message));
    else if (fresh) this.noteUnheld();
    return undefined;
  }

  private noteUnheld(): void {
    if (++this.unheld > MAX_UNHELD) {
      throw new Error(`the remote agent sent more than ${MAX_UNHELD} messages, status messages or artifacts the local task does not hold (messages of no parts, status messages of another state than working, artifacts of no parts)`);
    }
  }

  async apply(event: StreamEvent): Promise<AgentResult | undefined> {
    checkEvent(event);
    const answer = this.answer(event);
    if (answer) return { status: 'completed', ...(answer.parts.length ? { message: replyOf(answer) } : {}) };
    await this.named(event);
    switch (event.kind) {
      case 'message':
        await this.message(event);
        return undefined;
      case 'task': {
        const finalId = event.status.message?.messageId;
        for (const m of event.history ?? []) if (m.messageId !== finalId) await this.message(m);
        for (const a of event.artifacts ?? []) await this.artifactOf(a);
        return this.status(event.status);
      }
      case 'status-update':
        return this.status(event.status, event.final);
      case 'artifact-update':
        await this.artifactUpdate(event.artifact, event);
        return undefined;
    }
  }
}

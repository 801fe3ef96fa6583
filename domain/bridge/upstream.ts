// HTTP calls to provider APIs and token endpoints. An upstream that cannot be reached, times out
// or fails on its side is a 502 (NoAnswer when no answer came); what it answers with a 4xx is its
// refusal, for the caller to map.
import { Agent, fetch as undiciFetch } from 'undici';
import { NoAnswer, Upstream } from '../errors.ts';
import { findUnstorable } from '../storable-json.ts';
import { guardedLookup, privateLiteralHost } from '../webhook-url.ts';
import { secretMasker } from '../secret-mask.ts';
import { callSignal } from '../call-signal.ts';

// `publicOnly`: for URLs a client chose (a service account's token_uri): checked when stored, and at
// each call when connecting, when the name is looked up again and may now name an internal address
// (DNS rebinding); an IP literal, which connecting never looks up, is checked before the call instead.
// `untimed`: without undici's own limits on an answer (300 s for its headers, and between two chunks
// of its body), for callers that bound their calls themselves and may wait longer in silence (the
// remote agent: its stream lasts as long as its remote task).
const dispatchers = new Map<string, Agent>();
function dispatcher(publicOnly: boolean, untimed: boolean): Agent {
  const key = `${publicOnly}/${untimed}`;
  let agent = dispatchers.get(key);
  if (!agent) {
    agent = new Agent({ ...(publicOnly ? { connect: { lookup: guardedLookup(false) } } : {}), ...(untimed ? { headersTimeout: 0, bodyTimeout: 0 } : {}) });
    dispatchers.set(key, agent);
  }
  return agent;
}
const fetchWith = (agent: Agent, url: string, init: RequestInit): Promise<Response> =>
  undiciFetch(url, { ...init, dispatcher: agent } as Parameters<typeof undiciFetch>[1]) as unknown as Promise<Response>;

/** fetch that connects to public addresses only and follows no redirect (one could lead inside). */
export const fetchPublicOnly = (url: string, init: RequestInit, { untimed = false } = {}): Promise<Response> => {
  // net.connect (undici's too) skips `lookup` for an IP literal, so guardedLookup never sees one:
  // a URL stored while private targets were allowed, or restored from a backup, would be fetched.
  // Refused as a failed fetch whose cause is EPRIVATE, like the lookup's refusal.
  const host = privateLiteralHost(new URL(url));
  if (host) {
    const cause = Object.assign(new Error(`host '${host}' is an internal address`), { code: 'EPRIVATE' });
    return Promise.reject(new TypeError('fetch failed', { cause }));
  }
  return fetchWith(dispatcher(true, untimed), url, { ...init, redirect: 'manual' });
};

/** fetch without undici's limits on an answer's headers and body (see `untimed` above). */
export const fetchUntimed = (url: string, init: RequestInit): Promise<Response> => fetchWith(dispatcher(false, true), url, init);

/** `sent`: the credentials the request carried, which its refusal's words must not repeat (see sentCredentials). */
export interface UpstreamAnswer { status: number; body: unknown; sent?: string[] }

// Form members that are credentials (token endpoints), besides the Authorization header.
const CREDENTIAL_MEMBERS = ['client_secret', 'code', 'code_verifier', 'refresh_token', 'assertion', 'access_token'];

// The credentials a request carried, which an answer may echo (secretMasker masks their encodings):
// the Authorization header, the credential members of a form, and `client_id:client_secret` in
// base64, as HTTP Basic would send them (a token endpoint may quote the client authentication it checked).
function sentCredentials(init: RequestInit): string[] {
  const values: string[] = [];
  const headers = new Headers(init.headers);
  const auth = headers.get('authorization');
  if (auth) values.push(auth, auth.replace(/^\S+\s+/, ''));
  if (typeof init.body === 'string' && /x-www-form-urlencoded/i.test(headers.get('content-type') ?? '')) {
    const form = new URLSearchParams(init.body);
    for (const member of CREDENTIAL_MEMBERS) for (const v of form.getAll(member)) values.push(v);
    const [id, secret] = [form.get('client_id'), form.get('client_secret')];
    // RFC 6749 2.3.1 form-encodes both before joining them; not every client does.
    if (id !== null && secret) for (const pair of [`${id}:${secret}`, `${formEncode(id)}:${formEncode(secret)}`]) values.push(...base64Forms(pair));
  }
  return values;
}

const formEncode = (v: string) => new URLSearchParams({ v }).toString().slice(2);
const base64Forms = (v: string) => {
  const b64 = Buffer.from(v, 'utf8').toString('base64');
  return [b64, b64.replace(/=+$/, ''), Buffer.from(v, 'utf8').toString('base64url')];
};

// Larger answers are refused rather than held in memory (token_uri is client-chosen).
const MAX_BODY_BYTES = 1024 * 1024;

async function readBody(res: Response, what: string): Promise<string> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for await (const chunk of res.body ?? []) {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) throw Object.assign(new Error('too large'), { tooLarge: true });
      chunks.push(chunk);
    }
  } catch (err) {
    await res.body?.cancel().catch(() => undefined);
    const reason = (err as { tooLarge?: boolean }).tooLarge ? `answer larger than ${MAX_BODY_BYTES} bytes` : 'answer cut off or too slow';
    throw new Upstream(`${what}: ${reason}`, { upstream: what, upstream_status: res.status });
  }
  return Buffer.concat(chunks).toString('utf8');
}

// `init.signal` (the caller's: an agent run's, or an HTTP client's that hung up) abandons the call too, answer unread. `publicOnly`:
// connect to public addresses only (see publicOnlyAgent). `deadline` (epoch ms): the end of the
// invocation this call is part of (a token exchange and the provider call share one `timeoutMs`);
// none left, the call is not made.
export async function callUpstream(what: string, url: string, init: RequestInit, timeoutMs: number, opts: { publicOnly?: boolean; deadline?: number } = {}): Promise<UpstreamAnswer> {
  // An explicit timer: on Node 20 an AbortSignal.timeout can be garbage-collected and never fire
  // (nodejs/node#57736).
  const call = callSignal(init.signal ?? undefined);
  const waitMs = opts.deadline === undefined ? timeoutMs : Math.min(timeoutMs, opts.deadline - Date.now());
  if (waitMs <= 0) call.abort();
  const timer = setTimeout(() => call.abort(), Math.max(0, waitMs));
  const abandoned = () => new Upstream(`${what}: call abandoned by its caller`, { upstream: what });
  let text: string;
  let res: Response;
  try {
    try {
      res = await (opts.publicOnly ? fetchPublicOnly : fetch)(url, { ...init, redirect: 'manual', signal: call.signal });
    } catch (err) {
      if (init.signal?.aborted) throw abandoned();
      const refused = (err as { cause?: { code?: string; message?: string } }).cause;
      if (refused?.code === 'EPRIVATE') throw new Upstream(`${what}: ${refused.message}`, { upstream: what });
      if (refused?.code === 'ENOTFOUND') throw new NoAnswer(`${what}: host '${new URL(url).hostname}' cannot be resolved (ENOTFOUND)`, { upstream: what });
      throw new NoAnswer(`${what}: ${call.signal.aborted ? `no answer within ${timeoutMs} ms` : 'unreachable'}`, { upstream: what });
    }
    text = await readBody(res, what).catch((err: unknown) => { throw init.signal?.aborted ? abandoned() : err; });
  } finally {
    clearTimeout(timer);
    call.release();
  }
  let body: unknown = text;
  try { body = text ? JSON.parse(text) : undefined; } catch { /* not JSON: keep the text */ }
  // Nesting that deep is no provider's answer, and would overflow the stack of its serialisation.
  const deep = findUnstorable(body, 'answer', { depthOnly: true });
  if (deep) throw new Upstream(`${what}: answered JSON that ${deep.message}`, { upstream: what, upstream_status: res.status });
  if (res.status >= 500 || (res.status >= 300 && res.status < 400)) {
    throw new Upstream(`${what}: answered HTTP ${res.status}`, { upstream: what, upstream_status: res.status });
  }
  return { status: res.status, body, sent: sentCredentials(init) };
}

// A success answer must be a JSON object; anything else means we cannot tell what happened.
export function successObject(what: string, answer: UpstreamAnswer): Record<string, unknown> {
  const b = answer.body;
  if (!b || typeof b !== 'object' || Array.isArray(b)) throw new Upstream(`${what}: answered HTTP ${answer.status} without a JSON object`, { upstream: what, upstream_status: answer.status });
  return b as Record<string, unknown>;
}

// The provider's own words for a refusal, kept short: OAuth `error_description`/`error`, Stripe and
// Google `error.message`, or the status line. They reach API clients, logs and job failures, so the
// credentials the request carried are masked: a provider may quote the token or client secret it refused.
export function refusalMessage(answer: UpstreamAnswer): string {
  const b = answer.body as { error?: unknown; error_description?: unknown; message?: unknown } | string | undefined;
  let msg: unknown;
  if (b && typeof b === 'object') {
    if (typeof b.error === 'object' && b.error) msg = (b.error as { message?: unknown }).message;
    msg ??= b.error_description ?? (typeof b.error === 'string' ? b.error : undefined) ?? b.message;
  }
  const text = typeof msg === 'string' && msg ? msg : `HTTP ${answer.status}`;
  // Cut before masking: masking costs the text's length times the secrets' (a client chooses both
  // its secret and the token endpoint that quotes it); a secret the cut splits is masked as cut short.
  return secretMasker(answer.sent ?? [])(text.slice(0, 500));
}

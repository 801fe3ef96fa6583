import { writeSync } from 'node:fs';
import { pino, type Logger } from 'pino';

// Headers that carry credentials, as Node's incoming headers name them and as callers write them.
const CREDENTIAL_HEADERS = ['authorization', 'Authorization', 'proxy-authorization', 'Proxy-Authorization', 'cookie', 'Cookie', 'set-cookie', 'Set-Cookie'];
// Paths are case sensitive, and a wildcard stands for one level: each header is looked for alone
// and in a headers object at the top, one or two levels down (`err.response.headers`).
const HEADER_PATHS = CREDENTIAL_HEADERS.flatMap((h) => [`["${h}"]`, `*["${h}"]`, `headers["${h}"]`, `*.headers["${h}"]`, `*.*.headers["${h}"]`]);

// Field names that may carry secrets anywhere in a log object are censored, as a backstop to
// never logging them in the first place.
const REDACT = [
  ...HEADER_PATHS, 'key', '*.key', 'raw_value', '*.raw_value',
  'token', '*.token', 'access_token', '*.access_token', 'refresh_token', '*.refresh_token', 'client_secret',
  '*.client_secret', 'api_key', '*.api_key', 'private_key', '*.private_key', 'assertion', '*.assertion', 'password', '*.password', 'decrypted_value', '*.decrypted_value', 'plaintext', '*.plaintext',
];

// Lines waiting for stdout beyond this are dropped, and counted: a reader that stops reading (a
// stuck log collector) must not grow the process's memory until it is killed.
export const LOG_BUFFER_MAX_BYTES = 16 * 1024 * 1024;
const DROP_REPORT_MS = 1000;

// `buffered` (API and worker processes, which log every request and run): lines written while a
// write is under way go out together in the next one instead of one blocking write each; they are
// flushed when the process exits (not on SIGKILL, which may cut the last few milliseconds of lines).
export function createLogger(level: string, name: string, opts: { buffered?: boolean } = {}): Logger {
  const options = { level, name, redact: { paths: REDACT, censor: '[redacted]' }, base: { pid: process.pid } };
  if (!opts.buffered) return pino(options, quietOnWriteError(pino.destination({ dest: 1, sync: true })));
  const dest = quietOnWriteError(pino.destination({ dest: 1, sync: false, maxLength: LOG_BUFFER_MAX_BYTES }));
  const log = pino(options, dest);
  let dropped = 0;
  let reporting = false;
  let reportLost = false;
  let report: NodeJS.Timeout | undefined;
  // The report goes through the same buffer, and may not fit either (a drop is told at once): then
  // the count stands and the report is tried again later.
  const sendReport = () => {
    report = undefined;
    reporting = true;
    reportLost = false;
    log.warn({ lines: dropped, buffer_max_bytes: LOG_BUFFER_MAX_BYTES }, 'log lines dropped: stdout is not being read fast enough');
    reporting = false;
    if (reportLost) report = setTimeout(sendReport, DROP_REPORT_MS).unref();
    else dropped = 0;
  };
  dest.on('drop', () => {
    if (reporting) {
      reportLost = true;
      return;
    }
    dropped++;
    report ??= setTimeout(sendReport, DROP_REPORT_MS).unref();
  });
  return log;
}

// stdout that can no longer be written (EIO: the terminal it ran in closed, which also sends the
// SIGHUP that stops it; ENOSPC: the disk it is redirected to is full) ends the logging, as pino does
// for EPIPE only: an error thrown from a log line would crash the process mid-request or mid-shutdown,
// and the flush at exit would retry the write for ever. It says so once on stderr, which may still be
// read.
function quietOnWriteError(dest: ReturnType<typeof pino.destination>): ReturnType<typeof pino.destination> {
  // `on`, not `once`: pino's own listener passes on every error that is not EPIPE, which would crash
  // the process with no listener left.
  let stopped = false;
  dest.on('error', (err: NodeJS.ErrnoException) => {
    if (stopped) return;
    stopped = true;
    const none = () => undefined;
    Object.assign(dest, { write: () => true, flushSync: none, end: none, destroy: none });
    try {
      writeSync(2, `${JSON.stringify({ level: 50, time: Date.now(), pid: process.pid, msg: `logging stopped: stdout cannot be written (${err.code ?? err.message})` })}\n`);
    } catch {
      // stderr is gone too: nothing is left to tell.
    }
  });
  return dest;
}

// A service URL as it may be logged: without a password, in the user part or as a parameter.
// `strict`: without the user name, every parameter's value (a parameter without one, `?<token>`,
// whole) and the fragment too (a token may be any of them).
export function redactUrl(url: string, opts: { strict?: boolean } = {}): string {
  const strict = !!opts.strict;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return redactSocketForm(url, strict);
  }
  if (u.password) u.password = '***';
  if (strict && u.username) u.username = '***';
  if (u.search) u.search = maskQuery(u.search.slice(1), strict);
  if (strict && u.hash) u.hash = '***';
  return u.toString();
}

function maskQuery(query: string, strict: boolean): string {
  return query.split('&').map((p) => {
    const eq = p.indexOf('=');
    if (eq < 0) return p && strict ? '***' : p;
    // The key as URLSearchParams reads it (leniently: a malformed escape stays as it is).
    const key = p.slice(0, eq);
    return strict || /pass/i.test([...new URLSearchParams(`${key}=`).keys()][0] ?? key) ? `${key}=***` : p;
  }).join('&');
}

// pg reads `postgresql://user:pw@/db?host=/dir` (a Unix socket: no host after the user info), which
// is no WHATWG URL. Such a URL is masked as one with a stand-in host, which is then taken out again;
// anything else that does not parse is not shown at all (its user info cannot be told apart).
const STAND_IN = 'socket.invalid';
function redactSocketForm(url: string, strict: boolean): string {
  const m = /^([a-z][a-z0-9+.-]*:\/\/[^/?#@]*@)(\/.*)$/is.exec(url);
  if (!m) return '(unparsable URL)';
  // redactUrl does not recurse here: with the stand-in host the URL parses, or it fails this regex.
  const masked = redactUrl(`${m[1]}${STAND_IN}${m[2]}`, { strict });
  return masked.includes(`@${STAND_IN}/`) ? masked.replace(`@${STAND_IN}/`, '@/') : '(unparsable URL)';
}

export type { Logger };

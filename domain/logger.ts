import { pino, type Logger } from 'pino';

// Field names that may carry secrets anywhere in a log object are censored, as a backstop to
// never logging them in the first place.
const REDACT = [
  'authorization', 'req.headers.authorization', '*.authorization', 'key', '*.key', 'raw_value', '*.raw_value',
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
  if (!opts.buffered) return pino(options);
  const dest = pino.destination({ dest: 1, sync: false, maxLength: LOG_BUFFER_MAX_BYTES });
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

// A service URL as it may be logged: without a password, in the user part or as a parameter.
// `strict`: without the user name, every parameter's value (a parameter without one, `?<token>`,
// whole) and the fragment too (a token may be any of them).
export function redactUrl(url: string, opts: { strict?: boolean } = {}): string {
  const strict = !!opts.strict;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return redactUnparsed(url, strict);
  }
  if (u.password) u.password = '***';
  if (strict && u.username) u.username = '***';
  if (u.search) u.search = maskQuery(u.search.slice(1), strict);
  if (strict && u.hash) u.hash = '***';
  return u.toString();
}

function maskQuery(query: string, strict: boolean): string {
  const secret = (key: string) => strict || /pass/i.test(safeDecode(key));
  return query.split('&').map((p) => {
    const eq = p.indexOf('=');
    if (eq < 0) return p && strict ? '***' : p;
    return secret(p.slice(0, eq)) ? `${p.slice(0, eq)}=***` : p;
  }).join('&');
}
const safeDecode = (text: string) => {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
};

// A URL that WHATWG cannot parse and its driver takes: pg reads `postgresql://user:pw@/db?host=/dir`
// (a Unix socket: no host after the user info). Masked by its text: the user info ends at the last
// '@' before the query (a password may hold an '@' of its own).
function redactUnparsed(url: string, strict: boolean): string {
  const m = /^([a-z][a-z0-9+.-]*:\/\/)([^?#]*)(?:\?([^#]*))?(#.*)?$/is.exec(url);
  if (!m) return '(unparsable URL)';
  const [, scheme, rest, query, hash] = m;
  const at = rest.lastIndexOf('@');
  const user = rest.slice(0, Math.max(at, 0));
  const colon = user.indexOf(':');
  const shownUser = strict ? user.replace(/[^:]+/g, '***') : colon < 0 ? user : `${user.slice(0, colon)}:***`;
  return `${scheme}${at < 0 ? '' : `${shownUser}@`}${rest.slice(at + 1)}${query === undefined ? '' : `?${maskQuery(query, strict)}`}${hash === undefined ? '' : strict ? '#***' : hash}`;
}

export type { Logger };

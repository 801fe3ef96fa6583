import { pino, type Logger } from 'pino';

// Field names that may carry secrets anywhere in a log object are censored, as a backstop to
// never logging them in the first place.
const REDACT = [
  'authorization', 'req.headers.authorization', '*.authorization', 'key', '*.key', 'raw_value', '*.raw_value',
  'token', '*.token', 'access_token', '*.access_token', 'refresh_token', '*.refresh_token', 'client_secret',
  '*.client_secret', 'api_key', '*.api_key', 'private_key', '*.private_key', 'assertion', '*.assertion', 'password', '*.password', 'decrypted_value', '*.decrypted_value', 'plaintext', '*.plaintext',
];

// `buffered` (API and worker processes, which log every request and run): lines written while a
// write is under way go out together in the next one instead of one blocking write each; they are
// flushed when the process exits (not on SIGKILL, which may cut the last few milliseconds of lines).
export function createLogger(level: string, name: string, opts: { buffered?: boolean } = {}): Logger {
  const options = { level, name, redact: { paths: REDACT, censor: '[redacted]' }, base: { pid: process.pid } };
  return opts.buffered ? pino(options, pino.destination({ dest: 1, sync: false })) : pino(options);
}

// A service URL as it may be logged: without a password, in the user part or as a parameter.
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    for (const key of [...u.searchParams.keys()]) if (/pass/i.test(key)) u.searchParams.set(key, '***');
    return u.toString();
  } catch {
    return '(unparsable URL)';
  }
}

export type { Logger };

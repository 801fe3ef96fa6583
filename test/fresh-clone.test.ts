// The README's first command from a fresh clone: `npm ci && npm start` brings up Postgres, Redis,
// the API and a worker; SIGTERM stops every one of them; a second start finds the data again.
// It clones the committed HEAD, so it checks what a user would get.
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePort, ROOT_FALLBACK_DIR } from '../scripts/local-services.ts';
import { Client, ROOT, textMessage, waitFor } from './helpers/stack.ts';

// Every process below `pid`, read from /proc: pid -> [start time, command line].
function descendants(pid: number): Map<number, [string, string]> {
  const children = new Map<number, number[]>();
  const info = new Map<number, [string, string]>();
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const ppid = Number(fields[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
      info.set(Number(entry), [fields[19], fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8').replace(/\0/g, ' ').trim()]);
    } catch { /* exited meanwhile */ }
  }
  const out = new Map<number, [string, string]>();
  const walk = (p: number) => {
    for (const c of children.get(p) ?? []) {
      const i = info.get(c);
      if (i) out.set(c, i);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

// Alive and the same process (not a recycled pid), and not a zombie.
function stillRunning(pid: number, startTime: string): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[19] === startTime && fields[0] !== 'Z';
  } catch {
    return false;
  }
}

interface Started { child: ChildProcess; output: string[]; exited: Promise<number | null> }

function npmStart(cwd: string, env: NodeJS.ProcessEnv): Started {
  const child = spawn('npm', ['start'], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const output: string[] = [];
  const collect = (b: Buffer) => { output.push(...b.toString().split('\n').filter(Boolean)); };
  child.stdout!.on('data', collect);
  child.stderr!.on('data', collect);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { child, output, exited };
}

describe('fresh clone: npm ci && npm start', function () {
  this.timeout(15 * 60_000);
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-clone-'));
  // Postgres runs as the postgres user when we are root: it must be able to reach the data dir.
  fs.chmodSync(work, 0o755);
  const repo = path.join(work, 'repo');
  const dataDir = path.join(work, 'data');
  const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) =>
    !['DATABASE_URL', 'REDIS_URL', 'REDIS_PORT', 'ADMIN_API_KEY', 'TEST_DATA_DIR', 'NODE_ENV', 'INIT_CWD', 'PORT', 'DATA_DIR'].includes(k) && !k.startsWith('npm_')));
  const running: Started[] = [];
  let taskId: string;

  const diag = (s: Started) => s.output.slice(-40).join('\n');

  async function startAndWait(port: number): Promise<{ s: Started; client: Client; procs: Map<number, [string, string]> }> {
    const s = npmStart(repo, { ...env, PORT: String(port), DATA_DIR: dataDir });
    running.push(s);
    const anon = new Client(`http://127.0.0.1:${port}`, '');
    const outcome = await waitFor(async () => (s.child.exitCode !== null ? 'exited' : (await anon.get('/_internal/v1/ready')).status === 200 && 'ready'),
      'GET /_internal/v1/ready = 200 from npm start', 180_000, 250).catch((e) => { throw new Error(`${e.message}\n${diag(s)}`); });
    assert.equal(outcome, 'ready', `npm start exited with ${s.child.exitCode}:\n${diag(s)}`);
    const key = fs.readFileSync(path.join(dataDir, 'admin-api-key'), 'utf8').trim();
    return { s, client: new Client(anon.baseUrl, key), procs: descendants(s.child.pid!) };
  }

  async function stopAndCheck(s: Started, procs: Map<number, [string, string]>) {
    const cmds = [...procs.values()].map(([, cmd]) => cmd);
    for (const [what, re] of [['postgres', /postgres/], ['redis', /redis-server/], ['api', /api\/main\.ts/], ['worker', /workers\/main\.ts/]] as const) {
      assert.ok(cmds.some((c) => re.test(c)), `no ${what} process under npm start:\n${cmds.join('\n')}`);
    }
    s.child.kill('SIGTERM');
    const code = await Promise.race([s.exited, new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 60_000).unref())]);
    assert.equal(code, 0, `npm start did not exit cleanly within 60 s of SIGTERM (${code}):\n${diag(s)}`);
    await waitFor(async () => [...procs].every(([pid, [start]]) => !stillRunning(pid, start)), 'every child of npm start to exit', 30_000, 200)
      .catch(() => {
        const left = [...procs].filter(([pid, [start]]) => stillRunning(pid, start)).map(([pid, [, cmd]]) => `${pid} ${cmd}`);
        throw new Error(`still running after SIGTERM:\n${left.join('\n')}\n${diag(s)}`);
      });
  }

  after(async () => {
    for (const s of running) {
      if (s.child.exitCode === null && s.child.signalCode === null) {
        const procs = descendants(s.child.pid!);
        s.child.kill('SIGTERM');
        await Promise.race([s.exited, new Promise((r) => setTimeout(r, 30_000).unref())]);
        for (const [pid, [start]] of procs) if (stillRunning(pid, start)) process.kill(pid, 'SIGKILL');
      }
    }
    fs.rmSync(work, { recursive: true, force: true });
  });

  it('clones HEAD and installs with npm ci', () => {
    execFileSync('git', ['clone', '--quiet', ROOT, repo], { stdio: 'pipe' });
    execFileSync('npm', ['ci', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: repo, env, stdio: 'pipe', timeout: 10 * 60_000 });
    assert.ok(fs.existsSync(path.join(repo, 'node_modules', '.bin', 'tsx')));
  });

  it('npm start serves /_internal/v1/ready, runs a task to completed, and SIGTERM stops every child', async () => {
    assert.ok(fs.existsSync(path.join(repo, 'node_modules')), 'needs the install step');
    const { s, client, procs } = await startAndWait(await freePort());
    assert.equal(fs.statSync(path.join(dataDir, 'admin-api-key')).mode & 0o777, 0o600);
    const created = await client.post('/api/task/v1', { message: textMessage('from a fresh clone') });
    assert.equal(created.status, 201, created.text);
    taskId = created.body.task.id;
    const done = await waitFor(async () => {
      const t = (await client.get(`/api/task/v1/${taskId}`)).body;
      return t.task.status === 'completed' && t;
    }, 'the task to complete', 60_000, 200);
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'Echo: from a fresh clone' }]);
    await stopAndCheck(s, procs);
  });

  it('as root, npm start with a DATA_DIR the postgres user cannot reach keeps Postgres data under /var/lib/taskbridge', async function () {
    if (process.getuid?.() !== 0) this.skip();
    const locked = fs.mkdtempSync(path.join(work, 'locked-'));
    fs.chmodSync(locked, 0o700);
    const lockedData = path.join(locked, 'data');
    const port = await freePort();
    const s = npmStart(repo, { ...env, PORT: String(port), DATA_DIR: lockedData });
    running.push(s);
    const anon = new Client(`http://127.0.0.1:${port}`, '');
    await waitFor(async () => (s.child.exitCode !== null ? 'exited' : (await anon.get('/_internal/v1/ready')).status === 200), 'ready', 180_000, 250)
      .catch((e) => { throw new Error(`${e.message}\n${diag(s)}`); });
    assert.equal(s.child.exitCode, null, diag(s));
    const line = s.output.find((l) => l.includes(`cannot enter ${locked}`));
    const pgDir = /lives in (\S+)$/.exec(line ?? '')?.[1];
    assert.ok(pgDir?.startsWith(`${ROOT_FALLBACK_DIR}/postgres-`), diag(s));
    assert.ok(fs.existsSync(path.join(pgDir!, 'PG_VERSION')));
    await stopAndCheck(s, descendants(s.child.pid!));
    fs.rmSync(pgDir!, { recursive: true, force: true });
  });

  it('SIGTERM during startup stops whatever was already started', async () => {
    const otherData = fs.mkdtempSync(path.join(work, 'early-'));
    fs.chmodSync(otherData, 0o755);
    const s = npmStart(repo, { ...env, PORT: String(await freePort()), DATA_DIR: otherData });
    running.push(s);
    // Every process seen below npm start, until it exits: one started late would be missed by a
    // single snapshot.
    const seen = new Map<number, [string, string]>();
    const watch = setInterval(() => { for (const [pid, v] of descendants(s.child.pid!)) seen.set(pid, v); }, 10);
    try {
      // The moment the postgres server process exists, before it answers.
      await waitFor(async () => s.child.exitCode === null && [...seen.values()].some(([, cmd]) => /bin\/postgres -D/.test(cmd)), 'Postgres to be starting', 120_000, 10);
      s.child.kill('SIGTERM');
      const code = await Promise.race([s.exited, new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 90_000).unref())]);
      assert.notEqual(code, 'timeout', diag(s));
    } finally {
      clearInterval(watch);
    }
    assert.ok([...seen.values()].some(([, cmd]) => /postgres/.test(cmd)));
    await waitFor(async () => [...seen].every(([pid, [start]]) => !stillRunning(pid, start)), 'every process to exit', 30_000, 200)
      .catch(() => {
        const left = [...seen].filter(([pid, [start]]) => stillRunning(pid, start)).map(([pid, [, cmd]]) => `${pid} ${cmd}`);
        for (const [pid, [start]] of seen) if (stillRunning(pid, start)) process.kill(pid, 'SIGKILL');
        throw new Error(`still running after SIGTERM during startup:\n${left.join('\n')}\n${diag(s)}`);
      });
  });

  it('a second npm start on the same DATA_DIR finds the task again', async () => {
    assert.ok(taskId, 'needs the first start');
    const { s, client, procs } = await startAndWait(await freePort());
    const r = await client.get(`/api/task/v1/${taskId}`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.task.status, 'completed');
    assert.equal((await client.get('/api/auth/v1/api-key')).body.items.length, 1, 'the bootstrap key is created once');

    // Without DATABASE_URL the key CLI finds the Postgres this npm start runs under DATA_DIR.
    const out = execFileSync('npm', ['run', '--silent', 'cli', '--', 'keys', 'create', '--name', 'from the cli', '--scopes', 'task:read'],
      { cwd: repo, env: { ...env, DATA_DIR: dataDir }, encoding: 'utf8' });
    const key = /^key:\s+(\S+)$/m.exec(out)?.[1];
    assert.ok(key, out);
    assert.equal((await client.as(key).get(`/api/task/v1/${taskId}`)).status, 200);
    await stopAndCheck(s, procs);
  });

  it('npm start killed with SIGKILL: its API and worker stop by themselves; a second npm start meanwhile is refused, and the next one stops the servers it left and comes up', async () => {
    const { s, procs } = await startAndWait(await freePort());
    const of = (re: RegExp) => [...procs].filter(([, [, cmd]]) => re.test(cmd));
    const [launcher] = of(/scripts\/start\.ts/);
    assert.ok(launcher, [...procs.values()].map(([, cmd]) => cmd).join('\n'));

    // While it runs, another npm start on the same DATA_DIR is refused, and stops nothing.
    const second = npmStart(repo, { ...env, PORT: String(await freePort()), DATA_DIR: dataDir });
    running.push(second);
    assert.equal(await second.exited, 1, diag(second));
    assert.ok(second.output.some((l) => l.includes(`another npm start (pid ${launcher[0]}) is running on ${dataDir}`)), diag(second));
    assert.ok([...procs].every(([pid, [start]]) => stillRunning(pid, start)), 'the refused start stopped something');

    process.kill(launcher[0], 'SIGKILL');
    await s.exited;
    const apps = [...of(/api\/main\.ts/), ...of(/workers\/main\.ts/)];
    assert.equal(apps.length, 2);
    await waitFor(async () => apps.every(([pid, [start]]) => !stillRunning(pid, start)), 'the API and worker to stop without their launcher', 60_000, 200);
    const servers = [...of(/bin\/postgres -D/), ...of(/redis-server/)];
    assert.equal(servers.length, 2, [...procs.values()].map(([, cmd]) => cmd).join('\n'));
    assert.ok(servers.every(([pid, [start]]) => stillRunning(pid, start)), 'Postgres and Redis outlive a launcher killed with SIGKILL');

    const next = await startAndWait(await freePort());
    for (const what of ['Postgres', 'Redis']) {
      assert.ok(next.s.output.some((l) => l.includes(`stopping the ${what} (pid`) && l.includes('an earlier npm start on this DATA_DIR left running')), diag(next.s));
    }
    assert.ok(servers.every(([pid, [start]]) => !stillRunning(pid, start)));
    assert.equal((await next.client.get(`/api/task/v1/${taskId}`)).body.task.status, 'completed');
    await stopAndCheck(next.s, next.procs);
  });
});

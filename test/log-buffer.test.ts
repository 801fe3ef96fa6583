// A process whose stdout is not read (a stuck log collector) keeps at most LOG_BUFFER_MAX_BYTES of
// log lines waiting, drops the rest, and says how many it dropped once stdout moves again.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ROOT } from './helpers/stack.ts';
import { LOG_BUFFER_MAX_BYTES } from '../domain/logger.ts';

const REPORT = 'log lines dropped: stdout is not being read fast enough';

describe('log lines while stdout is not read', () => {
  // Long lines read at once; short ones read only after several report attempts met a full buffer.
  for (const { lines, lineBytes, readAfterMs } of [{ lines: 60_000, lineBytes: 1000, readAfterMs: 0 }, { lines: 400_000, lineBytes: 20, readAfterMs: 2500 }]) {
    it(`are buffered up to LOG_BUFFER_MAX_BYTES, the rest dropped and counted in a warn line (${lines} lines of ${lineBytes} bytes, read after ${readAfterMs} ms)`, async () => {
      const child = spawn(process.execPath, ['--expose-gc', '--import', 'tsx', path.join(ROOT, 'test/fixtures/log-flood.ts')], {
        cwd: ROOT, env: { ...process.env, FLOOD_LINES: String(lines), FLOOD_LINE_BYTES: String(lineBytes), READ_AFTER_MS: String(readAfterMs) }, stdio: ['ignore', 'pipe', 'pipe'],
      });
      // stdout stays unread (paused, its pipe full) until the child has logged everything, and then some.
      let stderr = '';
      const stats = await new Promise<{ heap_growth: number }>((resolve, reject) => {
        child.stderr.on('data', (b: Buffer) => {
          stderr += b.toString();
          const line = stderr.split('\n').find((l) => l.startsWith('{'));
          if (line) resolve(JSON.parse(line));
        });
        child.once('exit', (code) => reject(new Error(`exited with ${code}: ${stderr}`)));
      });
      await sleep(readAfterMs);
      let out = '';
      child.stdout.on('data', (b: Buffer) => (out += b.toString()));
      await new Promise((resolve) => child.once('exit', resolve));

      assert.ok(stats.heap_growth < 2 * LOG_BUFFER_MAX_BYTES, `heap grew by ${stats.heap_growth} bytes`);
      const written = out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
      const flood = written.filter((l) => l.msg === 'flood');
      const reports = written.filter((l) => l.msg === REPORT);
      assert.ok(flood.length > 0 && flood.length < lines, `${flood.length} lines written`);
      assert.ok(reports.length > 0 && reports.every((r) => r.level === 40 && r.buffer_max_bytes === LOG_BUFFER_MAX_BYTES));
      // Every line is written or counted as dropped.
      const counted = reports.reduce((n, r) => n + r.lines, 0);
      assert.equal(flood.length + counted, lines, `${flood.length} written, ${counted} counted as dropped`);
      // Lines go out in order: the ones kept are the first ones.
      assert.deepEqual(flood.map((l) => l.i), [...flood.keys()]);
    });
  }
});

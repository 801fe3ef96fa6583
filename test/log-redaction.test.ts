// Credential headers in a log object are censored whatever their case and wherever a log call puts
// them (as a backstop: they are not meant to be logged at all).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { promisify } from 'node:util';
import { ROOT } from './helpers/stack.ts';

describe('log redaction', () => {
  it('censors credential headers in either case, alone, in a headers object and in an error\'s response', async () => {
    const secret = `logged-secret-${randomUUID()}`;
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', path.join(ROOT, 'test/fixtures/log-credentials.ts')], {
      cwd: ROOT, env: { ...process.env, LOGGED_SECRET: secret },
    });
    const lines = stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    assert.equal(lines.length, 5);
    // Before: all but the request's lowercase authorization were written as they were.
    assert.deepEqual(lines.map(({ msg, Authorization, headers, req, err, call }) => ({ msg, Authorization, headers, req, err, call })), [
      { msg: 'top level, capitalised', Authorization: '[redacted]', headers: undefined, req: undefined, err: undefined, call: undefined },
      { msg: 'headers, capitalised', Authorization: undefined, headers: { Authorization: '[redacted]', Cookie: '[redacted]' }, req: undefined, err: undefined, call: undefined },
      { msg: 'request headers', Authorization: undefined, headers: undefined, req: { headers: { authorization: '[redacted]', 'proxy-authorization': '[redacted]' } }, err: undefined, call: undefined },
      { msg: 'an error response', Authorization: undefined, headers: undefined, req: undefined, err: { response: { headers: { authorization: '[redacted]', 'Set-Cookie': '[redacted]' } } }, call: undefined },
      { msg: 'one level down, capitalised', Authorization: undefined, headers: undefined, req: undefined, err: undefined, call: { Authorization: '[redacted]' } },
    ]);
    assert.ok(!stdout.includes(secret), stdout);
  });
});

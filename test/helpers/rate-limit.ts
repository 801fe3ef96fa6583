import assert from 'node:assert/strict';

// The rate limit's windows are this machine's wall-clock seconds: at most `limit` of a burst pass in
// each second it spans, however long a loaded machine takes over it. A burst spread over so many
// seconds that all of it could pass shows nothing, and fails rather than passing unchecked. Called as
// the burst's answers are in.
export function assertPerSecondLimit(from: number, passed: number, burst: number, limit: number) {
  const windows = Math.floor(Date.now() / 1000) - Math.floor(from / 1000) + 1;
  assert.ok(limit * windows < burst, `the burst of ${burst} spanned ${windows} seconds: too long to tell whether ${limit} a second held`);
  assert.ok(passed <= limit * windows, `at most ${limit} pass in each of the ${windows} seconds spanned: ${passed} passed`);
}

// domain/secret-mask.ts secretMasker on a secret longer than its encodings-aware patterns reach
// (FULL_PATTERN_CHARS): such a secret made the masker throw (its regular expression too large), with
// the secret spelled out in the error's message.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { FULL_PATTERN_CHARS, secretMasker } from '../domain/secret-mask.ts';

// No 64-character run of the secret is left in the text.
const assertNoRunOf = (secret: string, text: string) => {
  for (const run of text.match(/[A-Za-z0-9+/=é-]{64,}/g) ?? []) for (let i = 0; i + 64 <= run.length; i++) assert.ok(!secret.includes(run.slice(i, i + 64)), `a run of the secret is left: ${run.slice(i, i + 64)}`);
};

describe('secretMasker with a long secret', () => {
  // 100,000 characters, some of them not ASCII (percent-encoded as UTF-8 bytes).
  const secret = randomBytes(75_000).toString('base64').replace(/\//g, 'é').slice(0, 100_000);

  it('builds without throwing and masks the secret quoted whole, cut short before "...", at the end, percent-encoded or JSON-escaped', () => {
    assert.ok(secret.length > FULL_PATTERN_CHARS);
    const mask = secretMasker([secret]);
    const cases: [string, string][] = [
      [`the provider refused the key ${secret} (401)`, 'the provider refused the key *** (401)'],
      [`the request was Authorization: Bearer ${secret.slice(0, 1000)}... and was refused`, 'the request was Authorization: Bearer *** and was refused'],
      [`quoted ${secret.slice(0, 40)}... then more`, 'quoted *** then more'],
      [`cut at the end: ${secret.slice(0, 5000)}`, 'cut at the end: ***'],
      [`GET /v1?key=${encodeURIComponent(secret)}&x=1 refused`, 'GET /v1?key=***&x=1 refused'],
      [`GET /v1?key=${encodeURIComponent(secret).slice(0, 3001)}... refused`, 'GET /v1?key=*** refused'],
      [`body ${JSON.stringify({ key: secret })} refused`, 'body {"key":"***"} refused'],
    ];
    for (const [text, masked] of cases) {
      const out = mask(text);
      assert.equal(out, masked);
      assertNoRunOf(secret, out);
    }
  });

  it('masks it beside a short secret, and leaves a text without either alone', () => {
    const mask = secretMasker([secret, 'short-key-1234']);
    assert.equal(mask(`a ${secret} b short-key-1234 c`), 'a *** b *** c');
    assert.equal(mask('nothing secret here'), 'nothing secret here');
  });
});

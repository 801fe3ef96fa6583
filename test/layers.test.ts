// Which folders may import which: queues/ is wired by the API and the workers alike, so it may not
// depend on the API's layer.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from './helpers/stack.ts';

const importsOf = (file: string) => [...fs.readFileSync(file, 'utf8').matchAll(/(?:from|import)\s*\(?\s*'([^']+)'/g)].map((m) => m[1]);

describe('layers', () => {
  it('queues/ imports nothing from api/', () => {
    const dir = path.join(ROOT, 'queues');
    const intoApi = fs.readdirSync(dir).filter((f) => f.endsWith('.ts')).flatMap((f) => importsOf(path.join(dir, f))
      .filter((spec) => spec.startsWith('.') && path.relative(ROOT, path.resolve(dir, spec)).split(path.sep)[0] === 'api')
      .map((spec) => `queues/${f}: ${spec}`));
    assert.deepEqual(intoApi, []);
  });
});

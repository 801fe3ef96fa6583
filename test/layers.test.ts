// Which folders may import which: the domain, the SQL, the queue wiring and the workers are shared by
// the API and the worker processes, so none of them may depend on the API's layer.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT } from './helpers/stack.ts';

const importsOf = (file: string) => [...fs.readFileSync(file, 'utf8').matchAll(/(?:from|import)\s*\(?\s*'([^']+)'/g)].map((m) => m[1]);

describe('layers', () => {
  for (const layer of ['domain', 'db', 'queues', 'workers']) {
    it(`${layer}/ imports nothing from api/`, () => {
      const files = fs.readdirSync(path.join(ROOT, layer), { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts'));
      assert.ok(files.length > 0);
      const intoApi = files.flatMap((f) => {
        const file = path.join(ROOT, layer, f);
        return importsOf(file)
          .filter((spec) => spec.startsWith('.') && path.relative(ROOT, path.resolve(path.dirname(file), spec)).split(path.sep)[0] === 'api')
          .map((spec) => `${layer}/${f}: ${spec}`);
      });
      assert.deepEqual(intoApi, []);
    });
  }
});

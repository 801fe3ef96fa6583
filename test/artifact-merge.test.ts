// domain/a2a/artifact-merge.ts on its own, through artifactsFromTimeline (what tasks/get, stream
// snapshots and push deliveries show of a task's artifacts). The A2A tests (a2a-jsonrpc, a2a-stream,
// remote-agent) hold the rule itself to the SDK's; here, that reading many chunks stays linear and
// leaves what it read as it was.
import assert from 'node:assert/strict';
import { artifactsFromTimeline } from '../domain/a2a/mapping.ts';
import { HeldArtifacts } from '../domain/a2a/artifact-merge.ts';

const update = (artifact: Record<string, unknown>) => ({ event_payload: { type: 'artifact-update', artifact } }) as Parameters<typeof artifactsFromTimeline>[0][number];
const text = (t: string) => ({ kind: 'text' as const, text: t });

describe('artifact-merge: a task\'s artifacts from its timeline', () => {
  it('reads 200,000 appended chunks of one artifact in linear time (a copy a chunk took minutes)', () => {
    // Before: each chunk copied the artifact's parts so far; 40,000 chunks took 16 s, 200,000 more
    // than this test's 60 s (the API's event loop, at each read of the task).
    const n = 200_000;
    const items = [update({ artifactId: 'a', name: 'first', parts: [text('0')] })];
    for (let i = 1; i < n; i++) items.push(update({ artifactId: 'a', append: true, parts: [text(String(i))], ...(i === n - 1 ? { name: 'last', metadata: { i } } : {}) }));
    const [artifact, ...others] = artifactsFromTimeline(items);
    assert.equal(others.length, 0);
    assert.equal(artifact.parts.length, n);
    assert.deepEqual([artifact.parts[0], artifact.parts[n - 1]], [text('0'), text(String(n - 1))]);
    assert.equal(artifact.name, 'last');
    assert.deepEqual(artifact.metadata, { i: n - 1 });
  });

  it('leaves the items it read as they were, and an artifact replaced starts again from the update', () => {
    const first = { artifactId: 'a', parts: [text('one')], metadata: { k: 1 } };
    const items = [
      update(first),
      update({ artifactId: 'a', append: true, parts: [text('two')], metadata: { j: 2 } }),
      update({ artifactId: 'a', append: true, parts: [text('three')] }),
      update({ artifactId: 'b', parts: [text('other')] }),
      update({ artifactId: 'b', parts: [text('replaced')] }),
      update({ artifactId: 'b', append: true, parts: [text('added')] }),
    ];
    const before = JSON.stringify(items);
    const [a, b] = artifactsFromTimeline(items);
    assert.deepEqual(a, { artifactId: 'a', parts: [text('one'), text('two'), text('three')], metadata: { k: 1, j: 2 } });
    assert.deepEqual(b, { artifactId: 'b', parts: [text('replaced'), text('added')] });
    assert.equal(JSON.stringify(items), before);
    // Read twice, the same: nothing carried over from the first read.
    assert.deepEqual(artifactsFromTimeline(items), [a, b]);
  });

  it('takes a chunk\'s metadata key named __proto__ as a member, as JSON does, not as the prototype', () => {
    const chunk = JSON.parse('{"artifactId":"a","append":true,"parts":[{"kind":"text","text":"2"}],"metadata":{"__proto__":{"polluted":true}}}');
    const [a] = artifactsFromTimeline([update({ artifactId: 'a', parts: [text('1')], metadata: {} }), update(chunk)]);
    assert.equal(Object.getPrototypeOf(a.metadata), Object.prototype);
    assert.deepEqual(Object.keys(a.metadata!), ['__proto__']);
    assert.equal((a.metadata as { polluted?: unknown }).polluted, undefined);
  });
});

describe('artifact-merge: HeldArtifacts', () => {
  it('adds chunks to a copy of an artifact it was given, never to the artifact itself', () => {
    const held = new HeldArtifacts();
    const snapshot = { artifactId: 'a', parts: [text('1')], metadata: { k: 1 } };
    held.set(snapshot);
    const once = held.apply({ artifactId: 'a', parts: [text('2')], metadata: { j: 2 } }, true);
    const twice = held.apply({ artifactId: 'a', parts: [text('3')] }, true);
    assert.deepEqual(snapshot, { artifactId: 'a', parts: [text('1')], metadata: { k: 1 } });
    assert.equal(twice, once);
    assert.deepEqual(held.get('a'), { artifactId: 'a', parts: [text('1'), text('2'), text('3')], metadata: { k: 1, j: 2 } });
    // Given again whole, it is held as given (a copy); a chunk after adds to that copy, not to what was given.
    const whole = { artifactId: 'a', parts: [text('x')] };
    held.set(whole);
    held.apply({ artifactId: 'a', parts: [text('y')] }, true);
    assert.deepEqual(whole, { artifactId: 'a', parts: [text('x')] });
    assert.deepEqual(held.values(), [{ artifactId: 'a', parts: [text('x'), text('y')] }]);
  });
});

// The one rule for an artifact-update that says `append: true` (A2A 0.3 TaskArtifactUpdateEvent):
// what the task holds for that artifactId afterwards. A2A says only that the chunk's content is
// appended; the rule for its other members is @a2a-js/sdk 0.3's server (ResultManager), so that a
// task mirrored from a remote SDK agent, and any SDK client, see the artifact as that server keeps it:
// - parts: the earlier ones, then the chunk's;
// - name, description: the chunk's when it has one (a non-empty string), else the earlier ones;
// - metadata: the earlier, with the chunk's keys added over it (a shallow merge, later keys win);
// - extensions: the earlier ones (the SDK leaves them as first sent).
// Used by artifactsFromTimeline (tasks/get, stream snapshots, push deliveries) and by the remote
// agent's mirror (workers/agents/remote-a2a.ts), which must agree.
import type { Artifact } from '@a2a-js/sdk';
import { sameAsStored } from '../storable-json.ts';

/** The artifact `held` extended by an appended chunk of the same artifactId. */
export function mergeArtifactChunk(held: Artifact, chunk: Artifact): Artifact {
  const merged = ownCopy(held);
  appendInPlace(merged, chunk);
  return merged;
}

// A copy whose parts and metadata chunks may be added to without changing `a`.
const ownCopy = (a: Artifact): Artifact => ({ ...a, parts: [...a.parts], ...(a.metadata ? { metadata: { ...a.metadata } } : {}) });

// As JSON.parse and a spread make members: a key named __proto__ is a member, not the prototype.
const setMember = (o: Record<string, unknown>, k: string, v: unknown) => Object.defineProperty(o, k, { value: v, writable: true, enumerable: true, configurable: true });

function appendInPlace(held: Artifact, chunk: Artifact): void {
  for (const part of chunk.parts) held.parts.push(part);
  if (chunk.name) held.name = chunk.name;
  if (chunk.description) held.description = chunk.description;
  if (chunk.metadata) {
    held.metadata ??= {};
    for (const [k, v] of Object.entries(chunk.metadata)) setMember(held.metadata, k, v);
  }
}

/** Whether appending `chunk` would change `held` (its parts aside: any always do). */
export function chunkChanges(held: Artifact, chunk: Artifact): boolean {
  if ((chunk.name && chunk.name !== held.name) || (chunk.description && chunk.description !== held.description)) return true;
  return Object.entries(chunk.metadata ?? {}).some(([k, v]) => !held.metadata || !Object.hasOwn(held.metadata, k) || !sameAsStored(held.metadata[k], v));
}

/**
 * A task's artifacts by artifactId as its updates make them, in the order of each one's first
 * update. Each is held as a copy of its own, to which appended chunks are added in place: a copy
 * at every chunk was quadratic (40,000 chunks of one part took 16 s, of an API's one event loop at
 * each read of the task).
 */
export class HeldArtifacts {
  private readonly byId = new Map<string, Artifact>();

  get(artifactId: string): Artifact | undefined {
    return this.byId.get(artifactId);
  }

  /** Holds a copy of `artifact` (what the caller has is never changed), and returns it. */
  set(artifact: Artifact): Artifact {
    const own = ownCopy(artifact);
    this.byId.set(artifact.artifactId, own);
    return own;
  }

  /** Holds what `update` makes of its artifact (appended to the one held when `append`), and returns it. */
  apply(update: Artifact, append: boolean | undefined): Artifact {
    const held = this.byId.get(update.artifactId);
    if (!append || !held) return this.set(update);
    appendInPlace(held, update);
    return held;
  }

  values(): Artifact[] {
    return [...this.byId.values()];
  }
}

/**
 * The chunk that, appended to `held`, gives `whole` (its new parts at the end, with the name,
 * description and metadata keys that changed), if one does: a snapshot of an artifact that grew is
 * stored as that chunk rather than whole again. Undefined when `whole` is no such growth of `held`
 * (parts changed or none added, a metadata key dropped, other extensions).
 */
export function chunkBetween(held: Artifact, whole: Artifact): Artifact | undefined {
  const had = held.parts.length;
  if (whole.parts.length <= had || !sameAsStored(held.parts, whole.parts.slice(0, had))) return undefined;
  const metadata = Object.entries(whole.metadata ?? {}).filter(([k, v]) => !sameAsStored(held.metadata?.[k], v));
  const chunk: Artifact = {
    artifactId: whole.artifactId,
    ...(whole.name !== held.name && whole.name ? { name: whole.name } : {}),
    ...(whole.description !== held.description && whole.description ? { description: whole.description } : {}),
    parts: whole.parts.slice(had),
    ...(metadata.length ? { metadata: Object.fromEntries(metadata) } : {}),
  };
  return sameAsStored(mergeArtifactChunk(held, chunk), whole) ? chunk : undefined;
}

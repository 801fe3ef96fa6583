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
  const merged: Artifact = { ...held, parts: [...held.parts, ...chunk.parts] };
  if (chunk.name) merged.name = chunk.name;
  if (chunk.description) merged.description = chunk.description;
  if (chunk.metadata) merged.metadata = { ...held.metadata, ...chunk.metadata };
  return merged;
}

/** The artifact a task holds after an update: the update itself, unless it appends to one held. */
export function applyArtifactUpdate(held: Artifact | undefined, update: Artifact, append: boolean | undefined): Artifact {
  return append && held ? mergeArtifactChunk(held, update) : update;
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

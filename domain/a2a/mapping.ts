// Mapping between our stored shapes (domain/shapes/task.ts: snake_case, `type`-tagged parts) and
// A2A v0.3 objects (camelCase, `kind`-tagged). Field for field, nothing invented.
import type { Artifact, Message as A2AMessage, Part, Task as A2ATask, TaskStatus } from '@a2a-js/sdk';
import type { CreateMessageRequest, Message, MessagePart, Task } from '../shapes/task.ts';
import type { TimelineItem } from '../shapes/task.ts';
import type { TaskRow } from '../../db/tasks.ts';
import { HeldArtifacts } from './artifact-merge.ts';

const iso = (t: Date | string) => (t instanceof Date ? t : new Date(t)).toISOString();
const nonEmpty = (o: Record<string, unknown> | undefined) => (o && Object.keys(o).length ? o : undefined);
const withMeta = <T extends object>(obj: T, metadata: Record<string, unknown> | undefined) => {
  const m = nonEmpty(metadata);
  return m ? { ...obj, metadata: m } : obj;
};

export function toA2APart(p: MessagePart): Part {
  switch (p.type) {
    case 'text-part':
      return withMeta({ kind: 'text' as const, text: p.text }, p.metadata);
    case 'data-part':
      return withMeta({ kind: 'data' as const, data: p.data }, p.metadata);
    case 'file-part': {
      const { name, mime_type, bytes, uri } = p.file;
      const file = { ...(name !== undefined ? { name } : {}), ...(mime_type !== undefined ? { mimeType: mime_type } : {}), ...(bytes !== undefined ? { bytes } : { uri: uri! }) };
      return withMeta({ kind: 'file' as const, file }, p.metadata);
    }
  }
}

export function fromA2APart(p: Part): MessagePart {
  switch (p.kind) {
    case 'text':
      return withMeta({ type: 'text-part' as const, text: p.text }, p.metadata);
    case 'data':
      return withMeta({ type: 'data-part' as const, data: p.data }, p.metadata);
    case 'file': {
      const f = p.file as { name?: string; mimeType?: string; bytes?: string; uri?: string };
      const file = {
        ...(f.name !== undefined ? { name: f.name } : {}),
        ...(f.mimeType !== undefined ? { mime_type: f.mimeType } : {}),
        ...(f.bytes !== undefined ? { bytes: f.bytes } : {}),
        ...(f.uri !== undefined ? { uri: f.uri } : {}),
      };
      return withMeta({ type: 'file-part' as const, file }, p.metadata);
    }
  }
}

export function toA2AMessage(m: Message, contextId: string): A2AMessage {
  const out: A2AMessage = { kind: 'message', messageId: m.client_message_id ?? m.id, role: m.role, parts: m.parts.map(toA2APart), taskId: m.task_id, contextId };
  if (m.reference_task_ids?.length) out.referenceTaskIds = m.reference_task_ids;
  if (m.extensions?.length) out.extensions = m.extensions;
  return withMeta(out, m.metadata);
}

// An incoming A2A message (already validated) as the request our task domain stores.
export function fromA2AMessage(m: A2AMessage): CreateMessageRequest {
  return {
    role: m.role,
    client_message_id: m.messageId,
    parts: m.parts.map(fromA2APart),
    ...(m.referenceTaskIds?.length ? { reference_task_ids: m.referenceTaskIds } : {}),
    ...(m.extensions?.length ? { extensions: m.extensions } : {}),
    ...(m.metadata ? { metadata: m.metadata } : {}),
  };
}

// Artifacts are stored in A2A shape (workers/agents/types.ts emitArtifact); parts written in our
// own `type` form are converted so clients always see `kind` parts.
export function toA2AArtifact(stored: Record<string, unknown>): Artifact {
  const parts = Array.isArray(stored.parts) ? stored.parts : [];
  return {
    ...(stored as unknown as Artifact),
    parts: parts.map((p) => (p && typeof p === 'object' && 'type' in p && !('kind' in p) ? toA2APart(p as MessagePart) : (p as Part))),
  };
}

// The artifacts of a task from its timeline items (oldest first): a later update of the same
// artifactId replaces it, or when it says `append` is merged into it (artifact-merge.ts), where it
// stands (as the SDK's own server keeps a task's artifacts), so the order is that of each one's first update.
export function artifactsFromTimeline(items: Pick<TimelineItem, 'event_payload'>[]): Artifact[] {
  const held = new HeldArtifacts();
  for (const { event_payload: e } of items) {
    if (e.type !== 'artifact-update') continue;
    const { append, lastChunk: _lastChunk, ...rest } = e.artifact as Record<string, unknown> & { append?: boolean; lastChunk?: boolean };
    held.apply(toA2AArtifact(rest), append);
  }
  return held.values();
}

export function toA2AStatus(task: Task | TaskRow, statusMessage?: Message): TaskStatus {
  return {
    state: task.status,
    timestamp: iso(task.status_timestamp),
    ...(statusMessage ? { message: toA2AMessage(statusMessage, task.context_id) } : {}),
  };
}

export interface A2ATaskParts {
  /** Messages of the task, oldest first. */
  messages: Message[];
  /** Artifacts built by artifactsFromTimeline. */
  artifacts?: Artifact[];
  /** The task's status message, when `messages` may not contain it. */
  statusMessage?: Message;
  /** Most recent messages to include; undefined: all, 0: none. */
  historyLength?: number;
}

export function toA2ATask(task: Task | TaskRow, { messages, artifacts = [], historyLength, statusMessage }: A2ATaskParts): A2ATask {
  statusMessage ??= task.status_message_id ? messages.find((m) => m.id === task.status_message_id) : undefined;
  const history = historyLength === undefined ? messages : historyLength === 0 ? [] : messages.slice(-historyLength);
  const out: A2ATask = {
    kind: 'task',
    id: task.id,
    contextId: task.context_id,
    status: toA2AStatus(task, statusMessage),
    history: history.map((m) => toA2AMessage(m, task.context_id)),
  };
  if (artifacts.length) out.artifacts = artifacts;
  return withMeta(out, task.metadata);
}

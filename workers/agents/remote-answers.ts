// What a remote A2A agent's answers must hold for the mirror (remote-a2a.ts) to read them. The SDK
// passes the remote's results on as they came: one of another shape (null, a status without a state,
// a history entry or a part that is null) would fail deep in the mirror as a TypeError that does not
// say what the remote did, and a state A2A does not have (our task states are A2A's) was followed as
// one still running, for ever. Only what the mirror reads is checked here; what it hands on (a part's
// text, an artifact's parts) is checked where the runtime stores it. Objects allow other members.
// Each schema's title is what a failure says belongs there ('... whose status.state is no A2A task state').
import { Type } from '@sinclair/typebox';
import type { ErrorObject } from 'ajv';
import type { Message, Task, TaskArtifactUpdateEvent, TaskStatusUpdateEvent } from '@a2a-js/sdk';
import { compileSchema } from '../../domain/schema-check.ts';
import { TASK_STATES } from '../../domain/task-states.ts';
import { ID_MAX_LENGTH } from '../../domain/a2a/params.ts';

export type StreamEvent = Message | Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent;
type Kind = StreamEvent['kind'];

// An id the mirror keeps (in memory for the run, in Postgres for a task's): bounded as ours are
// (domain/a2a/params.ts), and without NUL, which Postgres cannot store.
const RemoteId = Type.String({ maxLength: ID_MAX_LENGTH, pattern: '^[^\\u0000]*$', title: `string of at most ${ID_MAX_LENGTH} characters without NUL` });
// The task and context an event names, where it names them.
const EventIds = { taskId: Type.Optional(RemoteId), contextId: Type.Optional(RemoteId) };
// A file part's file is read (its bytes or uri); other parts are handed on as they are.
const RemotePart = Type.Unsafe({
  type: 'object', title: 'part',
  if: { properties: { kind: { const: 'file' } }, required: ['kind'] },
  then: { properties: { file: { type: 'object', title: 'object' } }, required: ['file'] },
});
const RemoteMessage = Type.Object({ messageId: RemoteId, parts: Type.Array(RemotePart, { title: 'list' }), ...EventIds }, { title: 'message' });
const RemoteArtifact = Type.Object({ artifactId: RemoteId, parts: Type.Array(Type.Unknown(), { title: 'list' }) }, { title: 'artifact' });
const RemoteStatus = Type.Object({
  state: Type.Unsafe({ enum: [...TASK_STATES], title: 'A2A task state' }),
  message: Type.Optional(RemoteMessage),
}, { title: 'status' });

const EVENTS: Record<Kind, ReturnType<typeof compileSchema>> = {
  message: compileSchema(RemoteMessage),
  task: compileSchema(Type.Object({
    id: Type.Optional(RemoteId),
    contextId: Type.Optional(RemoteId),
    status: RemoteStatus,
    history: Type.Optional(Type.Array(RemoteMessage, { title: 'list' })),
    artifacts: Type.Optional(Type.Array(RemoteArtifact, { title: 'list' })),
  })),
  'status-update': compileSchema(Type.Object({ ...EventIds, status: RemoteStatus })),
  'artifact-update': compileSchema(Type.Object({ ...EventIds, artifact: RemoteArtifact })),
};
const ALL_KINDS = Object.keys(EVENTS) as Kind[];

// Where the first error is (`history.0`, `status.state`) and the title of what belongs there. ajv
// reports missing members before members of the wrong shape: a message without parts whose messageId
// is no string is said to have no parts.
function misshapen(errors: readonly ErrorObject[]): [where: string, what: string] {
  // An if/then's own error ("must match then") adds nothing to its branch's.
  const e = errors.find((x) => x.keyword !== 'if') ?? errors[0];
  const path = e.instancePath.split('/').slice(1);
  if (e.keyword === 'required') {
    const member = (e.params as { missingProperty: string }).missingProperty;
    const schema = (e.parentSchema as { properties?: Record<string, { title?: string }> }).properties?.[member];
    return [[...path, member].join('.'), `no ${schema?.title ?? 'value'}`];
  }
  return [path.join('.'), `no ${(e.parentSchema as { title?: string } | undefined)?.title ?? 'value of its shape'}`];
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Asserts the remote answered an event the mirror can read (of the kinds given: a read of its task must answer a task). */
export function checkEvent(event: unknown, kinds: readonly Kind[] = ALL_KINDS): asserts event is StreamEvent {
  const kind = isObject(event) ? kinds.find((k) => k === event.kind) : undefined;
  if (!kind) throw new Error(`the remote agent answered an event where ${kinds.length > 1 ? 'a task, message, status-update or artifact-update' : `a ${kinds[0]}`} belongs: ${quoted(event)}`);
  const validate = EVENTS[kind];
  if (validate(event)) return;
  const [where, what] = misshapen(validate.errors ?? []);
  throw new Error(`the remote agent answered ${kind === 'artifact-update' ? 'an' : 'a'} ${kind} whose ${where} is ${what}: ${quoted(event)}`);
}

// The quote ends a failure's message: cut short inside the key, what is left of it is masked there
// (see secretMasker). Only a refused event is quoted (a valid one may nest too deep to stringify).
function quoted(event: unknown): string {
  try {
    return String(JSON.stringify(event)).slice(0, 200);
  } catch {
    return '(too deeply nested to quote)';
  }
}

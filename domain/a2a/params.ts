// Schemas of each A2A v0.3 method's params, compiled once with ajv (and of the request id, for the
// OpenAPI document's request body: jsonrpc.ts).
// Objects allow unknown members (A2A is extended by adding fields), but every known member is
// checked as strictly as the REST API checks the same data (domain/shapes/task.ts). A push config
// and its authentication are closed: a misspelt `token` or `credentials` would otherwise be dropped
// in silence, and the webhook posted to without what the client meant it to check.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import type { ErrorObject } from 'ajv';
import { A2AError, JSONRPC } from './errors.ts';
import { choiceText, compileSchema, errorText, pointerNames, withoutChoiceBranches } from '../schema-check.ts';
import { memberPath } from '../errors.ts';
import { Base64, PushConfigId, Uuid } from '../shapes/common.ts';
import { AcceptedOutputModes, MessageExtensions } from '../shapes/task.ts';

const Metadata = Type.Record(Type.String(), Type.Unknown());
const meta = { metadata: Type.Optional(Metadata) };

const TextPart = Type.Object({ kind: Type.Literal('text'), text: Type.String(), ...meta });
const DataPart = Type.Object({ kind: Type.Literal('data'), data: Metadata, ...meta });
const FileBody = Type.Object({
  name: Type.Optional(Type.String()),
  mimeType: Type.Optional(Type.String()),
  bytes: Type.Optional(Base64),
  uri: Type.Optional(Type.String({ format: 'uri' })),
});
const FilePart = Type.Object({
  kind: Type.Literal('file'),
  // exactly one of bytes / uri, as A2A's FileWithBytes | FileWithUri says
  file: Type.Unsafe<Static<typeof FileBody>>({ ...FileBody, oneOf: [{ required: ['bytes'] }, { required: ['uri'] }] }),
  ...meta,
});
export const Part = Type.Unsafe<Static<typeof TextPart> | Static<typeof DataPart> | Static<typeof FilePart>>({
  type: 'object',
  required: ['kind'],
  oneOf: [TextPart, DataPart, FilePart],
  discriminator: { propertyName: 'kind' },
});

/** The longest message or task id a client may send (a remote agent's are held to it too: workers/agents/remote-answers.ts). */
export const ID_MAX_LENGTH = 256;

const Message = Type.Object({
  kind: Type.Literal('message'),
  messageId: Type.String({ minLength: 1, maxLength: ID_MAX_LENGTH }),
  role: Type.Literal('user', { description: 'a client sends user messages' }),
  parts: Type.Array(Part, { minItems: 1, maxItems: 1000 }),
  taskId: Type.Optional(Type.String({ minLength: 1, maxLength: ID_MAX_LENGTH })),
  // Uuid, not format 'uuid' alone: that also takes 'urn:uuid:…', which Postgres refuses (-32603).
  contextId: Type.Optional(Uuid),
  referenceTaskIds: Type.Optional(Type.Array(Uuid, { maxItems: 100 })),
  extensions: Type.Optional(MessageExtensions),
  ...meta,
});

export const PushNotificationConfig = Type.Object({
  url: Type.String({ minLength: 1 }),
  id: Type.Optional(PushConfigId),
  token: Type.Optional(Type.String()),
  authentication: Type.Optional(Type.Object({ schemes: Type.Array(Type.String(), { minItems: 1 }), credentials: Type.Optional(Type.String()) }, { additionalProperties: false })),
}, { additionalProperties: false });

// Any count is taken; the view is capped (domain/a2a/task-view.ts HISTORY_CAP).
const HistoryLength = Type.Integer({ minimum: 0 });

export const MessageSendParams = Type.Object({
  message: Message,
  configuration: Type.Optional(Type.Object({
    acceptedOutputModes: Type.Optional(AcceptedOutputModes),
    blocking: Type.Optional(Type.Boolean()),
    historyLength: Type.Optional(HistoryLength),
    pushNotificationConfig: Type.Optional(PushNotificationConfig),
  })),
  ...meta,
});
export type MessageSendParams = Static<typeof MessageSendParams>;

const TaskId = Type.String({ minLength: 1, maxLength: ID_MAX_LENGTH });
export const TaskQueryParams = Type.Object({ id: TaskId, historyLength: Type.Optional(HistoryLength), ...meta });
export type TaskQueryParams = Static<typeof TaskQueryParams>;
export const TaskIdParams = Type.Object({ id: TaskId, ...meta });
export type TaskIdParams = Static<typeof TaskIdParams>;
export const SetPushConfigParams = Type.Object({ taskId: TaskId, pushNotificationConfig: PushNotificationConfig });
export type SetPushConfigParams = Static<typeof SetPushConfigParams>;
export const GetPushConfigParams = Type.Object({ id: TaskId, pushNotificationConfigId: Type.Optional(PushConfigId), ...meta });
export type GetPushConfigParams = Static<typeof GetPushConfigParams>;
export const DeletePushConfigParams = Type.Object({ id: TaskId, pushNotificationConfigId: PushConfigId, ...meta });
export type DeletePushConfigParams = Static<typeof DeletePushConfigParams>;
// One type check, not a union: a wrong value is told once what it may be, where a union also reported
// each branch's failure and ajv's anyOf.
export const NoParams = Type.Unsafe<Record<string, unknown> | null>({ type: ['object', 'null'] });

// A request id an answer can echo as sent (isId, jsonrpc.ts): JSON.parse rounds a number past 2^53.
export const RequestId = Type.Union([Type.String(), Type.Number({ minimum: -Number.MAX_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER }), Type.Null()]);

// A2A's paths index lists as JSON-RPC clients write them (`parts[0]`); names as the REST errors do.
const step = (path: string, name: string) => (/^\d+$/.test(name) ? `${path}[${name}]` : memberPath(path, name));
function where(e: ErrorObject): string {
  const base = pointerNames(e.instancePath).reduce(step, 'params');
  if (e.keyword === 'required') return memberPath(base, (e.params as { missingProperty: string }).missingProperty);
  if (e.keyword === 'additionalProperties') return memberPath(base, (e.params as { additionalProperty: string }).additionalProperty);
  if (e.keyword === 'discriminator') return `${base}.kind`;
  return base;
}

function describe(e: ErrorObject): string {
  switch (e.keyword) {
    case 'required': return 'is required';
    case 'additionalProperties': return 'is not an allowed member';
    case 'discriminator': return 'must be one of text, data, file';
    case 'oneOf': return choiceText(e) ?? 'matches none of the allowed shapes';
    default: return errorText(e);
  }
}

export interface Validator<T> { (value: unknown): T }

// A validator that returns the value typed or throws -32602 naming the first bad field.
export function validator<T extends TSchema>(schema: T): Validator<Static<T>> {
  const validate = compileSchema(schema);
  return (value) => {
    if (validate(value)) return value as Static<T>;
    // Left out (a request without params), not params of the wrong type.
    if (value === undefined) throw new A2AError(JSONRPC.INVALID_PARAMS, 'Invalid params: params is required', { errors: [{ path: 'params', message: 'is required' }] });
    // A file with neither or both of bytes/uri is said once, as that choice; a part without a kind
    // once, as its kind required (ajv also reports the discriminator it cannot read).
    const reported = withoutChoiceBranches(validate.errors ?? []);
    const kindless = new Set(reported.filter((e) => e.keyword === 'required' && (e.params as { missingProperty: string }).missingProperty === 'kind').map((e) => e.instancePath));
    const errors = reported.filter((e) => !(e.keyword === 'discriminator' && kindless.has(e.instancePath)));
    const list = [...new Map(errors.map((e) => [`${where(e)} ${describe(e)}`, { path: where(e), message: describe(e) }])).values()];
    throw new A2AError(JSONRPC.INVALID_PARAMS, `Invalid params: ${list[0].path} ${list[0].message}`, { errors: list });
  };
}

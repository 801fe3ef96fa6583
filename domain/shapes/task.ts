import { Type, type Static } from '@sinclair/typebox';
import { Base64, Body, FreeObject, NoControlChars, Paginated, Timestamp, Uuid } from './common.ts';
import { TASK_STATES } from '../task-states.ts';

const meta = { metadata: Type.Optional(FreeObject) };
export const TextPart = Type.Object({ type: Type.Literal('text-part'), text: Type.String(), ...meta }, { additionalProperties: false });
export const DataPart = Type.Object({ type: Type.Literal('data-part'), data: FreeObject, ...meta }, { additionalProperties: false });
const FileContent = Type.Object({
  name: Type.Optional(Type.String()),
  mime_type: Type.Optional(Type.String()),
  bytes: Type.Optional(Base64),
  uri: Type.Optional(Type.String({ format: 'uri' })),
}, { additionalProperties: false, oneOf: [{ required: ['bytes'] }, { required: ['uri'] }], description: 'exactly one of bytes or uri' });
export const FilePart = Type.Object({ type: Type.Literal('file-part'), file: FileContent, ...meta }, { additionalProperties: false });
// oneOf + discriminator so a bad part reports the problem of its own type, not of all three.
export const MessagePart = Type.Unsafe<Static<typeof TextPart> | Static<typeof DataPart> | Static<typeof FilePart>>({
  oneOf: [TextPart, DataPart, FilePart],
  discriminator: { propertyName: 'type' },
  required: ['type'],
  type: 'object',
  $id: 'MessagePart',
});
export type MessagePart = Static<typeof MessagePart>;

export const Role = Type.Union([Type.Literal('user'), Type.Literal('agent')]);
export const TaskStatus = Type.Union(TASK_STATES.map((s) => Type.Literal(s)));

// The sender's own id for a message: any string (A2A messageId), echoed back, never used to look it up.
const ClientMessageId = Type.String({ minLength: 1, maxLength: 256, description: "the sender's own id for the message (A2A messageId)" });
// The extensions the message uses (A2A Message.extensions): their URIs, kept as sent.
export const MessageExtensions = Type.Array(Type.String({ minLength: 1, maxLength: 2048 }), { maxItems: 100, description: 'URIs of the A2A extensions the message uses (A2A extensions)' });
// Kept as sent, not parsed as media types: A2A clients also name modes such as "text".
export const AcceptedOutputModes = Type.Array(Type.String({ minLength: 1, maxLength: 255, pattern: NoControlChars }), {
  maxItems: 32, description: 'media types the sender accepts for the reply (A2A configuration.acceptedOutputModes), for the agent to tailor its output',
});

export const CreateMessageRequest = Body({
  role: Role,
  client_message_id: Type.Optional(ClientMessageId),
  parts: Type.Array(MessagePart, { minItems: 1, maxItems: 1000 }),
  reference_task_ids: Type.Optional(Type.Array(Uuid, { maxItems: 100 })),
  extensions: Type.Optional(MessageExtensions),
  accepted_output_modes: Type.Optional(AcceptedOutputModes),
  metadata: Type.Optional(FreeObject),
});
export type CreateMessageRequest = Static<typeof CreateMessageRequest>;

export const Task = Type.Object({
  id: Uuid,
  context_id: Uuid,
  status: TaskStatus,
  status_timestamp: Timestamp,
  status_message_id: Type.Union([Uuid, Type.Null()]),
  metadata: FreeObject,
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'Task' });
export type Task = Static<typeof Task>;

export const Message = Type.Object({
  id: Uuid,
  client_message_id: Type.Optional(ClientMessageId),
  task_id: Uuid,
  role: Role,
  parts: Type.Array(MessagePart),
  reference_task_ids: Type.Array(Uuid),
  extensions: Type.Optional(MessageExtensions),
  accepted_output_modes: Type.Optional(AcceptedOutputModes),
  metadata: FreeObject,
  created_at: Timestamp,
}, { $id: 'Message' });
export type Message = Static<typeof Message>;

export const TimelineItem = Type.Object({
  id: Uuid,
  task_id: Uuid,
  created_at: Timestamp,
  event_payload: Type.Union([
    Type.Object({ type: Type.Literal('task-status-update'), status: TaskStatus, status_message_id: Type.Optional(Uuid) }),
    Type.Object({ type: Type.Literal('message'), message: Message }),
    Type.Object({ type: Type.Literal('artifact-update'), artifact: FreeObject }),
  ]),
}, { $id: 'TimelineItem' });
export type TimelineItem = Static<typeof TimelineItem>;

export const ContextInfo = Type.Object({ context_id: Uuid, created_at: Timestamp }, { $id: 'ContextInfo' });
export type ContextInfo = Static<typeof ContextInfo>;
// list-contexts' answer, under the name the seed gives it.
export const ContextInfoPaginatedResponse = Paginated(ContextInfo, 'items', { $id: 'ContextInfoPaginatedResponse' });

export const CreateTaskRequest = Body({
  context_id: Type.Optional(Uuid),
  message: CreateMessageRequest,
  metadata: Type.Optional(FreeObject),
});
export type CreateTaskRequest = Static<typeof CreateTaskRequest>;

export const UpdateTaskRequest = Body({ status: TaskStatus, message: Type.Optional(CreateMessageRequest) });
export type UpdateTaskRequest = Static<typeof UpdateTaskRequest>;

export const GetTaskResponse = Type.Object({
  task: Task,
  messages: Type.Array(Message),
  messages_next_page_token: Type.Optional(Type.String()),
  status_message: Type.Optional(Message),
});

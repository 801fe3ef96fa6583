// What an agent hands the runtime, checked before it is stored: messages in the task API's part
// shape, artifacts in A2A's. Stored unchecked, a wrong shape reached A2A clients as `parts: [null]`.
import { Type, type Static } from '@sinclair/typebox';
import { MessagePart } from '../../api/schemas/task.ts';
import { Part } from '../../domain/a2a/params.ts';
import { checkValid, compileSchema } from '../../domain/schema-check.ts';
import type { Reply } from './types.ts';

const ReplyParts = Type.Array(MessagePart, { minItems: 1, maxItems: 1000 });
const validateReply = compileSchema(ReplyParts);

export const Artifact = Type.Object({
  artifactId: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
  name: Type.Optional(Type.String()),
  description: Type.Optional(Type.String()),
  parts: Type.Array(Part, { minItems: 1, maxItems: 1000 }),
  metadata: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  /** With the artifactId of an earlier one: these parts are added to it (A2A streaming). */
  append: Type.Optional(Type.Boolean()),
  lastChunk: Type.Optional(Type.Boolean()),
});
export type Artifact = Static<typeof Artifact>;
const validateArtifact = compileSchema(Artifact);

/** A reply (a string, or parts with `type`) as message parts; throws naming what is wrong. */
export function replyParts(reply: Reply, where: string): Static<typeof ReplyParts> {
  const parts = typeof reply === 'string' ? [{ type: 'text-part' as const, text: reply }] : reply;
  checkValid(validateReply, parts, where);
  return parts;
}

/** An agent message of a reply (reply, a status message, the run's end). */
export const agentMessage = (reply: Reply, where: string) => ({ role: 'agent' as const, parts: replyParts(reply, where) });

export function checkArtifact(artifact: unknown): Artifact {
  checkValid(validateArtifact, artifact, 'artifact');
  return artifact as Artifact;
}

// What an agent hands the runtime, checked before it is stored: messages in the task API's part
// shape, artifacts in A2A's. Stored unchecked, a wrong shape reached A2A clients as `parts: [null]`.
import { Type, type Static } from '@sinclair/typebox';
import { MessagePart } from '../../domain/shapes/task.ts';
import { Part } from '../../domain/a2a/params.ts';
import { checkValid, compileSchema } from '../../domain/schema-check.ts';
import { InvalidRequest } from '../../domain/errors.ts';
import { findUnstorable } from '../../domain/storable-json.ts';
import type { Reply } from './types.ts';

const ReplyParts = Type.Array(MessagePart, { minItems: 1, maxItems: 1000 });
const validateReply = compileSchema(ReplyParts);
// A reply with message metadata: the object form of Reply.
const ReplyMessage = Type.Object({ parts: ReplyParts, metadata: Type.Optional(Type.Record(Type.String(), Type.Unknown())) }, { additionalProperties: false });
const validateReplyMessage = compileSchema(ReplyMessage);

export const Artifact = Type.Object({
  artifactId: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
  name: Type.Optional(Type.String()),
  description: Type.Optional(Type.String()),
  parts: Type.Array(Part, { minItems: 1, maxItems: 1000 }),
  metadata: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  extensions: Type.Optional(Type.Array(Type.String())),
  /** With the artifactId of an earlier one: these parts are added to it (A2A streaming). */
  append: Type.Optional(Type.Boolean()),
  lastChunk: Type.Optional(Type.Boolean()),
}, { additionalProperties: false }); // a misspelt `apend` would otherwise replace the artifact, and be served
export type Artifact = Static<typeof Artifact>;
const validateArtifact = compileSchema(Artifact);

// What fits the schema may still not be stored as given: a NUL character or an unpaired surrogate
// (Postgres refuses it: the run was retried, repeating its replies, then failed with a SQLSTATE), NaN
// or Infinity (kept as null), a BigInt, a cycle or nesting past 64 levels (JSON.stringify throws).
// Refused like a wrong shape, as no retry can mend it.
function checkStorable(value: unknown, where: string): void {
  const problem = findUnstorable(value, where);
  if (problem) throw new InvalidRequest(`Invalid ${where}: ${problem.path} ${problem.message}`, [problem]);
}

/** An agent message of a reply (reply, a status message, the run's end); throws naming what is wrong. */
export function agentMessage(reply: Reply, where: string): { role: 'agent'; parts: Static<typeof ReplyParts>; metadata?: Record<string, unknown> } {
  if (typeof reply === 'object' && reply !== null && !Array.isArray(reply)) {
    checkValid(validateReplyMessage, reply, where);
    checkStorable(reply, where);
    return { role: 'agent', parts: reply.parts, ...(reply.metadata && Object.keys(reply.metadata).length ? { metadata: reply.metadata } : {}) };
  }
  const parts = typeof reply === 'string' ? [{ type: 'text-part' as const, text: reply }] : reply;
  checkValid(validateReply, parts, where);
  checkStorable(parts, where);
  return { role: 'agent', parts };
}

export function checkArtifact(artifact: unknown): Artifact {
  checkValid(validateArtifact, artifact, 'artifact');
  checkStorable(artifact, 'artifact');
  return artifact as Artifact;
}

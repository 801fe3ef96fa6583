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

const readableMessage = (err: unknown): string => {
  try {
    return err instanceof Error && err.message ? err.message : 'a getter, proxy trap or toJSON threw';
  } catch {
    return 'a getter, proxy trap or toJSON threw';
  }
};

// What is stored is JSON.stringify's reading of a value, so that reading is what is checked, not the
// value: a class instance's toJSON (a Date's, a URL's, one of the agent's own) and its getters (which
// JSON.stringify does not read on a prototype) give another shape than its members as read. Checked by
// its members, a part whose toJSON gave null, or whose members were getters, passed and was stored as
// null or {}, and every tasks/get of the task answered -32603 from then on. Values are checked as they
// are first (NaN, which JSON writes as null, a BigInt, a cycle, even where a toJSON would hide them).
// `read` gives the value: reading it may throw too (a getter, a proxy trap).
function asStored(read: () => unknown, where: string): unknown {
  let text: string | undefined;
  try {
    const value = read();
    checkStorable(value, where);
    text = JSON.stringify(value);
  } catch (err) {
    if (err instanceof InvalidRequest) throw err;
    // A getter, a proxy trap or a toJSON threw (or a cycle only a toJSON made).
    throw new InvalidRequest(`Invalid ${where}: it could not be read as JSON (${readableMessage(err)})`);
  }
  if (text === undefined) throw new InvalidRequest(`Invalid ${where}: it is written as no JSON at all (a toJSON gave undefined, a function or a symbol)`);
  const stored: unknown = JSON.parse(text);
  // A toJSON or a getter may give what the first read did not (a NUL character, nesting past 64 levels).
  checkStorable(stored, where);
  return stored;
}

// The object form's parts and metadata read as members, however the object has them (a getter of a
// class, a prototype, a proxy), as JSON.stringify would not; the other members as JSON has them, to be
// refused.
function withMembersRead(reply: unknown): unknown {
  if (typeof reply !== 'object' || reply === null || Array.isArray(reply)) return reply;
  const { parts, metadata } = reply as { parts?: unknown; metadata?: unknown };
  return { ...reply, parts, metadata };
}

/** An agent message of a reply (reply, a status message, the run's end) as it is stored; throws naming what is wrong. */
export function agentMessage(reply: Reply, where: string): { role: 'agent'; parts: Static<typeof ReplyParts>; metadata?: Record<string, unknown> } {
  const stored = asStored(() => (typeof reply === 'string' ? [{ type: 'text-part', text: reply }] : withMembersRead(reply)), where);
  if (typeof stored === 'object' && stored !== null && !Array.isArray(stored)) {
    checkValid(validateReplyMessage, stored, where);
    const { parts, metadata } = stored as Static<typeof ReplyMessage>;
    return { role: 'agent', parts, ...(metadata && Object.keys(metadata).length ? { metadata } : {}) };
  }
  checkValid(validateReply, stored, where);
  return { role: 'agent', parts: stored as Static<typeof ReplyParts> };
}

/** An artifact as it is stored; throws naming what is wrong. */
export function checkArtifact(artifact: unknown): Artifact {
  const stored = asStored(() => artifact, 'artifact');
  checkValid(validateArtifact, stored, 'artifact');
  return stored as Artifact;
}

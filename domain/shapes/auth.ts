import { Type } from '@sinclair/typebox';
import { Body, NoControlChars, Timestamp, Uuid } from './common.ts';
import { SCOPES } from '../api-keys.ts';

export const Scope = Type.Union(SCOPES.map((s) => Type.Literal(s)));

// As listed: never the key itself.
export const ApiKey = Type.Object({ id: Uuid, name: Type.String(), scopes: Type.Array(Scope), created_at: Timestamp, last_used_at: Type.Union([Timestamp, Type.Null()]) });

// A name that is blank is refused by domain/api-keys.ts (a lookahead here would defeat the hostile-input test's generator).
export const CreateApiKeyRequest = Body({ name: Type.String({ minLength: 1, maxLength: 200, pattern: NoControlChars }), scopes: Type.Array(Scope, { minItems: 1 }) });

// The key is in this answer only.
export const CreatedApiKey = Type.Object({ id: Uuid, name: Type.String(), scopes: Type.Array(Scope), key: Type.String(), created_at: Timestamp });

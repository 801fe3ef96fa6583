// Value shapes (TypeBox) that the API's schemas, the domain and the queues' job payloads share: here,
// as queues/ may not depend on api/, nor the domain on the API's layer.
import { Type } from '@sinclair/typebox';
import { worded } from './schema-check.ts';

// The pattern too: ajv-formats' uuid format also accepts 'urn:uuid:...', which Postgres refuses.
export const Uuid = Type.String({ format: 'uuid', pattern: worded('^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$', 'must be a UUID'), description: 'UUID' });

// A push notification config's id, as A2A clients name one (pushNotificationConfig.id,
// pushNotificationConfigId) and as delivery jobs carry it. NUL is refused here, not only by the A2A
// body check (findUnstorable): Postgres refuses it, so a job naming one would fail every attempt.
export const PushConfigId = Type.String({ minLength: 1, maxLength: 256, pattern: worded('^[^\\u0000]*$', 'must not contain NUL'), description: 'push notification config id: 1 to 256 characters, no NUL' });

// Sent to the provider as its Idempotency-Key header (Stripe keeps a key's answer 24 hours and
// answers a repeat with it), so a client that retries after a 502 or a hang-up refunds once. A
// header value: visible ASCII with inner spaces, at most Stripe's 255.
const IDEMPOTENCY_KEY_CHARACTERS = 'must be visible ASCII (inner spaces allowed)';
export const IdempotencyKey = Type.String({
  minLength: 1, maxLength: 255, pattern: worded('^[!-~](?:[ -~]*[!-~])?$', IDEMPOTENCY_KEY_CHARACTERS),
  description: "sent to providers that honour one (Stripe) as the Idempotency-Key header: a repeat of the call with the same key gets the first call's answer instead of acting again; other providers ignore it",
});
// The key's rules in words, from its schema, for text that states them to clients (the MCP server's instructions).
export const IDEMPOTENCY_KEY_RULES = `${IdempotencyKey.minLength} to ${IdempotencyKey.maxLength} characters, which ${IDEMPOTENCY_KEY_CHARACTERS}`;

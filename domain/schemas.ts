// Value shapes (TypeBox) that the API's schemas and the queues' job payloads share: here, as queues/
// may not depend on api/.
import { Type } from '@sinclair/typebox';
import { worded } from './schema-check.ts';

// The pattern too: ajv-formats' uuid format also accepts 'urn:uuid:...', which Postgres refuses.
export const Uuid = Type.String({ format: 'uuid', pattern: worded('^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$', 'must be a UUID'), description: 'UUID' });

// A push notification config's id, as A2A clients name one (pushNotificationConfig.id,
// pushNotificationConfigId) and as delivery jobs carry it. NUL is refused here, not only by the A2A
// body check (findUnstorable): Postgres refuses it, so a job naming one would fail every attempt.
export const PushConfigId = Type.String({ minLength: 1, maxLength: 256, pattern: worded('^[^\\u0000]*$', 'must not contain NUL'), description: 'push notification config id: 1 to 256 characters, no NUL' });

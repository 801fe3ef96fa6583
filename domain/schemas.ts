// Value shapes (TypeBox) that the API's schemas and the queues' job payloads share: here, as queues/
// may not depend on api/.
import { Type } from '@sinclair/typebox';
import { worded } from './schema-check.ts';

// The pattern too: ajv-formats' uuid format also accepts 'urn:uuid:...', which Postgres refuses.
export const Uuid = Type.String({ format: 'uuid', pattern: worded('^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$', 'must be a UUID'), description: 'UUID' });

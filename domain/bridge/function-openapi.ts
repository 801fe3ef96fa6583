// GET /function-instances/openapi.json: an OpenAPI 3.1 document with one invoke operation per
// enabled function instance, its request and output schemas taken from the function controller.
//
// Function instances have no bound in number, and each path is some 3 KB of text (10 KB described),
// so the document is written as it is read, a batch of instances at a time, as JSON text at the
// client's pace (backpressure): what the API holds is a batch, however many instances there are.
import type { Readable } from 'node:stream';
import type { Knex } from 'knex';
import { FUNCTION_INSTANCE_BATCH, functionInstanceBatches, functionInstancesAfter, type FunctionInstanceRow } from '../../db/bridge.ts';
import { describedInstances, type DescribedInstance } from './catalog.ts';
import { SERVICE_VERSION } from '../version.ts';
import type { Logger } from '../logger.ts';
import { jsonStream, members, opened } from '../json-stream.ts';
import { ErrorBody, IdempotencyKey } from '../shapes/common.ts';

// The service's own Error body, as plain JSON Schema (without its $id: this document has no components).
const { $id: _id, ...errorSchema } = JSON.parse(JSON.stringify(ErrorBody)) as Record<string, unknown>;
// The body's idempotency_key, which retrying clients should send (the endpoint's own schema).
const idempotencyKey = JSON.parse(JSON.stringify(IdempotencyKey)) as Record<string, unknown>;

const WHAT = 'function instances OpenAPI document';

// One member of `paths`. No two rows make the same key: (provider_instance_id,
// function_controller_type_id) is the table's primary key, f.type_id is that function id, and the
// encoded instance id holds no '/' to be read across the separator.
function path({ row, f }: DescribedInstance): [string, unknown] {
  return [`/api/bridge/v1/provider/${encodeURIComponent(row.provider_instance_id)}/function/${f.type_id}/invoke`, {
    post: {
      operationId: `${row.provider_instance_id}.${f.type_id}`.replace(/[^A-Za-z0-9_.-]/g, '_'),
      summary: f.name,
      description: f.documentation,
      tags: [row.provider_controller_type_id, ...f.categories],
      security: [{ bearer: [] }],
      requestBody: {
        required: true,
        content: { 'application/json': { schema: { type: 'object', required: ['params'], additionalProperties: false, properties: { params: f.parameters, idempotency_key: idempotencyKey } } } },
      },
      responses: {
        200: {
          description: 'The function ran: its output, or the provider\'s refusal',
          content: { 'application/json': { schema: { oneOf: [
            { allOf: [{ type: 'object', required: ['type'], properties: { type: { const: 'success' } } }, f.output] },
            { type: 'object', required: ['type', 'message'], properties: { type: { const: 'error' }, message: { type: 'string' } } },
          ] } } },
        },
        ...Object.fromEntries([400, 401, 403, 404, 409, 502].map((s) => [s, { description: 'Error', content: { 'application/json': { schema: errorSchema } } }])),
      },
    },
  }];
}

// The document as JSON text, as JSON.stringify would write it whole.
async function* documentText(db: Knex, serverUrl: string, first: FunctionInstanceRow[], log: Logger): AsyncGenerator<string> {
  yield `${opened({
    openapi: '3.1.0',
    info: { title: 'taskbridge bridge functions', version: SERVICE_VERSION, description: 'Invoke operations of the enabled bridge function instances.' },
    servers: [{ url: serverUrl }],
  })},"paths":{`;
  // Each batch is a read of its own, not one snapshot held open while the client reads: each path
  // stands alone (its instance and its function's schemas, nothing elsewhere in the document), so an
  // instance enabled or disabled meanwhile is in the document or not and the others are as they are,
  // and the key order writes none twice.
  yield* members(describedInstances(functionInstanceBatches(db, first), log, WHAT), (instances) => instances.map(path));
  yield `},"components":${JSON.stringify({ securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'API key with the bridge:invoke scope' } } })}}`;
}

// The document as a JSON stream, once its first batch is read (a database out of reach fails here,
// before anything is answered). A failure after that can only cut the connection.
export async function functionInstancesOpenApi(db: Knex, serverUrl: string, log: Logger): Promise<Readable> {
  const first = await functionInstancesAfter(db, undefined, FUNCTION_INSTANCE_BATCH);
  return jsonStream(documentText(db, serverUrl, first, log), log, WHAT);
}

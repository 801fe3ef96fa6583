// GET /function-instances/openapi.json: an OpenAPI 3.1 document with one invoke operation per
// enabled function instance, its request and output schemas taken from the function controller.
import type { Knex } from 'knex';
import { allFunctionInstances } from '../../db/bridge.ts';
import { describeFunction, functionDef, providerDef } from './catalog.ts';
import { SERVICE_VERSION } from '../version.ts';
import { ErrorBody } from '../../api/schemas/common.ts';

// The service's own Error body, as plain JSON Schema (without its $id: this document has no components).
const { $id: _id, ...errorSchema } = JSON.parse(JSON.stringify(ErrorBody)) as Record<string, unknown>;

export async function functionInstancesOpenApi(db: Knex, serverUrl: string): Promise<Record<string, unknown>> {
  const paths: Record<string, unknown> = {};
  for (const row of await allFunctionInstances(db)) {
    const f = describeFunction(functionDef(providerDef(row.provider_controller_type_id), row.function_controller_type_id));
    paths[`/api/bridge/v1/provider/${encodeURIComponent(row.provider_instance_id)}/function/${f.type_id}/invoke`] = {
      post: {
        operationId: `${row.provider_instance_id}.${f.type_id}`.replace(/[^A-Za-z0-9_.-]/g, '_'),
        summary: f.name,
        description: f.documentation,
        tags: [row.provider_controller_type_id, ...f.categories],
        security: [{ bearer: [] }],
        requestBody: {
          required: true,
          content: { 'application/json': { schema: { type: 'object', required: ['params'], additionalProperties: false, properties: { params: f.parameters } } } },
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
    };
  }
  return {
    openapi: '3.1.0',
    info: { title: 'taskbridge bridge functions', version: SERVICE_VERSION, description: 'Invoke operations of the enabled bridge function instances.' },
    servers: [{ url: serverUrl }],
    paths,
    components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'API key with the bridge:invoke scope' } } },
  };
}

// The built-in provider controllers, how they are served (GET /available-providers) and how
// credential values and function params are checked against their schemas.
import type { ValidateFunction } from 'ajv';
import type { TObject } from '@sinclair/typebox';
import { NotFound } from '../errors.ts';
import { listPage, type Page } from '../../db/pagination.ts';
import { checkValid, compileSchema } from '../schema-check.ts';
import type { CredentialController, FunctionController, ProviderController } from '../../api/schemas/bridge.ts';
import type { CredentialControllerDef, FunctionControllerDef, ProviderControllerDef } from './types.ts';
import type { FunctionInstanceRow } from '../../db/bridge.ts';
import type { Logger } from '../logger.ts';
import { googleMail } from './providers/google-mail.ts';
import { stripe } from './providers/stripe.ts';

export const PROVIDERS: ProviderControllerDef[] = [googleMail, stripe];

export function providerDef(typeId: string): ProviderControllerDef {
  const p = PROVIDERS.find((d) => d.type_id === typeId);
  if (!p) throw new NotFound('provider_controller', typeId);
  return p;
}

export function credentialDef(provider: ProviderControllerDef, typeId: string): CredentialControllerDef {
  const c = provider.credentialControllers.find((d) => d.type_id === typeId);
  if (!c) throw new NotFound('credential_controller', typeId, `for provider '${provider.type_id}'`);
  return c;
}

export function functionDef(provider: ProviderControllerDef, typeId: string): FunctionControllerDef {
  const f = provider.functions.find((d) => d.type_id === typeId);
  if (!f) throw new NotFound('function_controller', typeId, `for provider '${provider.type_id}'`);
  return f;
}

// The function a stored instance names, or undefined where this release's catalog no longer has its
// provider or function (a release that removed one).
export const storedFunctionDef = (providerTypeId: string, functionTypeId: string): FunctionControllerDef | undefined =>
  PROVIDERS.find((d) => d.type_id === providerTypeId)?.functions.find((d) => d.type_id === functionTypeId);

// Schemas are plain JSON Schema once TypeBox's symbols are dropped.
const json = (schema: TObject) => JSON.parse(JSON.stringify(schema)) as Record<string, unknown>;

export function describeFunction(f: FunctionControllerDef): FunctionController {
  return { type_id: f.type_id, name: f.name, documentation: f.documentation, categories: f.categories, parameters: json(f.parameters), output: json(f.output) };
}

export function describeCredential(c: CredentialControllerDef): CredentialController {
  return {
    type_id: c.type_id, name: c.name, documentation: c.documentation, requires_brokering: c.requires_brokering,
    requires_resource_server_credential_refreshing: c.requires_resource_server_credential_refreshing,
    requires_user_credential_refreshing: c.requires_user_credential_refreshing,
    configuration_schema: { resource_server: json(c.resourceServer), user_credential: c.userCredential ? json(c.userCredential) : {} },
  };
}

export function describeProvider(p: ProviderControllerDef): ProviderController {
  return {
    type_id: p.type_id, name: p.name, documentation: p.documentation, categories: p.categories,
    credential_controllers: p.credentialControllers.map(describeCredential), functions: p.functions.map(describeFunction),
  };
}

export interface DescribedInstance { row: FunctionInstanceRow; f: FunctionController }

// Instances a warning names, of those left out.
const LEFT_OUT_NAMED = 5;

// The instances of `batches` with their functions, batch by batch, for the documents that describe
// every instance (`what`). One whose provider or function the catalog no longer has is left out
// rather than failing the document part-way, and once the batches end one warning says how many were,
// naming the first few.
export async function* describedInstances(batches: AsyncIterable<FunctionInstanceRow[]>, log: Logger, what: string): AsyncGenerator<DescribedInstance[]> {
  const functions = new Map<string, FunctionController>(); // described once each: as many as the catalog has
  let leftOut = 0;
  const named: Pick<FunctionInstanceRow, 'provider_instance_id' | 'provider_controller_type_id' | 'function_controller_type_id'>[] = [];
  for await (const rows of batches) {
    const described: DescribedInstance[] = [];
    for (const row of rows) {
      const pair = `${row.provider_controller_type_id}\0${row.function_controller_type_id}`; // no text in Postgres holds \0
      let f = functions.get(pair);
      if (!f) {
        const def = storedFunctionDef(row.provider_controller_type_id, row.function_controller_type_id);
        if (def) functions.set(pair, (f = describeFunction(def)));
      }
      if (f) {
        described.push({ row, f });
      } else if (leftOut++ < LEFT_OUT_NAMED) {
        const { provider_instance_id, provider_controller_type_id, function_controller_type_id } = row;
        named.push({ provider_instance_id, provider_controller_type_id, function_controller_type_id });
      }
    }
    yield described;
  }
  if (leftOut) log.warn({ left_out: leftOut, first: named }, `${what}: ${leftOut} function instance(s) left out: their provider or function is not in this release's catalog`);
}

// The catalog, paged in type_id order.
export function listProviders(pageSize: number, token?: string): Page<ProviderController> {
  const page = listPage('providers', PROVIDERS, (p) => p.type_id, pageSize, token);
  return { ...page, items: page.items.map(describeProvider) };
}

const compiled = new WeakMap<TObject, ValidateFunction>();

// Rejects a value that does not match `schema`, naming each offending member under `where`.
export function checkAgainst(schema: TObject, value: unknown, where: string): void {
  let validate = compiled.get(schema);
  if (!validate) compiled.set(schema, (validate = compileSchema(json(schema))));
  checkValid(validate, value, where);
}

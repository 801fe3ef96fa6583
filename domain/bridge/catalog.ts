// The built-in provider controllers, how they are served (GET /available-providers) and how
// credential values and function params are checked against their schemas.
import type { ValidateFunction } from 'ajv';
import type { TObject } from '@sinclair/typebox';
import { NotFound } from '../errors.ts';
import { listPage, type Page } from '../../db/pagination.ts';
import { checkValid, compileSchema } from '../schema-check.ts';
import type { CredentialController, FunctionController, ProviderController } from '../shapes/bridge.ts';
import type { CredentialControllerDef, FunctionControllerDef, ProviderControllerDef } from './types.ts';
import type { CatalogPairs, FunctionInstanceRow } from '../../db/bridge.ts';
import type { Logger } from '../logger.ts';
import { googleMail } from './providers/google-mail.ts';
import { stripe } from './providers/stripe.ts';

export const PROVIDERS: ProviderControllerDef[] = [googleMail, stripe];

// The controllers stored rows name, or undefined where this release's catalog no longer has them (a
// release that removed a provider, credential controller or function).
export const storedProviderDef = (typeId: string): ProviderControllerDef | undefined => PROVIDERS.find((d) => d.type_id === typeId);
export const storedFunctionDef = (providerTypeId: string, functionTypeId: string): FunctionControllerDef | undefined =>
  storedProviderDef(providerTypeId)?.functions.find((d) => d.type_id === functionTypeId);
export const storedCredentialDef = (providerTypeId: string, credentialTypeId: string): CredentialControllerDef | undefined =>
  storedProviderDef(providerTypeId)?.credentialControllers.find((d) => d.type_id === credentialTypeId);

// What the catalog has, as the type id pairs stored rows name (db/bridge.ts listRunnableFunctionInstances).
export const CATALOG_PAIRS: CatalogPairs = {
  functions: PROVIDERS.flatMap((p) => p.functions.map((f): [string, string] => [p.type_id, f.type_id])),
  credentials: PROVIDERS.flatMap((p) => p.credentialControllers.map((c): [string, string] => [p.type_id, c.type_id])),
};

export function providerDef(typeId: string): ProviderControllerDef {
  const p = storedProviderDef(typeId);
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

// What a stored provider instance shows for a controller the catalog no longer has: the response
// requires one, and leaving the instance out would hide it from the lists it can be disabled or
// deleted from. Marked `retired`; it offers nothing (no functions, credential controllers or
// configuration) and claims no brokering or refreshing, which the instance cannot have any more.
const RETIRED_DOCUMENTATION = 'Not in this release\'s catalog (a release removed it): an instance that names it can be read, disabled and deleted, not used.';
const retired = (typeId: string) => ({ type_id: typeId, name: typeId, documentation: RETIRED_DOCUMENTATION, retired: true as const });

export function describeStoredProvider(typeId: string): ProviderController {
  const p = storedProviderDef(typeId);
  return p ? describeProvider(p) : { ...retired(typeId), categories: [], credential_controllers: [], functions: [] };
}

export function describeStoredCredential(providerTypeId: string, typeId: string): CredentialController {
  const c = storedCredentialDef(providerTypeId, typeId);
  return c ? describeCredential(c) : {
    ...retired(typeId), requires_brokering: false, requires_resource_server_credential_refreshing: false, requires_user_credential_refreshing: false,
    configuration_schema: { resource_server: {}, user_credential: {} },
  };
}

export interface DescribedInstance { row: FunctionInstanceRow; f: FunctionController }

// Instances a warning names, of those left out.
const LEFT_OUT_NAMED = 5;

// Describes stored function instances with their functions for one answer (`what`), batch by batch.
// One whose provider or function the catalog no longer has is left out rather than failing the answer,
// and `done` logs one warning saying how many were, naming the first few.
function instanceDescriber(log: Logger, what: string) {
  const functions = new Map<string, FunctionController>(); // described once each: as many as the catalog has
  let leftOut = 0;
  const named: Pick<FunctionInstanceRow, 'provider_instance_id' | 'provider_controller_type_id' | 'function_controller_type_id'>[] = [];
  return {
    describe(rows: FunctionInstanceRow[]): DescribedInstance[] {
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
      return described;
    },
    done(): void {
      if (leftOut) log.warn({ left_out: leftOut, first: named }, `${what}: ${leftOut} function instance(s) left out: their provider or function is not in this release's catalog`);
    },
  };
}

// The documents that describe every instance, batch by batch.
export async function* describedInstances(batches: AsyncIterable<FunctionInstanceRow[]>, log: Logger, what: string): AsyncGenerator<DescribedInstance[]> {
  const describer = instanceDescriber(log, what);
  for await (const rows of batches) yield describer.describe(rows);
  describer.done();
}

// The lists: the instances of one page (or of one provider instance's details). So a page may hold
// fewer than its size, even none; its token, of the rows read, still leads past those left out.
export function describedPage(rows: FunctionInstanceRow[], log: Logger, what: string): DescribedInstance[] {
  const describer = instanceDescriber(log, what);
  const described = describer.describe(rows);
  describer.done();
  return described;
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

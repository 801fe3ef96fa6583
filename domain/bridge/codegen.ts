// POST /_internal/v1/trigger_codegen: a typed TypeScript client for the enabled function instances,
// generated from their parameter and output schemas. Files are returned, not written: the caller
// decides where they live. The client needs only `fetch` (Node 18+, browsers, Deno, Bun).
//
// Function instances have no bound in number, so the client is written as it is read, a batch of
// instances at a time, as JSON text at the client's pace: what the API holds is a batch (and the
// function types, as many as the catalog has), however many instances there are.
import type { Readable } from 'node:stream';
import type { Knex } from 'knex';
import {
  FUNCTION_INSTANCE_BATCH, functionInstanceBatches, functionInstancesAfter, functionInstancesNamedAlike, functionTypesInUse,
  type FunctionInstanceRow, type FunctionTypeInUse,
} from '../../db/bridge.ts';
import { holdSnapshot, type HeldSnapshot } from '../../db/snapshot.ts';
import type { FunctionController } from '../shapes/bridge.ts';
import { describedInstances, describeFunction, storedFunctionDef, type DescribedInstance } from './catalog.ts';
import { SERVICE_VERSION } from '../version.ts';
import { IDEMPOTENCY_KEY_RULES } from '../shapes/common.ts';
import type { Logger } from '../logger.ts';
import { inString, opened, separated, snapshotStreams } from '../json-stream.ts';

type Schema = Record<string, unknown>;

const pascal = (s: string) => s.split(/[^A-Za-z0-9]+/).filter(Boolean).map((w) => w[0].toUpperCase() + w.slice(1)).join('');
const camel = (s: string) => { const p = pascal(s); return p ? p[0].toLowerCase() + p.slice(1) : p; };
const doc = (text: unknown, indent: string) => (typeof text === 'string' && text ? `${indent}/** ${text.replace(/\*\//g, '* /').replace(/\s*\n\s*/g, ' ')} */\n` : '');
const key = (k: string) => (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(k) ? k : JSON.stringify(k));

// The TypeScript type of a JSON Schema, for the shapes function controllers use.
export function tsType(schema: Schema, indent = ''): string {
  if ('const' in schema) return JSON.stringify(schema.const);
  if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join(' | ');
  for (const union of ['anyOf', 'oneOf'] as const) {
    if (!Array.isArray(schema[union])) continue;
    // Variants of an object that only add constraints (e.g. which member is required) are that
    // object with each variant's constraints.
    const { [union]: variants, ...base } = schema;
    const merged = (variants as Schema[]).map((v) => (base.type || base.properties
      ? { ...base, ...v, required: [...((base.required ?? []) as string[]), ...((v.required ?? []) as string[])] }
      : v));
    return merged.map((v) => tsType(v, indent)).join(' | ');
  }
  if (Array.isArray(schema.allOf)) return (schema.allOf as Schema[]).map((s) => tsType(s, indent)).join(' & ');
  if (Array.isArray(schema.type)) return (schema.type as string[]).map((t) => tsType({ ...schema, type: t }, indent)).join(' | ');
  switch (schema.type) {
    case 'string': return 'string';
    case 'number': case 'integer': return 'number';
    case 'boolean': return 'boolean';
    case 'null': return 'null';
    case 'array': {
      const item = schema.items && typeof schema.items === 'object' ? tsType(schema.items as Schema, indent) : 'unknown';
      return /[|&]/.test(item) ? `(${item})[]` : `${item}[]`;
    }
    case 'object': {
      const props = (schema.properties ?? {}) as Record<string, Schema>;
      const required = new Set((schema.required ?? []) as string[]);
      const inner = `${indent}  `;
      const lines = Object.entries(props).map(([k, s]) => `${doc(s.description, inner)}${inner}${key(k)}${required.has(k) ? '' : '?'}: ${tsType(s, inner)};\n`);
      if (schema.additionalProperties !== false && !lines.length) return 'Record<string, unknown>';
      if (schema.additionalProperties !== false) lines.push(`${inner}[key: string]: unknown;\n`);
      return `{\n${lines.join('')}${indent}}`;
    }
    default: return 'unknown';
  }
}

const RUNTIME = `/** A function ran: its output, or the provider's refusal in its own words. */
export type InvokeResult<T> = ({ type: 'success' } & T) | { type: 'error'; message: string };

/** The service refused the call (4xx) or could not reach the provider (502): its Error body. */
export class BridgeError extends Error {
  constructor(readonly status: number, message: string, readonly body: unknown) {
    super(message);
  }
}

/** Options of one call. */
export interface InvokeOptions {
  /**
   * Sent to a provider that honours one as its Idempotency-Key (Google Mail has none and ignores it):
   * Stripe answers a call repeated with the same key (for 24 hours) with the first call's answer
   * instead of refunding again, so give one to a call you may retry after a 502 or a hang-up.
   * ${IDEMPOTENCY_KEY_RULES}.
   */
  idempotencyKey?: string;
}

export interface BridgeClientOptions {
  /** The service's base URL, e.g. https://taskbridge.example.com */
  baseUrl: string;
  /** An API key with the bridge:invoke scope. */
  apiKey: string;
  fetch?: typeof fetch;
}

export class BridgeClientBase {
  private readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly fetchImpl: typeof fetch;

  constructor(options: BridgeClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\\/+$/, '');
    this.apiKey = options.apiKey;
    this.fetchImpl = options.fetch ?? fetch;
  }

  protected async invoke<T>(providerInstanceId: string, functionId: string, params: unknown, options: InvokeOptions = {}): Promise<InvokeResult<T>> {
    const url = \`\${this.baseUrl}/api/bridge/v1/provider/\${encodeURIComponent(providerInstanceId)}/function/\${functionId}/invoke\`;
    const res = await this.fetchImpl(url, {
      method: 'POST',
      headers: { authorization: \`Bearer \${this.apiKey}\`, 'content-type': 'application/json' },
      body: JSON.stringify({ params, idempotency_key: options.idempotencyKey }),
    });
    const body = await res.json().catch(() => undefined);
    if (res.status !== 200) throw new BridgeError(res.status, (body as { message?: string } | undefined)?.message ?? \`HTTP \${res.status}\`, body);
    return body as InvokeResult<T>;
  }
}
`;

const WHAT = 'generated client';

// Generated clients this process writes at once: each holds a database connection for as long as
// whoever asked for it takes to read it.
const clients = snapshotStreams(WHAT);
const CLIENTS_AT_ONCE = { most: 2 };

// Read first, in the snapshot the instances are then read from, so that all agree: the function types
// in use with their number of instances (the types file, index.ts's imports and the message come
// before the methods), the instances whose method names may clash, and the first batch.
interface ClientReads { types: FunctionTypeInUse[]; alike: Set<string>; first: FunctionInstanceRow[] }

const instanceKey = (r: Pick<FunctionInstanceRow, 'provider_instance_id' | 'function_controller_type_id'>) =>
  `${r.provider_instance_id}\0${r.function_controller_type_id}`; // no text in Postgres holds \0

// The answer {message, files} as JSON text, as JSON.stringify would write it whole: index.ts, last,
// is written method by method inside its JSON string.
async function* clientText({ trx, first: { types, alike, first } }: HeldSnapshot<ClientReads>, log: Logger): AsyncGenerator<string> {
  const inUse = types.flatMap((t) => {
    const def = storedFunctionDef(t.provider_controller_type_id, t.function_controller_type_id);
    return def ? [{ f: describeFunction(def), instances: t.instances }] : [];
  });
  const typed = new Map<string, FunctionController>(); // by type name, in the order of its first instance
  for (const { f } of inUse) if (!typed.has(pascal(f.type_id))) typed.set(pascal(f.type_id), f);
  const header = `// Generated by taskbridge ${SERVICE_VERSION} (POST /_internal/v1/trigger_codegen) for the function instances enabled at generation time. Do not edit: generate again.\n`;
  const typesText = [...typed].flatMap(([base, f]) => [
    `${doc(`${f.name}: parameters.`, '')}export type ${base}Params = ${tsType(f.parameters as Schema)};\n`,
    `${doc(`${f.name}: output.`, '')}export type ${base}Output = ${tsType(f.output as Schema)};\n`,
  ]).join('\n');
  const indexHead = `${header}\nimport { BridgeClientBase${typed.size ? ', type InvokeOptions, type InvokeResult' : ''} } from './runtime.js';\n`
    + (typed.size ? `import type { ${[...typed.keys()].flatMap((t) => [`${t}Params`, `${t}Output`]).join(', ')} } from './types.js';\n` : '')
    + `\nexport * from './runtime.js';\nexport type * from './types.js';\n\n`
    + '/** One method per enabled function instance. */\nexport class BridgeClient extends BridgeClientBase {\n';

  // Method names taken, of the instances named alike: no other instance's name can be one of them, so
  // what is remembered is those few, not a name per instance.
  const names = new Set<string>();
  const method = ({ row, f }: DescribedInstance) => {
    const base = pascal(f.type_id);
    // Instance ids are unique, function ids unique per instance: their pair names a method (one
    // named like an earlier one, in key order, takes a '_' more).
    let name = camel(`${row.provider_instance_id} ${f.type_id}`);
    if (!/^[A-Za-z_$]/.test(name)) name = `_${name}`;
    if (alike.has(instanceKey(row))) {
      while (names.has(name)) name = `${name}_`;
      names.add(name);
    }
    return `${doc(`${f.name} on ${row.provider_instance_id} (${row.provider_controller_type_id}). ${f.documentation}`, '  ')}`
      + `  ${name}(params: ${base}Params, options?: InvokeOptions): Promise<InvokeResult<${base}Output>> {\n`
      + `    return this.invoke(${JSON.stringify(row.provider_instance_id)}, ${JSON.stringify(f.type_id)}, params, options);\n  }\n`;
  };

  const message = `Generated a TypeScript client for ${inUse.reduce((n, t) => n + t.instances, 0)} function instance(s)`;
  const whole = [{ path: 'bridge-client/types.ts', content: `${header}\n${typesText}` }, { path: 'bridge-client/runtime.ts', content: `${header}\n${RUNTIME}` }];
  yield `${opened({ message })},"files":[${whole.map((f) => JSON.stringify(f)).join(',')},${opened({ path: 'bridge-client/index.ts' })},"content":"${inString(indexHead)}`;
  yield* separated(describedInstances(functionInstanceBatches(trx, first), log, WHAT), (instances) => instances.map(method), inString, inString('\n'));
  yield `${inString('}\n')}"}]}`;
}

// The client as a JSON stream, once its snapshot has begun and its first reads are done (a database
// out of reach fails here, before anything is answered). The snapshot ends when the stream closes.
export function generateBridgeClient(db: Knex, log: Logger): Promise<Readable> {
  return clients(CLIENTS_AT_ONCE, () => holdSnapshot(db, async (trx): Promise<ClientReads> => ({
    types: await functionTypesInUse(trx),
    alike: new Set((await functionInstancesNamedAlike(trx)).map(instanceKey)),
    first: await functionInstancesAfter(trx, undefined, FUNCTION_INSTANCE_BATCH),
  })), (held) => clientText(held, log), log);
}

// POST /_internal/v1/trigger_codegen: a typed TypeScript client for the enabled function instances,
// generated from their parameter and output schemas. Files are returned, not written: the caller
// decides where they live. The client needs only `fetch` (Node 18+, browsers, Deno, Bun).
import type { Knex } from 'knex';
import { allFunctionInstances } from '../../db/bridge.ts';
import { describeFunction, functionDef, providerDef } from './catalog.ts';
import { SERVICE_VERSION } from '../version.ts';

type Schema = Record<string, unknown>;
export interface GeneratedFile { path: string; content: string }

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

  protected async invoke<T>(providerInstanceId: string, functionId: string, params: unknown): Promise<InvokeResult<T>> {
    const url = \`\${this.baseUrl}/api/bridge/v1/provider/\${encodeURIComponent(providerInstanceId)}/function/\${functionId}/invoke\`;
    const res = await this.fetchImpl(url, {
      method: 'POST',
      headers: { authorization: \`Bearer \${this.apiKey}\`, 'content-type': 'application/json' },
      body: JSON.stringify({ params }),
    });
    const body = await res.json().catch(() => undefined);
    if (res.status !== 200) throw new BridgeError(res.status, (body as { message?: string } | undefined)?.message ?? \`HTTP \${res.status}\`, body);
    return body as InvokeResult<T>;
  }
}
`;

export async function generateBridgeClient(db: Knex): Promise<{ message: string; files: GeneratedFile[] }> {
  const instances = await allFunctionInstances(db);
  const types: string[] = [];
  const methods: string[] = [];
  const typed = new Set<string>();
  const names = new Set<string>();
  for (const row of instances) {
    const f = describeFunction(functionDef(providerDef(row.provider_controller_type_id), row.function_controller_type_id));
    const base = pascal(f.type_id);
    if (!typed.has(base)) {
      typed.add(base);
      types.push(`${doc(`${f.name}: parameters.`, '')}export type ${base}Params = ${tsType(f.parameters as Schema)};\n`);
      types.push(`${doc(`${f.name}: output.`, '')}export type ${base}Output = ${tsType(f.output as Schema)};\n`);
    }
    // Instance ids are unique, function ids unique per instance: their pair names a method.
    let method = camel(`${row.provider_instance_id} ${f.type_id}`);
    if (!/^[A-Za-z_$]/.test(method)) method = `_${method}`;
    while (names.has(method)) method = `${method}_`;
    names.add(method);
    methods.push(`${doc(`${f.name} on ${row.provider_instance_id} (${row.provider_controller_type_id}). ${f.documentation}`, '  ')}`
      + `  ${method}(params: ${base}Params): Promise<InvokeResult<${base}Output>> {\n`
      + `    return this.invoke(${JSON.stringify(row.provider_instance_id)}, ${JSON.stringify(f.type_id)}, params);\n  }\n`);
  }
  const header = `// Generated by taskbridge ${SERVICE_VERSION} (POST /_internal/v1/trigger_codegen) for the function instances enabled at generation time. Do not edit: generate again.\n`;
  const files: GeneratedFile[] = [
    { path: 'bridge-client/types.ts', content: `${header}\n${types.join('\n')}` },
    { path: 'bridge-client/runtime.ts', content: `${header}\n${RUNTIME}` },
    {
      path: 'bridge-client/index.ts',
      content: `${header}\nimport { BridgeClientBase${typed.size ? ', type InvokeResult' : ''} } from './runtime.js';\n`
        + (typed.size ? `import type { ${[...typed].flatMap((t) => [`${t}Params`, `${t}Output`]).join(', ')} } from './types.js';\n` : '')
        + `\nexport * from './runtime.js';\nexport type * from './types.js';\n\n`
        + `/** One method per enabled function instance. */\nexport class BridgeClient extends BridgeClientBase {\n${methods.join('\n')}}\n`,
    },
  ];
  return { message: `Generated a TypeScript client for ${instances.length} function instance(s)`, files };
}

// How a value that fails its JSON Schema is refused: one InvalidRequest naming each offending
// member once (request bodies, path and query parameters, credential values, function params).
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import { InvalidRequest, type FieldError } from './errors.ts';
import { BASE64_PATTERN } from '../api/schemas/common.ts';

// The one compiler of what is checked as sent (request bodies, A2A params, provider function
// params, agent output): all errors, discriminated unions, formats; no coercion.
const ajv = addFormats.default(new Ajv({ allErrors: true, discriminator: true, strict: false }));
export const compileSchema = (schema: object): ValidateFunction => ajv.compile(schema);

// ajv words a failed pattern as the regular expression itself; the ones clients meet get words.
const PATTERN_WORDS: Record<string, string> = { [BASE64_PATTERN]: 'must be base64 (standard alphabet, padded with =)' };
export const errorText = (e: ErrorObject): string =>
  (e.keyword === 'pattern' ? PATTERN_WORDS[(e.params as { pattern: string }).pattern] : undefined) ?? e.message ?? 'is invalid';

function describe(e: ErrorObject): FieldError & { key: string } {
  const base = e.instancePath.split('/').slice(1).join('.');
  const join = (p: string) => (base ? `${base}.${p}` : p);
  switch (e.keyword) {
    case 'required': {
      const p = join((e.params as { missingProperty: string }).missingProperty);
      return { key: p, path: p, message: 'is required' };
    }
    case 'additionalProperties': {
      const p = join((e.params as { additionalProperty: string }).additionalProperty);
      return { key: p, path: p, message: 'is not an allowed member' };
    }
    case 'discriminator':
      return { key: join('type'), path: join('type'), message: 'must be one of text-part, data-part, file-part' };
    default:
      return { key: `${base}:${e.keyword}`, path: base, message: errorText(e) };
  }
}

export function checkValid(validate: ValidateFunction, value: unknown, where: string): void {
  if (validate(value)) return;
  const seen = new Set<string>();
  const errors: FieldError[] = [];
  for (const e of validate.errors ?? []) {
    const d = describe(e);
    if (seen.has(d.key)) continue;
    seen.add(d.key);
    const path = d.path ? `${where}.${d.path}` : where;
    errors.push({ path, message: d.message });
  }
  const first = errors[0];
  throw new InvalidRequest(`Invalid ${where}: ${first.path} ${first.message}`, errors);
}

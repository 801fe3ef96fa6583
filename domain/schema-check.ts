// How a value that fails its JSON Schema is refused: one InvalidRequest naming each offending
// member once, in words (request bodies, path and query parameters, credential values, function params).
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import { InvalidRequest, memberPath, type FieldError } from './errors.ts';

// The one compiler of what is checked as sent (request bodies, A2A params, provider function
// params, agent output): all errors, discriminated unions, formats; no coercion.
// verbose: an error carries its keyword's schema (requiredChoice reads a oneOf's branches).
const ajv = addFormats.default(new Ajv({ allErrors: true, discriminator: true, strict: false, verbose: true }));
// An http(s) URL that WHATWG URL (fetch, Koa's redirect) parses as written: a pattern took
// 'https://[host/x', which the OAuth callback could then not redirect to, and URL drops tabs and
// newlines inside a URL, so control characters are refused before it reads one.
export const isHttpUrl = (v: string) => /^https?:\/\//i.test(v) && !/[\u0000-\u0020\u007f]/.test(v) && URL.canParse(v);
ajv.addFormat('http-url', { type: 'string', validate: isHttpUrl });
// A time zone as the runtime's Intl knows it (IANA names, UTC), which cron-parser reads a job scheduler's tz with.
const isTimeZone = (v: string) => { try { new Intl.DateTimeFormat('en-US', { timeZone: v }); return true; } catch { return false; } };
ajv.addFormat('time-zone', { type: 'string', validate: isTimeZone });
export const compileSchema = (schema: object): ValidateFunction => ajv.compile(schema);

// ajv words a failed pattern as the regular expression itself: a schema names its pattern's words
// here where it defines the pattern (`pattern: worded(PATTERN, 'must be ...')`).
const PATTERN_WORDS = new Map<string, string>();
export function worded(pattern: string, words: string): string {
  PATTERN_WORDS.set(pattern, words);
  return pattern;
}
const oneOf = (values: readonly unknown[]) => `must be one of ${values.map(String).join(', ')}`;
const FORMAT_WORDS: Record<string, string> = { uuid: 'must be a UUID', 'date-time': 'must be an RFC 3339 date-time', uri: 'must be a URI', 'http-url': 'must be an http(s) URL', 'time-zone': 'must be a time zone name such as Europe/Warsaw or UTC' };

export function errorText(e: ErrorObject): string {
  if (e.keyword === 'pattern') return PATTERN_WORDS.get((e.params as { pattern: string }).pattern) ?? e.message ?? 'is invalid';
  if (e.keyword === 'format') return FORMAT_WORDS[(e.params as { format: string }).format] ?? e.message ?? 'is invalid';
  // A choice of types (['boolean', 'object']) is in ajv's words "must be boolean,object".
  if (e.keyword === 'type') return `must be ${[(e.params as { type: string | string[] }).type].flat().join(' or ')}`;
  if (e.keyword === 'enum') return oneOf((e.params as { allowedValues: unknown[] }).allowedValues);
  // ajv says only "must be equal to constant": name the one value taken.
  if (e.keyword === 'const') return `must be ${JSON.stringify((e.params as { allowedValue: unknown }).allowedValue)}`;
  return e.message ?? 'is invalid';
}

// A choice of constants (a union of literals) fails as "must be string" and "must be equal to
// constant" for each choice plus "must match a schema in anyOf": said instead as the choices, once.
// Keyed by the anyOf's schema path.
function constantChoices(errors: readonly ErrorObject[]): Map<string, unknown[]> {
  const byAnyOf = new Map<string, ErrorObject[]>();
  for (const e of errors) {
    const anyOf = branchOf(e);
    if (anyOf) byAnyOf.set(anyOf, [...(byAnyOf.get(anyOf) ?? []), e]);
  }
  const choices = new Map<string, unknown[]>();
  for (const [anyOf, es] of byAnyOf) {
    const consts = es.filter((e) => e.keyword === 'const');
    // Every failed branch a constant: an object branch failing on its type alone is not one.
    const branches = new Set(es.map((e) => e.schemaPath.split('/').at(-2)));
    if (consts.length === branches.size && es.every((e) => ['const', 'type'].includes(e.keyword))) choices.set(anyOf, consts.map((e) => (e.params as { allowedValue: unknown }).allowedValue));
  }
  return choices;
}
// The anyOf whose branch failed on its own keyword (`.../anyOf/<n>/<keyword>`), if any.
const branchOf = (e: ErrorObject) => /^(.*\/anyOf)\/\d+\/[^/]+$/.exec(e.schemaPath)?.[1];

// A oneOf whose branches each require one member ("bytes or uri"): the members, else undefined.
// ajv reports it as each branch's "is required" plus "must match exactly one schema in oneOf",
// which named one alternative as if it were the only one; it is worded as the choice instead.
function requiredChoice(e: ErrorObject): string[] | undefined {
  if (e.keyword !== 'oneOf' || !Array.isArray(e.schema)) return undefined;
  const branches = e.schema as { required?: unknown }[];
  const single = (b: { required?: unknown }) => Object.keys(b).length === 1 && Array.isArray(b.required) && b.required.length === 1;
  return branches.every(single) ? branches.map((b) => String((b.required as unknown[])[0])) : undefined;
}
/** How a oneOf of required members is worded, else undefined (see requiredChoice). */
export function choiceText(e: ErrorObject): string | undefined {
  const members = requiredChoice(e);
  return members && `must have exactly one of ${members.join(' or ')}`;
}
/** The errors less the branches' own "is required" of each choice of members, which choiceText says once. */
export function withoutChoiceBranches(reported: readonly ErrorObject[]): ErrorObject[] {
  const choiceOf = reported.filter((e) => requiredChoice(e)).map((e) => `${e.instancePath} ${e.schemaPath}/`);
  return reported.filter((e) => !(e.keyword === 'required' && choiceOf.some((c) => `${e.instancePath} ${e.schemaPath}`.startsWith(c))));
}

// A nullable value (anyOf [X, null]) fails as X's errors, "must be null" and "must match a schema
// in anyOf": said as X's errors with "or null", once.
const isNullable = (e: ErrorObject) => e.keyword === 'anyOf' && Array.isArray(e.schema) && e.schema.length === 2
  && (e.schema as { type?: unknown }[]).some((b) => b.type === 'null');

// The member names of a JSON Pointer (ajv's instancePath), unescaped.
export const pointerNames = (instancePath: string): string[] => instancePath.split('/').slice(1).map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'));
const valueAt = (value: unknown, instancePath: string): unknown =>
  pointerNames(instancePath).reduce<unknown>((v, k) => (v && typeof v === 'object' ? (v as Record<string, unknown>)[k] : undefined), value);

function describe(e: ErrorObject, value: unknown, where: string, choices: Map<string, unknown[]>, orNull: Set<ErrorObject>): (FieldError & { key: string }) | undefined {
  const d = describeOne(e, value, where, choices);
  return d && orNull.has(e) ? { ...d, message: `${d.message} or null` } : d;
}

function describeOne(e: ErrorObject, value: unknown, where: string, choices: Map<string, unknown[]>): (FieldError & { key: string }) | undefined {
  const base = pointerNames(e.instancePath).reduce(memberPath, where);
  const join = (name: string) => memberPath(base, name);
  // Koa reads a query parameter given twice as a list of its values.
  const twice = where === 'query' && Array.isArray(valueAt(value, e.instancePath));
  if (twice && ['type', 'anyOf', 'const'].includes(e.keyword)) return { key: `${base}:twice`, path: base, message: 'must be given once' };
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
    case 'oneOf': {
      const choice = choiceText(e);
      if (choice) return { key: `${base}:oneOf`, path: base, message: choice };
      break;
    }
    case 'anyOf': {
      const allowed = choices.get(e.schemaPath);
      if (allowed) return { key: `${base}:choice`, path: base, message: oneOf(allowed) };
      break;
    }
    case 'pattern':
    case 'format':
      // A UUID is checked by both: said once.
      return { key: `${base}:shape`, path: base, message: errorText(e) };
  }
  const anyOf = branchOf(e);
  if (anyOf && choices.has(anyOf)) return undefined;
  return { key: `${base}:${e.keyword}`, path: base, message: errorText(e) };
}

// A body of 95,000 unknown members failed as 95,000 errors: 0.4 s of wording them, during which
// the process served nothing else, and a 6 MB answer. The first are enough to mend a request by.
const MAX_WORDED = 1000;
export const MAX_FIELD_ERRORS = 100;

// The first MAX_WORDED errors, and the rest of the union whose branch is the last of them, so that
// a union cut short is not worded as one of its branches.
function firstErrors(reported: readonly ErrorObject[]): readonly ErrorObject[] {
  let end = MAX_WORDED;
  if (reported.length <= end) return reported;
  while (end < reported.length && branchOf(reported[end])) end++;
  if (end < reported.length && ['anyOf', 'oneOf'].includes(reported[end].keyword)) end++;
  return reported.slice(0, end);
}

/** What is wrong with `value` (none when it is valid), each offending member once, in words. */
export function fieldErrors(validate: ValidateFunction, value: unknown, where: string): FieldError[] {
  if (validate(value)) return [];
  const reported = firstErrors(validate.errors ?? []);
  let more = reported.length < validate.errors!.length;
  const nullables = reported.filter(isNullable);
  // An error of a nullable's own value (not of a member inside it), in one of its branches.
  const inNullable = (e: ErrorObject) => nullables.some((n) => e.instancePath === n.instancePath && e.schemaPath.startsWith(`${n.schemaPath}/`));
  const nullBranch = (e: ErrorObject) => e.keyword === 'type' && (e.params as { type: string }).type === 'null' && inNullable(e);
  const all = withoutChoiceBranches(reported).filter((e) => !nullables.includes(e) && !nullBranch(e));
  const orNull = new Set(all.filter(inNullable));
  const choices = constantChoices(all);
  const seen = new Set<string>();
  const errors: FieldError[] = [];
  for (const e of all) {
    const d = describe(e, value, where, choices, orNull);
    if (!d || seen.has(d.key)) continue;
    seen.add(d.key);
    if (errors.length === MAX_FIELD_ERRORS) {
      more = true;
      break;
    }
    errors.push({ path: d.path, message: d.message });
  }
  if (more) errors.push({ path: where, message: `has more errors than the ${errors.length} listed` });
  return errors;
}

export function checkValid(validate: ValidateFunction, value: unknown, where: string): void {
  const errors = fieldErrors(validate, value, where);
  if (!errors.length) return;
  const first = errors[0];
  throw new InvalidRequest(`Invalid ${where}: ${first.path} ${first.message}`, errors);
}

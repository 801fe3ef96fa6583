// JSON that parses may still be unusable here: NUL characters and unpaired surrogates are valid JSON
// that Postgres refuses to store (text and jsonb), and very deep nesting overflows the stack of
// JSON.stringify (a response, a job, a statement parameter): each would end as a 500. Numbers past
// the double range (1e999) parse as Infinity, which JSON.stringify writes as null.
import { isDeepStrictEqual } from 'node:util';
import { memberPath, type FieldError } from './errors.ts';

/**
 * Whether two JSON values are equal as Postgres gives them back: jsonb keeps no key order, no
 * undefined members and no -0 (a client's -0 reads back as 0, which isDeepStrictEqual tells apart).
 */
export const sameAsStored = (a: unknown, b: unknown): boolean =>
  isDeepStrictEqual(JSON.parse(JSON.stringify(a) ?? 'null'), JSON.parse(JSON.stringify(b) ?? 'null'));

export const MAX_JSON_DEPTH = 64;
// Values (objects, arrays, strings, numbers...) one document may hold. Parsed, each costs tens of
// bytes whatever its size in the text ('{},' is 3 bytes, the object 30 to 60): a 1 MiB body of them
// held 20 MiB of heap in every run, notification and read that loaded it.
export const MAX_JSON_VALUES = 100_000;
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** `text` as Postgres stores it: each NUL character and unpaired surrogate replaced by U+FFFD. */
export function storableText(text: string): string {
  return text.replace(new RegExp(UNSTORABLE.source, 'g'), '\ufffd');
}

/**
 * The first member of `value` (named from `root`) that could not be stored, or `root` when it holds
 * more than MAX_JSON_VALUES values; with `depthOnly`, only nesting past MAX_JSON_DEPTH counts. List
 * items are named as the REST errors name them (`parts.0`), or with `brackets` as JSON-RPC clients
 * write them (`parts[0]`).
 */
export function findUnstorable(value: unknown, root = 'body', opts: { depthOnly?: boolean; brackets?: boolean } = {}): FieldError | undefined {
  const stack: [unknown, string, number][] = [[value, root, 0]];
  let values = 0;
  while (stack.length) {
    const [v, path, depth] = stack.pop()!;
    if (!opts.depthOnly && ++values > MAX_JSON_VALUES) return { path: root, message: `holds more than ${MAX_JSON_VALUES} JSON values` };
    if (typeof v === 'string') {
      if (!opts.depthOnly && UNSTORABLE.test(v)) return { path, message: 'contains a NUL character or an unpaired surrogate' };
    } else if (typeof v === 'number') {
      // One test per number on the common path: every request body goes through here.
      if (!opts.depthOnly && !Number.isFinite(v)) {
        return { path, message: Number.isNaN(v) ? 'is NaN, which JSON has not (it would be kept as null)' : 'is a number too large for JSON (it would be kept as null)' };
      }
    } else if (v !== null && typeof v === 'object') {
      if (depth >= MAX_JSON_DEPTH) return { path, message: `nests deeper than ${MAX_JSON_DEPTH} levels` };
      for (const [k, child] of Object.entries(v)) {
        if (!opts.depthOnly && UNSTORABLE.test(k)) return { path, message: 'has a member name with a NUL character or an unpaired surrogate' };
        stack.push([child, opts.brackets && Array.isArray(v) ? `${path}[${k}]` : memberPath(path, k), depth + 1]);
      }
    } else if (typeof v === 'bigint') {
      // Only values built in this process (an agent's) can hold one: JSON.stringify throws on it.
      if (!opts.depthOnly) return { path, message: 'is a BigInt, which JSON has not' };
    }
  }
  return undefined;
}

/**
 * What a JSON value weighs once parsed, near enough: its compact text and 32 bytes a value (see
 * MAX_JSON_VALUES). Writers store it beside messages and timeline items (migration 0025): the reads
 * that hand out a budget of them (a run's history, a notification's, a page, a task's A2A view) sum a
 * column. Weighed by Postgres at each read instead (jsonb_path_query over every value), a task of
 * 100,000-value messages cost a second of Postgres a message, in every run and read of it.
 */
export function parsedWeight(value: unknown): number {
  let weight = 0;
  const stack: unknown[] = [value];
  while (stack.length) {
    const v = stack.pop();
    weight += 33; // the value and its separator
    if (typeof v === 'string') weight += Buffer.byteLength(v) + 2;
    else if (typeof v === 'number') weight += String(v).length;
    else if (v !== null && typeof v === 'object') {
      weight += 2;
      if (Array.isArray(v)) for (const child of v) stack.push(child);
      else for (const [k, child] of Object.entries(v)) { weight += Buffer.byteLength(k) + 3; stack.push(child); }
    } else weight += 5;
  }
  return weight;
}

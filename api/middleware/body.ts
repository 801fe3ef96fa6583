import type { Context } from 'koa';
import { echoed, InvalidRequest, jsonErrorWithoutExcerpt, PayloadTooLarge, UnsupportedMediaType } from '../../domain/errors.ts';
import { findUnstorable } from '../../domain/storable-json.ts';

const JSON_TYPE = /^application\/([a-z0-9.+-]*\+)?json\s*(;|$)/i;
// A charset parameter, quoted or not. JSON is UTF-8, so a body declared in another charset would be
// read as other text than its sender meant (ISO-8859-1 bytes C3 A9 are 'Ã©', not 'é').
const CHARSET = /;\s*charset\s*=\s*(?:"([^"]*)"|([^;\s]*))/i;
const UTF8_NAMES = new Set(['utf-8', 'utf8']);
// JSON is UTF-8 (RFC 8259): other bytes are refused, not turned into U+FFFD.
const UTF8 = new TextDecoder('utf-8', { fatal: true });

const tooLarge = (limit: number) => new PayloadTooLarge(`Request body exceeds the limit of ${limit} bytes`, { limit });

// Reads and parses a JSON body; undefined when the request has none or an empty one, whatever its
// content type (fetch sends `content-length: 0` and `text/plain` for a POST with an empty body).
// It also refuses values that could not be stored (domain/storable-json.ts); the JSON-RPC endpoints
// read with readJsonRpcBody, which leaves that to them.
export async function readJsonBody(ctx: Context, limit: number): Promise<unknown> {
  return (await readJson(ctx, limit, true))?.value;
}

// The body's text as well as its value (undefined for no body).
async function readJson(ctx: Context, limit: number, checkStorable: boolean): Promise<{ value: unknown; text: string } | undefined> {
  const req = ctx.req;
  const length = req.headers['content-length'];
  if ((length === undefined && req.headers['transfer-encoding'] === undefined) || length === '0') return undefined;
  if (length !== undefined && Number(length) > limit) {
    req.resume();
    throw tooLarge(limit);
  }
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.trim().toLowerCase() !== 'identity') {
    req.resume();
    throw new UnsupportedMediaType(`Content-Encoding '${echoed(encoding)}' is not supported: send the body uncompressed`, { 'Accept-Encoding': 'identity' });
  }
  const sentType = req.headers['content-type'];
  const type = sentType ?? '';
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) {
      req.resume();
      throw tooLarge(limit);
    }
    chunks.push(chunk as Buffer);
  }
  if (size === 0) return undefined;
  if (!JSON_TYPE.test(type)) {
    const got = sentType === undefined ? '; the request has no Content-Type header' : !type ? '; the request\'s Content-Type header is empty' : `, got '${echoed(type)}'`;
    throw new UnsupportedMediaType(`Content-Type must be application/json${got}`);
  }
  const charset = CHARSET.exec(type);
  if (charset) {
    const name = charset[1] ?? charset[2];
    if (!UTF8_NAMES.has(name.toLowerCase())) throw new UnsupportedMediaType(`Content-Type charset must be utf-8 (JSON is UTF-8), got '${echoed(name)}'`);
  }
  let text: string;
  try {
    text = UTF8.decode(Buffer.concat(chunks));
  } catch {
    throw new InvalidRequest('Request body is not valid UTF-8', [{ path: 'body', message: 'is not valid UTF-8' }]);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new InvalidRequest(`Request body is not valid JSON: ${jsonErrorWithoutExcerpt((e as Error).message)}`, [{ path: 'body', message: 'is not valid JSON' }]);
  }
  const problem = checkStorable ? findUnstorable(value) : undefined;
  if (problem) throw new InvalidRequest(`Invalid body: ${problem.path} ${problem.message}`, [problem]);
  return { value, text };
}

// A JSON-RPC endpoint's body: unreadable JSON (or bytes) is the protocol's parse error, answered in
// the protocol, while a body too large or not JSON stays an HTTP error. Values that could not be
// stored are the caller's to refuse, in the protocol too. The text tells what the value cannot (an id
// JSON.parse rounded).
export type JsonRpcBody = { body: unknown; text: string } | { parseError: string } | { empty: true };

export async function readJsonRpcBody(ctx: Context, limit: number): Promise<JsonRpcBody> {
  try {
    const read = await readJson(ctx, limit, false);
    return read ? { body: read.value, text: read.text } : { empty: true };
  } catch (err) {
    if (!(err instanceof InvalidRequest)) throw err;
    return { parseError: err.message };
  }
}

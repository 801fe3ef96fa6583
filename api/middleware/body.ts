import type { Context } from 'koa';
import { AppError, InvalidRequest } from '../../domain/errors.ts';

const JSON_TYPE = /^application\/([a-z0-9.+-]*\+)?json\s*(;|$)/i;

// Reads and parses a JSON body; undefined when the request has none.
export async function readJsonBody(ctx: Context, limit: number): Promise<unknown> {
  const req = ctx.req;
  const length = req.headers['content-length'];
  if (length === undefined && req.headers['transfer-encoding'] === undefined) return undefined;
  if (length !== undefined && Number(length) > limit) {
    req.resume();
    throw new AppError(413, 'payload_too_large', `Request body exceeds the limit of ${limit} bytes`, { limit });
  }
  const type = req.headers['content-type'] ?? '';
  if (!JSON_TYPE.test(type)) {
    req.resume();
    throw new AppError(415, 'unsupported_media_type', `Content-Type must be application/json, got '${type || 'none'}'`);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) {
      req.resume();
      throw new AppError(413, 'payload_too_large', `Request body exceeds the limit of ${limit} bytes`, { limit });
    }
    chunks.push(chunk as Buffer);
  }
  if (size === 0) return undefined;
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch (e) {
    throw new InvalidRequest(`Request body is not valid JSON: ${(e as Error).message}`, [{ path: 'body', message: 'is not valid JSON' }]);
  }
}

// A JSON document written as text in parts, as JSON.stringify would write it whole, for an answer
// streamed (Readable.from) from batches of rows: what the API holds is a batch, not the document.
import { Readable } from 'node:stream';
import type { Logger } from './logger.ts';

// A cut its maker logs itself (a time limit): not a failure of the answer.
export class StreamCut extends Error {}

// The answer's stream of `text` (api/route.ts types it JSON), one part ahead at most: the socket's
// buffer is where the rest waits. `closed` runs once it is over (read whole, failed, cut, or destroyed
// as its client went or never read it: a HEAD); Readable.from waits for a read under way first, so
// what the reads use is free to release then. A failure once the answer began can only cut the
// connection: it is logged, with its message and code only (a database error's other fields may quote
// values).
export function jsonStream(text: AsyncIterable<string>, log: Logger, what: string, closed?: (err: Error | null) => void): Readable {
  const body = Readable.from(text, { highWaterMark: 1 });
  body.once('close', () => {
    const err = body.errored as (Error & { code?: unknown }) | null;
    if (err && !(err instanceof StreamCut) && err.code !== 'ERR_STREAM_PREMATURE_CLOSE') {
      log.error({ err: { message: err.message, code: err.code } }, `${what} failed after it began: its connection is aborted`);
    }
    closed?.(err);
  });
  return body;
}

// An object's JSON without its closing brace, for a member written after it (a streamed array or object).
export const opened = (o: object) => JSON.stringify(o).slice(0, -1);

// The items of a JSON array or object, comma-separated, one string each (`text` of an item), from batches of rows.
async function* separated<B, T>(batches: AsyncIterable<B>, shape: (batch: B) => T[], text: (item: T) => string): AsyncGenerator<string> {
  let comma = '';
  for await (const batch of batches) {
    for (const item of shape(batch)) {
      yield comma + text(item);
      comma = ',';
    }
  }
}

// The elements of a JSON array.
export const elements = <B>(batches: AsyncIterable<B>, shape: (batch: B) => unknown[]) =>
  separated(batches, shape, (item) => JSON.stringify(item));

// The members of a JSON object, from [key, value] pairs: keys must not repeat (JSON.stringify of an
// object would have written a repeated key once), and must not be array indexes (it writes those first).
export const members = <B>(batches: AsyncIterable<B>, shape: (batch: B) => [string, unknown][]) =>
  separated(batches, shape, ([key, value]) => `${JSON.stringify(key)}:${JSON.stringify(value)}`);

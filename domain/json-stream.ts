// A JSON document written as text in parts, as JSON.stringify would write it whole, for an answer
// streamed (Readable.from) from batches of rows: what the API holds is a batch, not the document.
import { Readable } from 'node:stream';
import type { Logger } from './logger.ts';
import { Unavailable } from './errors.ts';

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

// Answers of one kind (`what`) written from a snapshot held while their client reads them
// (db/snapshot.ts holdSnapshot). Each holds a pool connection in an open transaction meanwhile, and a
// batch of rows: without a bound, a few clients asking at once (or reading slowly) would take every
// connection the API has, and its memory. One more than `atOnce.most` is refused (503, Retry-After)
// rather than queued behind them (`atOnce.setting`: the setting that sets it, named in the refusal). The stream begins once `hold` has read what it reads first (a
// database out of reach fails there, before anything is answered), and the snapshot ends once the
// stream is over, however it ends.
export function snapshotStreams(what: string) {
  let writing = 0;
  return async <H extends { end(): Promise<void> }>(
    atOnce: { most: number; setting?: string }, hold: () => Promise<H>, text: (held: H) => AsyncIterable<string>, log: Logger,
  ): Promise<Readable> => {
    if (writing >= atOnce.most) {
      throw new Unavailable(`This process is writing ${writing} ${what}s, the most it writes at once${atOnce.setting ? ` (${atOnce.setting})` : ''}; retry shortly`);
    }
    writing++;
    let held: H;
    try {
      held = await hold();
    } catch (err) {
      writing--;
      throw err;
    }
    return jsonStream(text(held), log, what, () => {
      held.end()
        .catch((e: Error) => log.warn({ err: { message: e.message } }, `${what}: could not end its snapshot`))
        .finally(() => { writing--; });
    });
  };
}

// An object's JSON without its closing brace, for a member written after it (a streamed array or object).
export const opened = (o: object) => JSON.stringify(o).slice(0, -1);

// A text's JSON string without its quotes, for a string written in parts between them. Parts must
// not split a surrogate pair (JSON.stringify escapes a lone surrogate, which the whole would not).
export const inString = (text: string) => JSON.stringify(text).slice(1, -1);

// Items, one string each (`text` of an item) with `separator` between them, from batches of rows:
// those of a JSON array or object, comma-separated, unless told otherwise.
export async function* separated<B, T>(batches: AsyncIterable<B>, shape: (batch: B) => T[], text: (item: T) => string, separator = ','): AsyncGenerator<string> {
  let before = '';
  for await (const batch of batches) {
    for (const item of shape(batch)) {
      yield before + text(item);
      before = separator;
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

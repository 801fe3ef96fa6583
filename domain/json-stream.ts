// A JSON document written as text in parts, as JSON.stringify would write it whole, for an answer
// streamed (Readable.from) from batches of rows: what the API holds is a batch, not the document.

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

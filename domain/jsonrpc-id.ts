// A JSON-RPC response must carry the request's id as the client wrote it. JSON.parse turns a number
// into the nearest double, which for some ids is another number: 1e-400 reads as 0, and
// 123456789.123456789 as 123456789.12345679. Whether an id survives is told from the request's text.
import { echoed } from './errors.ts';

// The literal of each message's `id` member in the JSON text `text` (one message, or a batch: an
// array of them) when it is a number, by the message's index; the last when a message names it twice,
// as JSON.parse keeps the last. Only the messages' own members are read: nested values are skipped.
export function idLiterals(text: string): (string | undefined)[] {
  const out: (string | undefined)[] = [];
  const open: number[] = []; // the brackets the scan is inside, outermost first
  let index = 0;
  let keyNext = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      const end = stringEnd(text, i);
      if (keyNext) {
        keyNext = false;
        // A member name may be written with escapes ("\u0069d"): compared as JSON.parse reads it.
        if (JSON.parse(text.slice(i, end + 1)) === 'id') {
          MEMBER_VALUE.lastIndex = end + 1;
          out[index] = MEMBER_VALUE.exec(text)?.[1];
        }
      }
      i = end;
    } else if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      open.push(c);
      keyNext = c === 0x7b && atMessage(open);
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      open.pop();
    } else if (c === 0x2c /* , */) {
      if (open.length === 1 && open[0] === 0x5b) index++; // the next member of a batch
      else keyNext = atMessage(open);
    }
  }
  return out;
}

// Whether the innermost bracket is a message's own object: the document's, or a batch member's.
const atMessage = (open: number[]) => open.at(-1) === 0x7b && (open.length === 1 || (open.length === 2 && open[0] === 0x5b));

const MEMBER_VALUE = /\s*:\s*(-?\d[\d.eE+-]*)?/y;

// The index of the quote that closes the string opening at `start` (the text's end if none does).
function stringEnd(text: string, start: number): number {
  for (let i = start + 1; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x5c /* \ */) i++;
    else if (c === 0x22) return i;
  }
  return text.length;
}

// A number's decimal value in one spelling (digits without leading or trailing zeros, and an
// exponent), from a JSON literal or from String(number). Zeros are cut by index, not by a regular
// expression: /0+$/ retries from every zero of a run, quadratic in a literal of a million zeros.
function decimal(literal: string): string {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(literal);
  if (!m) return literal;
  const fraction = m[3] ?? '';
  const digits = m[2] + fraction;
  let from = 0;
  while (from < digits.length && digits.charCodeAt(from) === 0x30) from++;
  if (from === digits.length) return '0';
  let to = digits.length;
  while (digits.charCodeAt(to - 1) === 0x30) to--;
  return `${m[1]}${digits.slice(from, to)}e${Number(m[4] ?? 0) - fraction.length + digits.length - to}`;
}

// Whether `value`, the number JSON.parse read from `literal`, is written back (JSON.stringify) as the
// number the literal is.
const numberEchoes = (literal: string, value: number): boolean => decimal(literal) === decimal(String(value));

/** The first message of `body` (parsed from `text`: one message or a batch) whose number id JSON.parse read as another number: its index, and what is wrong with its id. */
export function inexactId(body: unknown, text: string): { index: number; problem: string } | undefined {
  const messages: unknown[] = Array.isArray(body) ? body : [body];
  const idOf = (m: unknown) => (m !== null && typeof m === 'object' ? (m as { id?: unknown }).id : undefined);
  // Read from the text only when there is a number id to check.
  if (!messages.some((m) => typeof idOf(m) === 'number')) return undefined;
  const literals = idLiterals(text);
  for (const [index, m] of messages.entries()) {
    const id = idOf(m);
    const literal = literals[index];
    // Past 2^53 an integer is refused by each endpoint in its own words before this matters.
    if (typeof id === 'number' && Math.abs(id) <= Number.MAX_SAFE_INTEGER && literal !== undefined && !numberEchoes(literal, id)) {
      return { index, problem: `id ${echoed(literal)} would be echoed as ${String(id)}, another number (JSON numbers are read as doubles): send it as a string or an integer` };
    }
  }
  return undefined;
}

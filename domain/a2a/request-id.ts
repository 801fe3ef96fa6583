// A JSON-RPC response must carry the request's id as the client wrote it. JSON.parse turns a number
// into the nearest double, which for some ids is another number: 1e-400 reads as 0, and
// 123456789.123456789 as 123456789.12345679. Whether an id survives is told from the request's text.

// The literal of the last top-level member `name` of the JSON object `text` when it is a number (the
// last, as JSON.parse keeps the last of duplicate names), else undefined. Nested values are skipped.
export function topLevelNumberLiteral(text: string, name: string): string | undefined {
  let depth = 0;
  let keyNext = false;
  let literal: string | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      const end = stringEnd(text, i);
      if (depth === 1 && keyNext) {
        keyNext = false;
        // A member name may be written with escapes ("\u0069d"): compared as JSON.parse reads it.
        if (JSON.parse(text.slice(i, end + 1)) === name) {
          MEMBER_VALUE.lastIndex = end + 1;
          literal = MEMBER_VALUE.exec(text)?.[1];
        }
      }
      i = end;
    } else if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      depth++;
      keyNext = depth === 1;
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      depth--;
    } else if (c === 0x2c /* , */ && depth === 1) {
      keyNext = true;
    }
  }
  return literal;
}

const MEMBER_VALUE = /\s*:\s*(-?\d[\d.eE+-]*)?/y;

// The index of the quote that closes the string opening at `start` (the text is valid JSON).
function stringEnd(text: string, start: number): number {
  for (let i = start + 1; ; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x5c /* \ */) i++;
    else if (c === 0x22) return i;
  }
}

// A number's decimal value in one spelling (digits without leading or trailing zeros, and an
// exponent), from a JSON literal or from String(number).
function decimal(literal: string): string {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(literal);
  if (!m) return literal;
  const fraction = m[3] ?? '';
  const digits = (m[2] + fraction).replace(/^0+/, '');
  if (!digits) return '0';
  const kept = digits.replace(/0+$/, '');
  return `${m[1]}${kept}e${Number(m[4] ?? 0) - fraction.length + digits.length - kept.length}`;
}

/** Whether `value`, the number JSON.parse read from `literal`, is written back (JSON.stringify) as the number the literal is. */
export const numberEchoes = (literal: string, value: number): boolean => decimal(literal) === decimal(String(value));

// Masks secrets in text an upstream wrote (a provider's refusal, a remote agent's error), which may
// quote the request it refused in any encoding: as sent, percent-encoded (either hex case, UTF-8
// bytes, `+` for a space), JSON-escaped (`\/`, `\uXXXX`, surrogate pairs), as HTML entities, or mixed;
// and cut short, leaving a prefix of the secret: at the text's end, or inside it before an ellipsis
// (a quote cut short within a longer message).
//
// Each secret is looked for through a regular expression spelling its characters out, one pattern of
// ~70 characters per character; its cost (V8 compiles it on its first use, tens of ms for a 64-character
// secret, 100-250 ms about 256) grows with the secret, and past some thousands of characters the
// expression is too large to compile at all. So only a secret's first FULL_PATTERN_CHARS characters get
// such patterns. A longer secret is masked, whole, by a literal search of it as sent, percent-encoded
// and JSON-escaped; and in any other encoding, or cut short, from where its first FULL_PATTERN_CHARS
// characters are found (in any encoding) through as many of the characters after them as follow there
// (each looked for by one character's pattern), then a cut character and an ellipsis or the text's end.
// The masker never throws: a secret whose patterns cannot be built, or a text they fail on, leaves
// nothing of the text but MASK.

// Secrets shorter than this are not masked: matching them would mask ordinary words.
const MIN_SECRET_LENGTH = 4;
const MASK = '***';
// A prefix of a secret inside a text, before an ellipsis, is masked from this length on: shorter ones
// would mask ordinary words that happen to start a secret.
const MIN_CUT_INSIDE = 8;
// A secret's characters from which on it is looked for by the patterns of its first ones only (above).
export const FULL_PATTERN_CHARS = 256;

const NAMED_ENTITIES: Record<string, string[]> = {
  '&': ['amp'], '<': ['lt'], '>': ['gt'], '"': ['quot'], "'": ['apos'], '/': ['sol'], '=': ['equals'], '+': ['plus'], ':': ['colon'],
};
const JSON_SHORT: Record<string, string> = { '"': '\\"', '\\': '\\\\', '/': '\\/', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t' };

const literal = (s: string) => s.replace(/[\\^$.*+?()[\]{}|/-]/g, '\\$&');
// Hex digits in either case, as encoders differ.
const hex = (n: number, width = 0) => [...n.toString(16).padStart(width, '0')].map((d) => (/[a-f]/.test(d) ? `[${d}${d.toUpperCase()}]` : d)).join('');

// Every way one character may be written.
function unitPattern(ch: string): string {
  const cp = ch.codePointAt(0)!;
  const forms = [literal(ch), [...Buffer.from(ch, 'utf8')].map((b) => `%${hex(b, 2)}`).join('')];
  if (ch === ' ') forms.push('\\+');
  if (JSON_SHORT[ch]) forms.push(literal(JSON_SHORT[ch]));
  const utf16 = cp > 0xffff ? [0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff)] : [cp];
  forms.push(utf16.map((u) => `\\\\u${hex(u, 4)}`).join(''));
  forms.push(`&#0*${cp};`, `&#[xX]0*${hex(cp)};`, ...(NAMED_ENTITIES[ch] ?? []).map((name) => `&${name};`));
  return `(?:${forms.join('|')})`;
}

// A text cut short (by a provider, or by us before masking) may end inside one character's
// encoding (`%c3%a`, `\ud83d\ude`, `&#23`, half a surrogate pair), then an ellipsis.
const PARTIAL_UNIT = String.raw`(?:(?:%[0-9a-fA-F]{2})*%[0-9a-fA-F]?|(?:%[0-9a-fA-F]{2})+|\\u[0-9a-fA-F]{4}(?:\\(?:u[0-9a-fA-F]{0,3})?)?|\\(?:u[0-9a-fA-F]{0,3})?|&#?[xX]?[0-9a-fA-F]*|&[a-zA-Z]*|[\uD800-\uDBFF])?`;
const CUT_END = new RegExp(String.raw`${PARTIAL_UNIT}(?:\.\.\.|…)?\s*$`, 'y');
const ELLIPSIS = String.raw`(?:\.\.\.|…)`;

// The secret's first MIN_CUT_INSIDE units or more, then an ellipsis: one pattern, nested so that a
// match tries each unit once at each place (no scan of every prefix at every ellipsis).
function cutInside(units: string[]): RegExp | undefined {
  if (units.length <= MIN_CUT_INSIDE) return undefined;
  const rest = units.slice(MIN_CUT_INSIDE).reduceRight((inner, unit) => `(?:${unit}${inner})?`, '');
  return new RegExp(`${units.slice(0, MIN_CUT_INSIDE).join('')}${rest}${PARTIAL_UNIT}${ELLIPSIS}`, 'g');
}

/** A function masking every occurrence of `secrets`, in any encoding above, in a text. */
export function secretMasker(secrets: readonly string[]): (text: string) => string {
  // Longest first, so a whole header is masked before the token inside it.
  const kept = [...new Set(secrets.filter((s) => s.length >= MIN_SECRET_LENGTH))].sort((a, b) => b.length - a.length);
  let masks: Mask[];
  try {
    masks = kept.map((secret) => {
      // A secret ending with another (a header, `Bearer <token>`) is not looked for cut short: its start
      // is no secret ("must be Bearer"), and the other is looked for itself.
      const wrapsAnother = kept.some((other) => other !== secret && secret.endsWith(other));
      return maskOf(secret, wrapsAnother);
    });
  } catch {
    return () => MASK;
  }
  return (text) => {
    try {
      for (const { literals } of masks) for (const form of literals) text = text.split(form).join(MASK);
      for (const { whole, rest, cut } of masks) text = rest.length > 0 ? maskWithRest(text, whole, rest, cut) : text.replace(whole, MASK);
      for (const { inside } of masks) if (inside) text = text.replace(inside, MASK);
      for (const { units } of masks) text = maskCutEnd(text, units);
      return text;
    } catch {
      return MASK;
    }
  };
}

interface Mask {
  // Forms of a long secret searched for as they are.
  literals: string[];
  // Its first FULL_PATTERN_CHARS characters (all of a shorter one), in any encoding.
  whole: RegExp;
  // The characters of a long secret after those.
  rest: string[];
  // Whether a quote of it cut short is masked.
  cut: boolean;
  inside: RegExp | undefined;
  units: RegExp[];
}

function maskOf(secret: string, wrapsAnother: boolean): Mask {
  const chars = [...secret];
  const units = chars.slice(0, FULL_PATTERN_CHARS).map(unitPattern);
  const rest = chars.slice(FULL_PATTERN_CHARS);
  const percent = encodeURIComponent(secret);
  const literals = rest.length === 0 ? [] : [...new Set([secret, percent, percent.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()), JSON.stringify(secret).slice(1, -1)])];
  return {
    literals, rest, cut: !wrapsAnother,
    whole: new RegExp(units.join(''), 'g'),
    inside: wrapsAnother ? undefined : cutInside(units),
    units: wrapsAnother ? [] : units.map((u) => new RegExp(u, 'y')),
  };
}

const CUT_INSIDE_TAIL = new RegExp(`${PARTIAL_UNIT}${ELLIPSIS}`, 'y');

// Each match of a long secret's first characters, with as many of its `rest` as follow there, and, for
// a secret looked for cut short, a cut character then an ellipsis or the text's end.
function maskWithRest(text: string, whole: RegExp, rest: string[], cut: boolean): string {
  const unitOf = new Map<string, RegExp>();
  const unit = (ch: string) => unitOf.get(ch) ?? unitOf.set(ch, new RegExp(unitPattern(ch), 'y')).get(ch)!;
  let out = '';
  let from = 0;
  whole.lastIndex = 0;
  for (let m = whole.exec(text); m; m = whole.exec(text)) {
    let at = whole.lastIndex;
    let matched = 0;
    for (const ch of rest) {
      const re = unit(ch);
      re.lastIndex = at;
      if (!re.test(text)) break;
      at = re.lastIndex;
      matched++;
    }
    if (cut && matched < rest.length) {
      for (const tail of [CUT_INSIDE_TAIL, CUT_END]) {
        tail.lastIndex = at;
        if (tail.test(text)) {
          at = tail.lastIndex;
          break;
        }
      }
    }
    out += `${text.slice(from, m.index)}${MASK}`;
    from = whole.lastIndex = Math.max(at, m.index + 1);
  }
  return out + text.slice(from);
}

// The longest one character's encoding above, for where a cut secret may start.
const MAX_UNIT_CHARS = 16;

// The earliest start from which the text's end spells the secret's first units (at least
// MIN_SECRET_LENGTH of them), masked from there on.
function maskCutEnd(text: string, units: RegExp[]): string {
  if (units.length === 0) return text;
  for (let start = Math.max(0, text.length - units.length * MAX_UNIT_CHARS - 8); start < text.length; start++) {
    let at = start;
    let matched = 0;
    for (const unit of units) {
      unit.lastIndex = at;
      if (!unit.test(text)) break;
      at = unit.lastIndex;
      matched++;
    }
    CUT_END.lastIndex = at;
    if (matched >= MIN_SECRET_LENGTH && CUT_END.test(text)) return `${text.slice(0, start)}${MASK}`;
  }
  return text;
}

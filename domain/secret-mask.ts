// Masks secrets in text an upstream wrote (a provider's refusal, a remote agent's error), which may
// quote the request it refused in any encoding: as sent, percent-encoded (either hex case, UTF-8
// bytes, `+` for a space), JSON-escaped (`\/`, `\uXXXX`, surrogate pairs), as HTML entities, or mixed;
// and cut short, leaving a prefix of the secret: at the text's end, or inside it before an ellipsis
// (a quote cut short within a longer message).

// Secrets shorter than this are not masked: matching them would mask ordinary words.
const MIN_SECRET_LENGTH = 4;
const MASK = '***';
// A prefix of a secret inside a text, before an ellipsis, is masked from this length on: shorter ones
// would mask ordinary words that happen to start a secret.
const MIN_CUT_INSIDE = 8;

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
  const masks = kept.map((secret) => {
    const units = [...secret].map(unitPattern);
    // A secret ending with another (a header, `Bearer <token>`) is not looked for cut short: its start
    // is no secret ("must be Bearer"), and the other is looked for itself.
    const wrapsAnother = kept.some((other) => other !== secret && secret.endsWith(other));
    return { whole: new RegExp(units.join(''), 'g'), inside: wrapsAnother ? undefined : cutInside(units), units: wrapsAnother ? [] : units.map((u) => new RegExp(u, 'y')) };
  });
  return (text) => {
    for (const { whole } of masks) text = text.replace(whole, MASK);
    for (const { inside } of masks) if (inside) text = text.replace(inside, MASK);
    for (const { units } of masks) text = maskCutEnd(text, units);
    return text;
  };
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

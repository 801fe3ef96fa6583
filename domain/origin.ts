// An origin (RFC 6454) as a browser sends it in an Origin header and an operator writes one in a
// setting: a scheme and a host, and a port unless it is the scheme's default. Normalised so that two
// spellings of one origin compare equal: scheme and host in lower case (a non-ASCII host in punycode),
// a default port dropped (https://App.Example.com:443 is https://app.example.com). A trailing `/` is
// taken; a path (after `/`, or `\`, which URL reads as one), query, fragment, user info, wildcard or list is not, nor `null` (the opaque origin of
// a sandboxed iframe or a file:// page): undefined.
const ORIGIN_TEXT = /^[a-z][a-z0-9+.-]*:\/\/[^/\\?#@\s*,]+\/?$/i;

export function normalOrigin(text: string): string | undefined {
  if (!ORIGIN_TEXT.test(text)) return undefined;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return undefined;
  }
  // URL.origin is "null" for schemes other than the web's (chrome-extension://<id>): their origin is
  // built the same way, without default ports (those schemes have none).
  return url.host ? `${url.protocol}//${url.host}`.toLowerCase() : undefined;
}

import { Type, type ObjectOptions, type TSchema } from '@sinclair/typebox';
import { ERROR_CODES, type ErrorCode } from '../errors.ts';
import { worded } from '../schema-check.ts';

// Shapes (TypeBox) that the API's validation and OpenAPI document, the domain, the workers and the
// queues' job payloads share: here in domain/, as no layer below the API may depend on api/.

// A pattern for free-form strings that reach SQL or paths: no control characters (Postgres refuses NUL).
// `*`: an empty string breaks only its minLength, so it is told only that.
export const NoControlChars = worded('^[^\\u0000-\\u001f\\u007f]*$', 'must not contain control characters');
// Standard base64, padded: whole groups of four (a last one with = padding), which Buffer decodes as sent.
export const BASE64_PATTERN = worded('^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$', 'must be base64 (standard alphabet, padded with =)');
// fetch and browsers (WHATWG URL) drop a path segment that is "." or ".." (%2E too), with the one
// before it, before a request leaves: a name a client picks that goes into paths (a DEK id, an alias)
// may not be one, or it is stored and cannot be addressed. A pattern of its own (allOf), so that such
// a name is told this rather than its alphabet; names already stored are still read.
export const NotDotSegment = { allOf: [{ pattern: worded('^(?!\\.\\.?$)', 'must not be "." or ".." (a URL cannot address it)') }] };
// http(s) URLs clients give (redirects, token endpoints): the format is defined in domain/schema-check.ts.
export const HttpUrl = Type.String({ format: 'http-url', maxLength: 2048 });
export const Base64 = Type.String({ contentEncoding: 'base64', pattern: BASE64_PATTERN, description: 'base64 (standard alphabet, padded)' });
export const Timestamp = Type.String({ format: 'date-time', description: 'RFC 3339, UTC, millisecond precision' });
export const FreeObject = Type.Record(Type.String(), Type.Unknown(), { description: 'free-form object' });

// As api/middleware/errors.ts errorBody writes it, for every error answer (JSON-RPC errors aside):
// data always, with its code; a 400 about members of the request names each in data.errors.
export const ErrorBody = Type.Object({
  message: Type.String(),
  data: Type.Object({
    code: Type.Unsafe<ErrorCode>({ type: 'string', enum: [...ERROR_CODES] }),
    errors: Type.Optional(Type.Array(Type.Object({
      path: Type.String({ description: 'where in the request: path.<name>, query.<name> or body.<member>...' }),
      message: Type.String({ description: 'what is wrong with it' }),
    }), { description: 'each member of the request refused (400), first the one the message names' })),
  }, { additionalProperties: true, description: 'code, and members telling more (a 404 its resource and id, a 403 its required_scope...)' }),
}, { $id: 'Error' });

// The error answers every authenticated route can give, and those of routes that name a resource.
export const requestErrors = { 400: ErrorBody, 401: ErrorBody, 403: ErrorBody };
export const resourceErrors = { ...requestErrors, 404: ErrorBody };
// Routes that wrap or unwrap with a DEK: one under an AWS KMS envelope key answers 502 when KMS fails.
export const kmsErrors = { 502: ErrorBody };

export const Success = Type.Object({ success: Type.Boolean() });

// page_size is an int64 in the seed (list-contexts), within 1..1000 here.
const PageSize = { format: 'int64', minimum: 1, maximum: 1000, description: 'The most items a page holds; a page may hold fewer (lists of large items end a page at 8 MiB, JSON weighed as parsed) and carries next_page_token while more follow.' };
const PageToken = Type.Optional(Type.String({ minLength: 1, maxLength: 2048 }));

export const PageQuery = {
  page_size: Type.Optional(Type.Integer({ ...PageSize, default: 50 })),
  next_page_token: PageToken,
};

// The query of a route that answers the same whatever is asked (the OpenAPI document, the agent cards,
// health, readiness, metrics): any parameter is taken and none read. A cache buster, a CDN's own, or a
// probe's or scraper's configured parameters may come with a fetch, and there is nothing to filter.
export const AnyQuery = Type.Object({}, { additionalProperties: true });

export const RequiredPageQuery = {
  page_size: Type.Integer(PageSize),
  next_page_token: PageToken,
};

export function Paginated<T extends TSchema>(item: T, member = 'items', options: ObjectOptions = {}) {
  return Type.Object({ [member]: Type.Array(item), next_page_token: Type.Optional(Type.String()) }, options);
}

export const Body = <T extends Parameters<typeof Type.Object>[0]>(props: T) => Type.Object(props, { additionalProperties: false });

// The body of an action that takes no input: none, or an empty object (anything else is refused).
export const NoInput = Type.Object({}, { additionalProperties: false, description: 'no input: leave the body out or send {}' });

// The pattern too: ajv-formats' uuid format also accepts 'urn:uuid:...', which Postgres refuses.
export const Uuid = Type.String({ format: 'uuid', pattern: worded('^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$', 'must be a UUID'), description: 'UUID' });

// A push notification config's id, as A2A clients name one (pushNotificationConfig.id,
// pushNotificationConfigId) and as delivery jobs carry it. NUL is refused here, not only by the A2A
// body check (findUnstorable): Postgres refuses it, so a job naming one would fail every attempt.
export const PushConfigId = Type.String({ minLength: 1, maxLength: 256, pattern: worded('^[^\\u0000]*$', 'must not contain NUL'), description: 'push notification config id: 1 to 256 characters, no NUL' });

// Sent to the provider as its Idempotency-Key header (Stripe keeps a key's answer 24 hours and
// answers a repeat with it), so a client that retries after a 502 or a hang-up refunds once. A
// header value: visible ASCII with inner spaces, at most Stripe's 255.
const IDEMPOTENCY_KEY_CHARACTERS = 'must be visible ASCII (inner spaces allowed)';
export const IdempotencyKey = Type.String({
  minLength: 1, maxLength: 255, pattern: worded('^[!-~](?:[ -~]*[!-~])?$', IDEMPOTENCY_KEY_CHARACTERS),
  description: "sent to providers that honour one (Stripe) as the Idempotency-Key header: a repeat of the call with the same key gets the first call's answer instead of acting again; other providers ignore it",
});
// The key's rules in words, from its schema, for text that states them to clients (the MCP server's instructions).
export const IDEMPOTENCY_KEY_RULES = `${IdempotencyKey.minLength} to ${IdempotencyKey.maxLength} characters, which ${IDEMPOTENCY_KEY_CHARACTERS}`;

// Typed errors thrown by domain and repository code; api/middleware/errors.ts maps them to HTTP.
export type ErrorCode =
  | 'invalid_request' | 'unauthenticated' | 'forbidden' | 'not_found' | 'method_not_allowed' | 'conflict'
  | 'gone' | 'payload_too_large' | 'unsupported_media_type' | 'rate_limited' | 'internal' | 'bad_gateway'
  | 'unavailable';

export class AppError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    readonly data: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = new.target.name;
  }
}

export interface FieldError { path: string; message: string }

export class InvalidRequest extends AppError {
  constructor(message: string, errors?: FieldError[]) {
    super(400, 'invalid_request', message, errors ? { errors } : {});
  }
}
export class Unauthenticated extends AppError {
  constructor(message = 'Missing or invalid API key') {
    super(401, 'unauthenticated', message, {}, { 'WWW-Authenticate': 'Bearer' });
  }
}
export class Forbidden extends AppError {
  constructor(scope: string) {
    super(403, 'forbidden', `This API key lacks the scope '${scope}'`, { required_scope: scope });
  }
}
export class NotFound extends AppError {
  constructor(resource: string, id: string) {
    super(404, 'not_found', `${resource} '${id}' not found`, { resource, id });
  }
}
export class Conflict extends AppError {
  constructor(message: string, data: Record<string, unknown> = {}) {
    super(409, 'conflict', message, data);
  }
}
export class Gone extends AppError {
  constructor(message: string) {
    super(410, 'gone', message);
  }
}
export class Upstream extends AppError {
  constructor(message: string, data: Record<string, unknown> = {}) {
    super(502, 'bad_gateway', message, data);
  }
}
export class RateLimited extends AppError {
  constructor(retryAfterMs: number) {
    const seconds = Math.max(1, Math.ceil(retryAfterMs / 1000));
    super(429, 'rate_limited', `Too many requests for this API key; retry in ${seconds} s`, { retry_after_ms: retryAfterMs }, { 'Retry-After': String(seconds) });
  }
}
export class Unavailable extends AppError {
  constructor(message: string) {
    super(503, 'unavailable', message, {}, { 'Retry-After': '5' });
  }
}

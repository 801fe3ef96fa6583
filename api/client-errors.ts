// Requests Node's HTTP parser refuses (headers over its limit, malformed HTTP, too slow) or Node
// refuses itself (an Expect it does not know) never reach Koa, and Node answers them without a
// body. These get the Error body like every other error, as does CONNECT, with an X-Request-Id
// and a log line naming it (SPEC section 1).
import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { AppError, InvalidRequest, MethodNotAllowed, PayloadTooLarge } from '../domain/errors.ts';
import { errorBody } from './middleware/errors.ts';
import { requestIdFor } from './middleware/request-id.ts';
import type { Logger } from '../domain/logger.ts';

const ANSWERS: Record<string, () => AppError> = {
  HPE_HEADER_OVERFLOW: () => new AppError(431, 'invalid_request', 'Request headers exceed the size the server reads'),
  HPE_CHUNK_EXTENSIONS_OVERFLOW: () => new PayloadTooLarge('Chunk extensions exceed the size the server reads'),
  ERR_HTTP_REQUEST_TIMEOUT: () => new AppError(408, 'invalid_request', 'The request did not arrive in time'),
};

// An error as a whole HTTP/1.1 response written on the socket, which is closed after it.
// `requestId`: the request's own X-Request-Id when it could be read (CONNECT), else a new one.
function writeError(log: Logger, socket: Duplex, e: AppError, requestId = requestIdFor(undefined)): void {
  const body = JSON.stringify(errorBody(e));
  const headers = Object.entries({ ...e.headers, 'X-Request-Id': requestId }).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  log.info({ req_id: requestId, status: e.status, code: e.code }, 'request refused before routing');
  socket.end(`HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${headers}Connection: close\r\n\r\n${body}`, () => socket.destroy());
}

// CONNECT (a proxy tunnel) never reaches Koa either; without an answer Node just drops the socket.
// `methods`: those the routes answer, for its Allow header.
export function answerClientErrors(server: Server, methods: readonly string[], log: Logger): void {
  const allow = [...new Set([...methods.map((m) => m.toUpperCase()), 'HEAD', 'OPTIONS'])].join(', ');
  server.on('connect', (req, socket: Duplex) => {
    writeError(log, socket, new MethodNotAllowed('Method CONNECT is not allowed: this server is not a proxy', allow), requestIdFor(req.headers['x-request-id']));
  });
  // An Expect other than 100-continue: Node answers 417 itself, without a body, unless told here.
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const requestId = requestIdFor(req.headers['x-request-id']);
    const e = new AppError(417, 'invalid_request', `Expect '${String(req.headers.expect).slice(0, 100)}' is not supported: only 100-continue is`);
    log.info({ req_id: requestId, method: req.method, path: req.url?.split('?')[0], status: e.status, code: e.code }, 'request refused before routing');
    // Its body is not read: the connection closes after the answer.
    res.writeHead(e.status, { 'Content-Type': 'application/json', 'X-Request-Id': requestId, Connection: 'close' });
    res.end(JSON.stringify(errorBody(e)));
  });
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // As Node's own handler: nothing is written once a response has begun on the connection.
    const response = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === 'ECONNRESET' || !socket.writable || response?.headersSent) {
      socket.destroy();
      return;
    }
    writeError(log, socket, ANSWERS[err.code ?? '']?.() ?? new InvalidRequest('The request is not valid HTTP'));
  });
}

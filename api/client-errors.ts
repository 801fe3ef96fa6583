// Requests Node's HTTP parser refuses (headers over its limit, malformed HTTP, too slow) or Node
// refuses itself (an Expect it does not know) never reach Koa, and Node answers them without a
// body. These get the Error body like every other error, as does CONNECT, with an X-Request-Id
// and a log line naming it (SPEC section 1).
// Each answer written here is counted in /metrics' HTTP latencies as Koa's are (`count`), labelled
// without anything the client chose: a request Node could not read has method and route `unparsed`;
// CONNECT and an unknown Expect have their method (one Node's parser knows) and route `unmatched`.
import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { AppError, echoed, InvalidRequest, MethodNotAllowed, PayloadTooLarge } from '../domain/errors.ts';
import { errorBody } from './middleware/errors.ts';
import { requestIdFor } from './middleware/request-id.ts';
import { loggedTarget, markAnsweredOutsideKoa, UNMATCHED } from './middleware/access-log.ts';
import type { HttpAnswer } from './metrics.ts';
import type { Logger } from '../domain/logger.ts';

const UNPARSED = 'unparsed';

const ANSWERS: Record<string, () => AppError> = {
  HPE_HEADER_OVERFLOW: () => new AppError(431, 'invalid_request', 'Request headers exceed the size the server reads'),
  HPE_CHUNK_EXTENSIONS_OVERFLOW: () => new PayloadTooLarge('Chunk extensions exceed the size the server reads'),
  ERR_HTTP_REQUEST_TIMEOUT: () => new AppError(408, 'invalid_request', 'The request did not arrive in time'),
};

// An error as a whole HTTP/1.1 response written on the socket, which is closed after it.
function writeResponse(socket: Duplex, e: AppError, requestId: string): void {
  const body = JSON.stringify(errorBody(e));
  const headers = Object.entries({ ...e.headers, 'X-Request-Id': requestId }).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  socket.end(`HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${headers}Connection: close\r\n\r\n${body}`, () => socket.destroy());
}

// That response, logged. `requestId`: the request's own X-Request-Id when it could be read (CONNECT), else a new one.
function writeError(log: Logger, socket: Duplex, e: AppError, requestId = requestIdFor(undefined)): void {
  log.info({ req_id: requestId, status: e.status, code: e.code }, 'request refused before routing');
  writeResponse(socket, e, requestId);
}

// CONNECT (a proxy tunnel) never reaches Koa either; without an answer Node just drops the socket.
// `methods`: those the routes answer, for its Allow header.
export function answerClientErrors(server: Server, methods: readonly string[], log: Logger, count: (answer: HttpAnswer) => void): void {
  const allow = [...new Set([...methods.map((m) => m.toUpperCase()), 'HEAD', 'OPTIONS'])].join(', ');
  server.on('connect', (req, socket: Duplex) => {
    writeError(log, socket, new MethodNotAllowed('Method CONNECT is not allowed: this server is not a proxy', allow), requestIdFor(req.headers['x-request-id']));
    count({ method: 'CONNECT', route: UNMATCHED, status: 405, seconds: 0 });
  });
  // An Expect other than 100-continue: Node answers 417 itself, without a body, unless told here.
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const requestId = requestIdFor(req.headers['x-request-id']);
    const e = new AppError(417, 'invalid_request', `Expect '${echoed(String(req.headers.expect))}' is not supported: only 100-continue is`);
    log.info({ req_id: requestId, method: req.method, path: loggedTarget(req.url ?? ''), status: e.status, code: e.code }, 'request refused before routing');
    // Its body is not read: the connection closes after the answer.
    res.writeHead(e.status, { 'Content-Type': 'application/json', 'X-Request-Id': requestId, Connection: 'close' });
    res.end(JSON.stringify(errorBody(e)));
    count({ method: req.method!, route: UNMATCHED, status: e.status, seconds: 0 });
  });
  // The last request each connection brought: one answered before its body was read (a 401, 413 or
  // 415) leaves Node reading that body, and a body that never ends times out with no response on the
  // connection. The client has its answer: the connection is closed, nothing more written or counted.
  const lastRequest = new WeakMap<Duplex, IncomingMessage>();
  server.on('request', (req: IncomingMessage) => lastRequest.set(req.socket, req));
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // As Node's own handler: nothing is written once a response has begun on the connection.
    const response = (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage;
    const answeredBeforeItsBody = !response && lastRequest.get(socket)?.complete === false;
    if (err.code === 'ECONNRESET' || !socket.writable || response?.headersSent || answeredBeforeItsBody) {
      socket.destroy();
      return;
    }
    const e = ANSWERS[err.code ?? '']?.() ?? new InvalidRequest('The request is not valid HTTP');
    if (response) {
      // A request in Koa (its body too slow, or not valid HTTP): its own request line, under its own
      // X-Request-Id, and its count in /metrics give the status written here once Koa is done with it.
      markAnsweredOutsideKoa(response, e.status);
      const id = response.getHeader('X-Request-Id');
      writeResponse(socket, e, requestIdFor(typeof id === 'string' ? id : undefined));
      return;
    }
    writeError(log, socket, e);
    // A request timed out before Koa had it is one whose headers did not arrive within headersTimeout.
    const seconds = err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? (server.headersTimeout || server.requestTimeout) / 1000 : 0;
    count({ method: UNPARSED, route: UNPARSED, status: e.status, seconds });
  });
}

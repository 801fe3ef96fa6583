// Requests Node's HTTP parser refuses (headers over its limit, malformed HTTP, too slow) never
// reach Koa, and Node answers them without a body. These get the Error body like every other error,
// as does CONNECT.
import { STATUS_CODES, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { AppError, InvalidRequest, MethodNotAllowed, PayloadTooLarge } from '../domain/errors.ts';
import { errorBody } from './middleware/errors.ts';

const ANSWERS: Record<string, () => AppError> = {
  HPE_HEADER_OVERFLOW: () => new AppError(431, 'invalid_request', 'Request headers exceed the size the server reads'),
  HPE_CHUNK_EXTENSIONS_OVERFLOW: () => new PayloadTooLarge('Chunk extensions exceed the size the server reads'),
  ERR_HTTP_REQUEST_TIMEOUT: () => new AppError(408, 'invalid_request', 'The request did not arrive in time'),
};

// An error as a whole HTTP/1.1 response written on the socket, which is closed after it.
function writeError(socket: Duplex, e: AppError): void {
  const body = JSON.stringify(errorBody(e));
  const headers = Object.entries(e.headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  socket.end(`HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${headers}Connection: close\r\n\r\n${body}`, () => socket.destroy());
}

// CONNECT (a proxy tunnel) never reaches Koa either; without an answer Node just drops the socket.
// `methods`: those the routes answer, for its Allow header.
export function answerClientErrors(server: Server, methods: readonly string[]): void {
  const allow = [...new Set([...methods.map((m) => m.toUpperCase()), 'HEAD', 'OPTIONS'])].join(', ');
  server.on('connect', (_req, socket: Duplex) => writeError(socket, new MethodNotAllowed('Method CONNECT is not allowed: this server is not a proxy', allow)));
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // As Node's own handler: nothing is written once a response has begun on the connection.
    const response = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === 'ECONNRESET' || !socket.writable || response?.headersSent) {
      socket.destroy();
      return;
    }
    writeError(socket, ANSWERS[err.code ?? '']?.() ?? new InvalidRequest('The request is not valid HTTP'));
  });
}

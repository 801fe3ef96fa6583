// Requests Node's HTTP parser refuses (headers over its limit, malformed HTTP, too slow) never
// reach Koa, and Node answers them without a body. These get the Error body like every other error.
import { STATUS_CODES, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { AppError, InvalidRequest } from '../domain/errors.ts';
import { errorBody } from './middleware/errors.ts';

const ANSWERS: Record<string, () => AppError> = {
  HPE_HEADER_OVERFLOW: () => new AppError(431, 'invalid_request', 'Request headers exceed the size the server reads'),
  HPE_CHUNK_EXTENSIONS_OVERFLOW: () => new AppError(413, 'payload_too_large', 'Chunk extensions exceed the size the server reads'),
  ERR_HTTP_REQUEST_TIMEOUT: () => new AppError(408, 'invalid_request', 'The request did not arrive in time'),
};

export function answerClientErrors(server: Server): void {
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // As Node's own handler: nothing is written once a response has begun on the connection.
    const response = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === 'ECONNRESET' || !socket.writable || response?.headersSent) {
      socket.destroy();
      return;
    }
    const e = ANSWERS[err.code ?? '']?.() ?? new InvalidRequest('The request is not valid HTTP');
    const body = JSON.stringify(errorBody(e));
    socket.end(`HTTP/1.1 ${e.status} ${STATUS_CODES[e.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`, () => socket.destroy());
  });
}

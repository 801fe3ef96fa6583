// Requests Node's HTTP parser refuses (headers over its limit, malformed HTTP, too slow) never
// reach Koa, and Node answers them without a body. These get the Error body like every other error.
import type { Server } from 'node:http';
import type { Duplex } from 'node:stream';

const ANSWERS: Record<string, [number, string, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, 'Request Header Fields Too Large', 'invalid_request', 'Request headers exceed the size the server reads'],
  HPE_CHUNK_EXTENSIONS_OVERFLOW: [413, 'Payload Too Large', 'payload_too_large', 'Chunk extensions exceed the size the server reads'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'Request Timeout', 'invalid_request', 'The request did not arrive in time'],
};

export function answerClientErrors(server: Server): void {
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // As Node's own handler: nothing is written once a response has begun on the connection.
    const response = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === 'ECONNRESET' || !socket.writable || response?.headersSent) {
      socket.destroy();
      return;
    }
    const [status, reason, code, message] = ANSWERS[err.code ?? ''] ?? [400, 'Bad Request', 'invalid_request', 'The request is not valid HTTP'];
    const body = JSON.stringify({ message, data: { code } });
    socket.end(`HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`, () => socket.destroy());
  });
}

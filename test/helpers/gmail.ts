// Gmail's send endpoint as a local server: records the bearer token of every call.
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export function startGmail(): Promise<{ server: http.Server; url: string; tokens: string[] }> {
  const tokens: string[] = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      tokens.push(String(req.headers.authorization ?? ''));
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ id: `msg-${tokens.length}`, threadId: 't' }));
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, tokens })));
}

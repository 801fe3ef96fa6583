// A TCP proxy in front of Postgres that counts the statements clients send, per application_name
// (as their start-up message names it): each simple Query message and each Execute of the extended
// protocol. What a process sends Postgres, observed on the wire.
import net from 'node:net';

export interface StatementCountingProxy { url: string; statements(applicationName: string): number; close(): Promise<void> }

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

export async function startStatementCountingProxy(databaseUrl: string): Promise<StatementCountingProxy> {
  const target = new URL(databaseUrl);
  const counts = new Map<string, number>();
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => { client.destroy(); upstream.destroy(); });
      s.on('close', () => { sockets.delete(s); client.destroy(); upstream.destroy(); });
    }
    upstream.on('data', (chunk) => client.write(chunk));
    let buffered = Buffer.alloc(0);
    let started = false;
    let name = '';
    client.on('data', (chunk) => {
      upstream.write(chunk);
      buffered = Buffer.concat([buffered, chunk]);
      for (;;) {
        // Before start-up: untyped messages (an SSL or GSS request, then the start-up message).
        const typed = started ? 1 : 0;
        if (buffered.length < typed + 4) return;
        const length = buffered.readInt32BE(typed);
        if (buffered.length < typed + length) return;
        const message = buffered.subarray(0, typed + length);
        buffered = buffered.subarray(typed + length);
        if (!started) {
          const code = message.readInt32BE(4);
          if (code === SSL_REQUEST || code === GSSENC_REQUEST) continue;
          const fields = message.subarray(8).toString('utf8').split('\0');
          const at = fields.indexOf('application_name');
          name = at >= 0 ? fields[at + 1] : '';
          started = true;
        } else if (message[0] === 0x51 /* Q */ || message[0] === 0x45 /* E */) {
          counts.set(name, (counts.get(name) ?? 0) + 1);
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const via = new URL(target);
  via.hostname = '127.0.0.1';
  via.port = String((server.address() as net.AddressInfo).port);
  return {
    url: via.toString(),
    statements: (applicationName) => counts.get(applicationName) ?? 0,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

// The card of a hand-written remote A2A agent (a bare http server that answers what a test needs, where
// the SDK's server would answer correctly): the members a client reads, its endpoint at `url`.
import http, { type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startStack, useStarted, type Stack } from './stack.ts';

export function answerAgentCard(res: ServerResponse, card: { name: string; description: string; url: string; streaming: boolean }): void {
  res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({
    name: card.name, description: card.description, version: '1', protocolVersion: '0.3.0', url: card.url, preferredTransport: 'JSONRPC',
    capabilities: { streaming: card.streaming }, defaultInputModes: ['text'], defaultOutputModes: ['text'], skills: [],
  }));
}

// A bare A2A remote for tests: its card (url <origin>/rpc) on GET, and each JSON-RPC POST read whole
// and handed to `answer`. `event`: one SSE line answering that call.
export interface RawCall { id: string | number; method: string; params: any; event(result: unknown): string }
export function rawA2ARemote(card: { name: string; description: string; streaming: boolean }, answer: (call: RawCall, res: ServerResponse) => void): Server {
  return http.createServer((req, res) => {
    if (req.method === 'GET') {
      answerAgentCard(res, { ...card, url: `http://${req.headers.host}/rpc` });
      return;
    }
    let body = '';
    req.on('data', (b) => { body += b; });
    req.on('end', () => {
      const { id, method, params } = JSON.parse(body) as { id: string | number; method: string; params: unknown };
      answer({ id, method, params, event: (result) => `data: ${JSON.stringify({ jsonrpc: '2.0', id, result })}\n\n` }, res);
    });
  });
}

// Mocha hooks for a describe whose remote agent is `server`: it listens, and a stack with
// AGENT_KIND=remote and AGENT_REMOTE_URL at its /agent (plus `env`) starts; both stop after.
export function useStackOnRawAgent(server: Server, env: Record<string, string>): Stack {
  return useStarted(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return startStack({ AGENT_KIND: 'remote', AGENT_REMOTE_URL: `http://127.0.0.1:${(server.address() as AddressInfo).port}/agent`, ...env });
  }, async (stack) => {
    await stack?.stop();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
}

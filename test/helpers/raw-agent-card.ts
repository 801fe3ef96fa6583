// The card of a hand-written remote A2A agent (a bare http server that answers what a test needs, where
// the SDK's server would answer correctly): the members a client reads, its endpoint at `url`.
import type { Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startStack, useStarted, type Stack } from './stack.ts';

export function answerAgentCard(res: ServerResponse, card: { name: string; description: string; url: string; streaming: boolean }): void {
  res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({
    name: card.name, description: card.description, version: '1', protocolVersion: '0.3.0', url: card.url, preferredTransport: 'JSONRPC',
    capabilities: { streaming: card.streaming }, defaultInputModes: ['text'], defaultOutputModes: ['text'], skills: [],
  }));
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

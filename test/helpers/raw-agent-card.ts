// The card of a hand-written remote A2A agent (a bare http server that answers what a test needs, where
// the SDK's server would answer correctly): the members a client reads, its endpoint at `url`.
import type { ServerResponse } from 'node:http';

export function answerAgentCard(res: ServerResponse, card: { name: string; description: string; url: string; streaming: boolean }): void {
  res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({
    name: card.name, description: card.description, version: '1', protocolVersion: '0.3.0', url: card.url, preferredTransport: 'JSONRPC',
    capabilities: { streaming: card.streaming }, defaultInputModes: ['text'], defaultOutputModes: ['text'], skills: [],
  }));
}

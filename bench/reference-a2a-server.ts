// The reference for bench/a2a-intake.ts: an in-memory A2A v0.3 server built only from
// @a2a-js/sdk's server classes (DefaultRequestHandler, InMemoryTaskStore, the express JSON-RPC
// handler) with an echo executor equivalent to our demo agent (working, then completed with the
// echoed text). Nothing is durable. Listens on PORT (any free port when unset) and prints
// `{"msg":"reference listening","port":N}` when ready;
// GET /stats reports what the executor saw.
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import express from 'express';
import type { AgentCard, Message } from '@a2a-js/sdk';
import { DefaultRequestHandler, InMemoryTaskStore, type AgentExecutor, type ExecutionEventBus, type RequestContext } from '@a2a-js/sdk/server';
import { agentCardHandler, jsonRpcHandler, UserBuilder } from '@a2a-js/sdk/server/express';

// Arrival time of each message, by messageId, so the executor can report request-to-start latency.
const arrivals = new Map<string, number>();
const startLatencies: number[] = [];
let completed = 0;
let firstArrival = 0;
let lastCompleted = 0;

class EchoExecutor implements AgentExecutor {
  async execute(rc: RequestContext, bus: ExecutionEventBus): Promise<void> {
    const { taskId, contextId, userMessage } = rc;
    const t0 = arrivals.get(userMessage.messageId);
    arrivals.delete(userMessage.messageId);
    if (t0 !== undefined) startLatencies.push(performance.now() - t0);
    const now = () => new Date().toISOString();
    if (!rc.task) bus.publish({ kind: 'task', id: taskId, contextId, status: { state: 'submitted', timestamp: now() }, history: [userMessage] });
    bus.publish({ kind: 'status-update', taskId, contextId, final: false, status: { state: 'working', timestamp: now() } });
    const text = userMessage.parts.map((p) => (p.kind === 'text' ? p.text : '')).join('');
    const reply: Message = { kind: 'message', role: 'agent', messageId: randomUUID(), taskId, contextId, parts: [{ kind: 'text', text: `Echo: ${text}` }] };
    bus.publish({ kind: 'status-update', taskId, contextId, final: true, status: { state: 'completed', timestamp: now(), message: reply } });
    bus.finished();
    completed += 1;
    lastCompleted = performance.now();
  }

  async cancelTask(taskId: string, bus: ExecutionEventBus): Promise<void> {
    bus.publish({ kind: 'status-update', taskId, contextId: '', final: true, status: { state: 'canceled', timestamp: new Date().toISOString() } });
    bus.finished();
  }
}

const app = express();
const server = await new Promise<ReturnType<typeof app.listen>>((resolve) => {
  const s = app.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => resolve(s));
});
const port = (server.address() as AddressInfo).port;
const card: AgentCard = {
  name: 'reference echo', description: 'in-memory @a2a-js/sdk server with an echo executor', version: '1.0.0', protocolVersion: '0.3.0',
  url: `http://127.0.0.1:${port}/`, preferredTransport: 'JSONRPC', capabilities: { streaming: true }, defaultInputModes: ['text'], defaultOutputModes: ['text'], skills: [],
};
const handler = new DefaultRequestHandler(card, new InMemoryTaskStore(), new EchoExecutor());

app.get('/stats', (_req, res) => {
  res.json({ completed, first_arrival: firstArrival, last_completed: lastCompleted, start_latencies_ms: startLatencies });
});
app.post('/stats/reset', (_req, res) => {
  completed = 0;
  firstArrival = 0;
  lastCompleted = 0;
  startLatencies.length = 0;
  res.json({ ok: true });
});
app.use('/.well-known/agent-card.json', agentCardHandler({ agentCardProvider: handler }));
// Parsed here (the SDK's handler reuses a parsed body) to stamp each message's arrival.
app.use(express.json(), (req, _res, next) => {
  const id = (req.body as { params?: { message?: { messageId?: unknown } } })?.params?.message?.messageId;
  if (typeof id === 'string') {
    const t = performance.now();
    if (!firstArrival) firstArrival = t;
    arrivals.set(id, t);
  }
  next();
});
app.use('/', jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));

process.on('SIGTERM', () => server.close(() => process.exit(0)));
console.log(JSON.stringify({ msg: 'reference listening', port }));

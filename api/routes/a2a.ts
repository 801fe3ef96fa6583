// A2A v0.3: the JSON-RPC endpoint and the agent card. Method logic lives in domain/a2a/.
import { defineRoute } from '../route.ts';
import { AnyQuery, ErrorBody, FreeObject } from '../../domain/shapes/common.ts';
import { JsonRpcEventStream, JsonRpcResponse } from '../../domain/shapes/jsonrpc.ts';
import { readJsonRpcBody } from '../middleware/body.ts';
import type { Principal } from '../middleware/auth.ts';
import type { Services } from '../../domain/services.ts';
import { TaskWaiter } from '../../domain/task-waiter.ts';
import { A2A_PATH, agentCard } from '../../domain/a2a/agent-card.ts';
import { A2ARequest, callsStream, dispatch, notesOf, PARSE_ERROR } from '../../domain/a2a/jsonrpc.ts';
import { writeSse } from '../a2a-sse.ts';
import { holdStream } from '../a2a-stream-quota.ts';
import { clientGone } from '../client-gone.ts';

const tag = 'a2a';

// One Redis subscription per process serves every stream and blocking call.
const waiters = new WeakMap<Services, TaskWaiter>();
const waiterOf = (s: Services) => {
  let w = waiters.get(s);
  if (!w) waiters.set(s, (w = new TaskWaiter(s.bus, s.log)));
  return w;
};

// Public, without credentials: a browser page on any origin (an A2A client or inspector running in
// it) may read it. The JSON-RPC endpoint sends no such header: it takes a key.
const cardRoute = (path: string, operationId: string) => defineRoute({
  method: 'get', path, operationId, tag, scope: null,
  summary: 'The A2A agent card (public; readable from any origin)',
  query: AnyQuery,
  responses: { 200: FreeObject },
}, async ({ ctx, services }) => {
  ctx.set('Access-Control-Allow-Origin', '*');
  return agentCard(services.cfg);
});

export const a2aRoutes = [
  defineRoute({
    method: 'post', path: A2A_PATH, operationId: 'a2a-jsonrpc', tag, scope: 'a2a', ownBody: A2ARequest,
    // Ignored, not refused: JSON-RPC clients answer only JSON-RPC, and a URL may carry a tracing or
    // cache-busting parameter (or the card's url one) that a REST 400 would turn into a broken client.
    query: AnyQuery,
    summary: 'A2A v0.3 JSON-RPC 2.0: message/send, message/stream (SSE), tasks/get, tasks/cancel, tasks/resubscribe (SSE), tasks/pushNotificationConfig/*, agent/getAuthenticatedExtendedCard',
    responses: { 200: JsonRpcResponse, 401: ErrorBody, 403: ErrorBody, 413: ErrorBody, 415: ErrorBody },
    moreResponseTypes: { 'text/event-stream': JsonRpcEventStream },
  }, async ({ ctx, services, log }) => {
    const read = await readJsonRpcBody(ctx, services.cfg.BODY_LIMIT_BYTES);
    ctx.status = 200;
    if (!('body' in read)) {
      ctx.body = PARSE_ERROR;
      return;
    }
    const { body } = read;
    const notes = notesOf(body, read.text);
    // Held from before the call (message/stream creates a task: a refusal must come first) to the
    // stream's end, which comes early when the client goes or the key is revoked.
    const held = callsStream(body, services.cfg, notes) ? await holdStream(services, (ctx.state.principal as Principal).id) : undefined;
    try {
      // Made when first read (blocking sends and streams wait on it): a non-blocking send, the hot
      // path, never does, and an AbortSignal with its 'close' listener is not free. Made late, it
      // still aborts at once for a client already gone (clientGone).
      let signal: AbortSignal | undefined;
      const signalOf = () => (signal ??= held ? AbortSignal.any([clientGone(ctx), held.signal]) : clientGone(ctx));
      const call = { services, waiter: waiterOf(services), get signal() { return signalOf(); } };
      const outcome = await dispatch(call, body, log, notes);
      if ('response' in outcome) ctx.body = outcome.response;
      else await writeSse(ctx, outcome.id, outcome.stream, log, signalOf(), held?.signal);
    } finally {
      held?.release();
    }
  }),

  cardRoute(`${A2A_PATH}/.well-known/agent.json`, 'a2a-agent-card-legacy'),
  cardRoute(`${A2A_PATH}/.well-known/agent-card.json`, 'a2a-agent-card'),
  cardRoute('/.well-known/agent-card.json', 'agent-card'),

  defineRoute({
    method: 'get', path: `${A2A_PATH}/agent/authenticatedExtendedCard`, operationId: 'a2a-extended-agent-card', tag, scope: 'a2a',
    summary: 'The extended A2A agent card, for authenticated callers',
    query: AnyQuery,
    responses: { 200: FreeObject, 401: ErrorBody, 403: ErrorBody },
  }, async ({ services }) => agentCard(services.cfg, { extended: true })),
];

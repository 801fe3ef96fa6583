// Writes an A2A stream as Server-Sent Events: one JSON-RPC response per `data:` line, closed
// right after the last event. A client that goes away ends the writing, never the task.
import type { Context } from 'koa';
import type { Logger } from '../domain/logger.ts';
import type { RpcId } from '../domain/a2a/jsonrpc.ts';
import { logRpcError, toJsonRpcError } from '../domain/a2a/errors.ts';
import type { Task as A2ATask } from '@a2a-js/sdk';
import type { TaskStream } from '../domain/a2a/methods.ts';
import type { StreamEvent } from '../domain/a2a/events.ts';
import { stepper } from '../domain/let-go.ts';
import { isTerminal } from '../domain/task-states.ts';

// Comment lines keep idle proxies from closing a stream that waits on a slow agent.
const KEEPALIVE_MS = 15_000;

// `gone`: the call's signal, aborted when the client goes (also before this is called) or the
// stream must end (its key revoked); writing stops then. `revoked`: aborted (its reason the error
// the key's next call gets) when the key is revoked, which the client is told, as a last event.
export async function writeSse(ctx: Context, id: RpcId, stream: TaskStream, log: Logger, gone: AbortSignal, revoked?: AbortSignal): Promise<void> {
  const res = ctx.res;
  ctx.respond = false;
  ctx.status = 200;
  // No Connection header of ours: Node keeps the connection alive, and a stopping API process has
  // set it to close (api/main.ts), which a stream answered then must say too.
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no' });
  const keepalive = setInterval(() => { if (!gone.aborted) res.write(': keep-alive\n\n'); }, KEEPALIVE_MS);
  const write = (payload: unknown) => res.write(`data: ${JSON.stringify(payload)}\n\n`);
  const send = async (payload: unknown) => {
    if (gone.aborted) return;
    if (!write(payload)) {
      await new Promise<void>((resolve) => {
        const done = () => { res.off('drain', done); gone.removeEventListener('abort', done); resolve(); };
        res.on('drain', done);
        gone.addEventListener('abort', done, { once: true });
      });
    }
  };
  // A stream that has sent its final event, its task in an ended state, or an error has told its
  // client all there is to tell. (Not a message: the timeline's messages come mid-stream here.)
  let told = false;
  const sendResult = async (result: A2ATask | StreamEvent) => {
    await send({ jsonrpc: '2.0', id, result });
    return result.kind === 'task' ? isTerminal(result.status.state) : 'final' in result && result.final === true;
  };
  // Stepped through rather than `for await`, which would keep the result it last sent (the
  // snapshot, say) for as long as it waits for the next.
  const results = stepper(stream);
  try {
    while (await results.more()) {
      if (gone.aborted) break;
      told = await sendResult(results.take());
    }
  } catch (err) {
    const error = toJsonRpcError(err);
    logRpcError(log, err, error, {}, 'a2a stream failed');
    told = !gone.aborted;
    await send({ jsonrpc: '2.0', id, error });
  } finally {
    // A loop left early (the client gone) ends the stream, as `for await` would.
    await results.done()?.catch(() => undefined);
    clearInterval(keepalive);
    // Cut short by its key's revocation, a stream says so rather than just ending, which a client
    // takes for a dropped connection and resubscribes after. A client already gone is told nothing.
    if (revoked?.aborted && !told && !res.destroyed) write({ jsonrpc: '2.0', id, error: toJsonRpcError(revoked.reason) });
    res.end();
  }
}

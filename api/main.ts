// The `web` process: the HTTP API.
import http, { type ServerResponse } from 'node:http';
import net from 'node:net';
import { exitOnConfigError, loadConfigOrExit, warnOfLookalikeVariables } from '../domain/config.ts';
import { createServices } from '../domain/services.ts';
import { bootstrap } from '../domain/bootstrap.ts';
import { waitForBackingServices } from '../domain/startup.ts';
import { startKeyringInvalidation } from '../domain/keyring.ts';
import { allRoutes, createApp } from './app.ts';
import { answerClientErrors } from './client-errors.ts';
import { countHttpAnswer } from './metrics.ts';
import { API_KEY_REVOKED, catchUpOnRevocations, forgetApiKey } from './middleware/auth.ts';
import { listenPg } from '../db/pg-listener.ts';
import { API_CLOSE_MS, exitIfNotStoppedWithin, onStop } from '../domain/stop-signals.ts';

const cfg = loadConfigOrExit();
const services = createServices(cfg, 'api');
warnOfLookalikeVariables(services.log);
await waitForBackingServices(services).catch(exitOnConfigError);
await bootstrap(services).catch(exitOnConfigError);
await startKeyringInvalidation(services);
const keyRevocations = await listenPg(cfg.DATABASE_URL, { [API_KEY_REVOKED]: forgetApiKey }, services.log, {
  onReconnect: () => void catchUpOnRevocations(services).catch((err: Error) => services.log.warn({ err: { message: err.message } }, 'could not catch up on API key revocations; open streams of keys revoked meanwhile stay until their task ends')),
});
services.outbox.startSweeper();
const app = createApp(services);
// A missing Host is refused in Koa (api/app.ts), with the Error body: Node's own check answers 400 bare.
// A request not received whole within API_REQUEST_TIMEOUT_MS (its headers within the least of that
// and 60 s, and within 60 s when it is 0: Node would then wait for headers for ever) is answered 408
// (api/client-errors.ts). Node looks for those every 30 s; a shorter timeout is looked for more often,
// or it would be overrun by up to 30 s.
const requestTimeout = cfg.API_REQUEST_TIMEOUT_MS;
const headersTimeout = requestTimeout ? Math.min(60_000, requestTimeout) : 60_000;
const connectionsCheckingInterval = requestTimeout ? Math.min(30_000, Math.max(100, Math.floor(requestTimeout / 4))) : 30_000;
const server = http.createServer({ requireHostHeader: false, requestTimeout, headersTimeout, connectionsCheckingInterval }, app.callback()).listen(cfg.PORT, cfg.HOST, () => {
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : cfg.PORT;
  services.log.info({ port, url: `http://${cfg.HOST}:${port}` }, 'api listening');
});
// A port taken or a HOST that is no address of this machine: one line saying which, not a stack.
const cannotListen = (err: NodeJS.ErrnoException) => {
  services.log.fatal({ code: err.code }, `cannot listen on ${cfg.HOST}:${cfg.PORT} (HOST, PORT): ${err.message}`);
  process.exit(1);
};
server.once('error', cannotListen);
server.once('listening', () => server.off('error', cannotListen));
server.keepAliveTimeout = 65_000;
// Answers given once closing (after the signal and API_SHUTDOWN_DELAY_MS) say `Connection: close`,
// so a keep-alive client (a load balancer) sends its next request on a new connection, which is
// refused, rather than on this one, which is closed once idle: a request written onto a connection
// being closed is reset, and the client cannot tell whether it was taken. Those in flight then are told too.
let closing = false;
const answering = new Set<ServerResponse>();
// A client that stops reading pins its answer in memory (a task's history and artifacts: tens of
// MiB each) and, on a stream, its A2A_STREAMS_PER_KEY place, for as long as it keeps the connection.
// The socket's timer restarts whenever bytes move, so only an answer that makes no progress is cut.
const stalled = (res: ServerResponse) => { if (res.socket && res.socket.writableLength > 0) res.socket.destroy(); };
server.on('request', (_req, res: ServerResponse) => {
  if (cfg.API_WRITE_STALL_MS) res.setTimeout(cfg.API_WRITE_STALL_MS, () => stalled(res));
  if (closing) return void res.setHeader('Connection', 'close');
  answering.add(res);
  res.once('close', () => answering.delete(res));
});
answerClientErrors(server, allRoutes.map((r) => r.spec.method), services.log, countHttpAnswer(services));

// How long after the signal (and API_SHUTDOWN_DELAY_MS) idle keep-alive connections are left open, for requests already sent on them to be read.
const IDLE_CLOSE_DELAY_MS = 1000;
// Ends API_SHUTDOWN_DELAY_MS early: a second signal (Ctrl-C again, an operator in a hurry) is not kept waiting.
let endDelay: (() => void) | undefined;
async function shutdown(signal: string) {
  if (services.stopping) {
    if (endDelay) services.log.info({ signal }, 'api stopping: signalled again, the delay ends now');
    endDelay?.();
    return;
  }
  services.stopping = true;
  if (cfg.API_SHUTDOWN_DELAY_MS) {
    services.log.info({ signal, delay_ms: cfg.API_SHUTDOWN_DELAY_MS }, 'api stopping: not ready, serving on until the delay ends');
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, cfg.API_SHUTDOWN_DELAY_MS);
      endDelay = () => { clearTimeout(timer); resolve(); };
    });
    endDelay = undefined;
  }
  closing = true;
  services.log.info({ signal, grace_ms: cfg.API_SHUTDOWN_GRACE_MS }, 'api shutting down: finishing requests in flight');
  for (const res of answering) if (!res.headersSent) res.setHeader('Connection', 'close');
  // No new connections; requests in flight finish (their connections close once answered) for up
  // to API_SHUTDOWN_GRACE_MS, then whatever is still open (streams, long blocking sends) is cut.
  // Not http's close(): it closes idle connections at once, and under load a connection counts as
  // idle while a request sent on it waits unread, which would be reset. Those are read (and
  // answered with Connection: close) first; connections still idle after that are closed.
  const drained = new Promise<boolean>((resolve) => net.Server.prototype.close.call(server, () => resolve(true)));
  let closeIdle: NodeJS.Timeout | undefined;
  const startClosingIdle = setTimeout(() => {
    server.closeIdleConnections();
    closeIdle = setInterval(() => server.closeIdleConnections(), 100);
  }, IDLE_CLOSE_DELAY_MS);
  const timeUp = new Promise<boolean>((resolve) => setTimeout(() => resolve(false), cfg.API_SHUTDOWN_GRACE_MS).unref());
  const inTime = await Promise.race([drained, timeUp]);
  clearTimeout(startClosingIdle);
  clearInterval(closeIdle);
  if (!inTime) {
    services.log.warn({ grace_ms: cfg.API_SHUTDOWN_GRACE_MS }, 'grace period over: connections still open (streams, blocking sends) are closed');
    server.closeAllConnections();
  }
  exitIfNotStoppedWithin(API_CLOSE_MS, () => services.log.error({ after_ms: API_CLOSE_MS }, 'api could not close its connections in time (Postgres or Redis unreachable, a statement still running); exiting'));
  await keyRevocations.close();
  await services.close();
  // Last, once everything closed: a process whose close timed out exits 1 without it.
  services.log.info('api stopped');
  process.exit(0);
}
onStop((why) => void shutdown(why));

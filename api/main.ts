// The `web` process: the HTTP API.
import { loadConfigOrExit } from '../domain/config.ts';
import { createServices } from '../domain/services.ts';
import { bootstrap } from '../domain/bootstrap.ts';
import { waitForBackingServices } from '../domain/startup.ts';
import { startKeyringInvalidation } from '../domain/keyring.ts';
import { allRoutes, createApp } from './app.ts';
import { answerClientErrors } from './client-errors.ts';
import { API_KEY_REVOKED, catchUpOnRevocations, forgetApiKey } from './middleware/auth.ts';
import { listenPg } from '../db/pg-listener.ts';
import { onStop } from '../domain/stop-signals.ts';

const cfg = loadConfigOrExit();
const services = createServices(cfg, 'api');
await waitForBackingServices(services);
await bootstrap(services);
await startKeyringInvalidation(services);
const keyRevocations = await listenPg(cfg.DATABASE_URL, { [API_KEY_REVOKED]: forgetApiKey }, services.log, {
  onReconnect: () => void catchUpOnRevocations(services).catch((err: Error) => services.log.warn({ err: { message: err.message } }, 'could not catch up on API key revocations; open streams of keys revoked meanwhile stay until their task ends')),
});
services.outbox.startSweeper();
const app = createApp(services);
const server = app.listen(cfg.PORT, cfg.HOST, () => {
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
answerClientErrors(server, allRoutes.map((r) => r.spec.method), services.log);

let stopping = false;
async function shutdown(signal: string) {
  if (stopping) return;
  stopping = true;
  services.log.info({ signal, grace_ms: cfg.API_SHUTDOWN_GRACE_MS }, 'api shutting down: finishing requests in flight');
  // No new connections; requests in flight finish (their connections close once answered) for up
  // to API_SHUTDOWN_GRACE_MS, then whatever is still open (streams, long blocking sends) is cut.
  const drained = new Promise<boolean>((resolve) => server.close(() => resolve(true)));
  // A keep-alive connection whose request is answered becomes idle, and stays open unless closed.
  const closeIdle = setInterval(() => server.closeIdleConnections(), 100);
  server.closeIdleConnections();
  const timeUp = new Promise<boolean>((resolve) => setTimeout(() => resolve(false), cfg.API_SHUTDOWN_GRACE_MS).unref());
  const inTime = await Promise.race([drained, timeUp]);
  clearInterval(closeIdle);
  if (!inTime) {
    services.log.warn({ grace_ms: cfg.API_SHUTDOWN_GRACE_MS }, 'grace period over: connections still open (streams, blocking sends) are closed');
    server.closeAllConnections();
  }
  await keyRevocations.close();
  await services.close();
  process.exit(0);
}
onStop((why) => void shutdown(why));

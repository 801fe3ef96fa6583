// The `web` process: the HTTP API.
import { loadConfigOrExit } from '../domain/config.ts';
import { createServices } from '../domain/services.ts';
import { bootstrap } from '../domain/bootstrap.ts';
import { waitForBackingServices } from '../domain/startup.ts';
import { startKeyringInvalidation } from '../domain/keyring.ts';
import { allRoutes, createApp } from './app.ts';
import { answerClientErrors } from './client-errors.ts';
import { API_KEY_REVOKED, forgetApiKey } from './middleware/auth.ts';
import { listenPg } from '../db/pg-listener.ts';

const cfg = loadConfigOrExit();
const services = createServices(cfg, 'api');
await waitForBackingServices(services);
await bootstrap(services);
await startKeyringInvalidation(services);
const keyRevocations = await listenPg(cfg.DATABASE_URL, { [API_KEY_REVOKED]: forgetApiKey }, services.log);
services.outbox.startSweeper();
const app = createApp(services);
const server = app.listen(cfg.PORT, cfg.HOST, () => {
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : cfg.PORT;
  services.log.info({ port, url: `http://${cfg.HOST}:${port}` }, 'api listening');
});
server.keepAliveTimeout = 65_000;
answerClientErrors(server, allRoutes.map((r) => r.spec.method));

let stopping = false;
async function shutdown(signal: string) {
  if (stopping) return;
  stopping = true;
  services.log.info({ signal }, 'api shutting down');
  server.close();
  server.closeIdleConnections();
  setTimeout(() => server.closeAllConnections(), 5000).unref();
  await keyRevocations.close();
  await services.close();
  process.exit(0);
}
process.on('SIGTERM', () => void shutdown('SIGTERM'));
process.on('SIGINT', () => void shutdown('SIGINT'));

// Starts test/fixtures/oauth-server.ts as its own process (a real OAuth server, not a stub in the test),
// and a stack whose Google OAuth endpoints are that server's and whose Gmail is a local fake.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { ROOT, startStack, type Stack } from './stack.ts';
import { startFakeProviders, type FakeProviders } from './fake-providers.ts';
import type { Mode } from '../fixtures/oauth-server.ts';

// `inMode`: runs `use` with the server in `mode`, and puts it back to 'ok' after, however `use` ends.
// `held`: token requests the server holds ('hold-next'); `release` lets them through.
export interface OAuthServer {
  url: string; setMode(mode: Mode): Promise<void>; inMode<T>(mode: Mode, use: () => Promise<T>): Promise<T>; refreshes(): Promise<number>;
  held(): Promise<number>; release(): Promise<void>; stop(): void;
}

export function startOAuthServer(clientSecret: string): Promise<OAuthServer> {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, 'test/fixtures/oauth-server.ts')], {
    cwd: ROOT, env: { ...process.env, OAUTH_CLIENT_SECRET: clientSecret }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  child.stderr!.on('data', (b: Buffer) => { err = (err + b.toString()).slice(-2000); });
  return new Promise((resolve, reject) => {
    let out = '';
    child.once('exit', (code) => reject(new Error(`the OAuth server exited (${code}): ${err}`)));
    child.stdout!.on('data', (b: Buffer) => {
      out += b.toString();
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (!line) return;
      const { url } = JSON.parse(line) as { url: string };
      child.removeAllListeners('exit');
      const setMode = async (mode: Mode) => {
        const r = await fetch(`${url}/admin/mode`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode }) });
        if (r.status !== 204) throw new Error(`mode answered ${r.status}`);
      };
      const stats = async () => (await (await fetch(`${url}/admin/stats`)).json()) as { refreshes: number; held: number };
      resolve({
        url,
        setMode,
        async inMode(mode, use) {
          await setMode(mode);
          try {
            return await use();
          } finally {
            await setMode('ok');
          }
        },
        refreshes: async () => (await stats()).refreshes,
        held: async () => (await stats()).held,
        async release() {
          const r = await fetch(`${url}/admin/release`, { method: 'POST' });
          if (r.status !== 204) throw new Error(`release answered ${r.status}`);
        },
        stop: () => { child.kill('SIGTERM'); },
      });
    });
  });
}

export interface OAuthStack { stack: Stack; oauth: OAuthServer; providers: FakeProviders; stop(): Promise<void> }

export async function startOAuthStack(clientSecret: string, env: Record<string, string>, opts: { workers?: number } = {}): Promise<OAuthStack> {
  const oauth = await startOAuthServer(clientSecret);
  const providers = await startFakeProviders();
  const stack = await startStack({
    GOOGLE_OAUTH_AUTHORIZE_URL: `${oauth.url}/authorize`, GOOGLE_OAUTH_TOKEN_URL: `${oauth.url}/token`,
    GOOGLE_MAIL_API_BASE_URL: providers.url, BRIDGE_ALLOW_PRIVATE: 'true', ...env,
  }, opts);
  return {
    stack, oauth, providers,
    async stop() {
      await stack.stop();
      oauth.stop();
      providers.close();
    },
  };
}

// What the user's browser does at the provider's consent page: it is redirected back; the callback URL it goes to.
export async function consent(authorizeUrl: string): Promise<string> {
  const r = await fetch(authorizeUrl, { redirect: 'manual' });
  assert.equal(r.status, 302);
  return r.headers.get('location')!;
}

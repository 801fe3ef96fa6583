import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { remoteKeyOrigins } from '../../domain/config.ts';
import type { Services } from '../../domain/services.ts';
import { demoAgent } from './demo.ts';
import { thrownValue } from '../fail-run.ts';
import type { Agent, AgentHandler } from './types.ts';

// An agent the configuration names that cannot be used: the worker says why and exits.
export class AgentConfigError extends Error {}

// Why a module did not load: the first lines of its error's message (a transform error's first line
// does not say where), or what its top level threw that was no Error.
function loadFailure(err: unknown): string {
  try {
    const message = (err as { message?: unknown } | null)?.message;
    if (typeof message === 'string') return message.split('\n').slice(0, 3).join(' ').trim();
    return `its top level threw ${thrownValue(err)}`;
  } catch {
    return 'its top level threw a value that could not be read';
  }
}

// Picks the agent the configuration names: the demo agent, or a module exporting a handler
// (default export or `handler`).
export async function resolveAgent({ cfg, db, log }: Services): Promise<Agent> {
  switch (cfg.AGENT_KIND) {
    case 'demo':
      return { handler: demoAgent };
    case 'module': {
      const file = path.resolve(cfg.AGENT_MODULE!);
      let mod: { default?: { handler?: unknown; default?: unknown } | ((...a: unknown[]) => unknown); handler?: unknown };
      try {
        mod = await import(pathToFileURL(file).href);
      } catch (err) {
        throw new AgentConfigError(`AGENT_MODULE ${file} could not be loaded: ${loadFailure(err)}`, { cause: err });
      }
      // ESM default or named export; CommonJS module.exports = fn, exports.handler = fn or exports.default = fn.
      const cjs = typeof mod.default === 'object' && mod.default !== null ? mod.default : {};
      const handler = [mod.default, mod.handler, cjs.handler, cjs.default].find((h) => typeof h === 'function');
      if (typeof handler !== 'function') throw new AgentConfigError(`AGENT_MODULE ${file} exports no handler function (default export or "handler")`);
      return { handler: handler as AgentHandler };
    }
    case 'remote': {
      const { remoteAgent } = await import('./remote-a2a.ts');
      return remoteAgent({ url: cfg.AGENT_REMOTE_URL!, apiKey: cfg.AGENT_REMOTE_API_KEY, keyOrigins: remoteKeyOrigins(cfg), allowPrivate: cfg.AGENT_REMOTE_ALLOW_PRIVATE, timeoutMs: cfg.AGENT_REMOTE_TIMEOUT_MS, db, log });
    }
  }
}

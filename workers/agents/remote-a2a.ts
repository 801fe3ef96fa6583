import type { AgentHandler } from './types.ts';

// Placeholder until the A2A bridge lands: configuring AGENT_KIND=remote fails at start with a
// clear message instead of at the first task.
export function remoteAgent(url: string): AgentHandler {
  throw new Error(`AGENT_KIND=remote (${url}) is not supported yet`);
}

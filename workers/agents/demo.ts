// The built-in demo agent: echoes the user's text. Directives in the text exercise the runtime:
//   [input]       ask for more input (input-required); the next user message continues the task
//   [sleep N]     work for N ms first (observes cancellation)
//   [fail]        throw, so the runtime retries and finally fails the task
//   [artifact]    also emit an artifact holding the echoed text
// A sender whose accepted output modes take JSON but not text gets the echo as a data part.
import { setTimeout as sleep } from 'node:timers/promises';
import { acceptsOutput, textOf, type AgentHandler } from './types.ts';

// Safe to repeat, as every agent must be (a run is tried again after a crash or a shutdown hand-back):
// what an earlier try of this run wrote is not written twice.
export const demoAgent: AgentHandler = async (ctx) => {
  const text = textOf(ctx.message);
  const wait = /\[sleep (\d{1,7})\]/.exec(text);
  if (wait) {
    const since = ctx.history.slice(ctx.history.findIndex((m) => m.id === ctx.message.id) + 1);
    const progress = `Working for ${wait[1]} ms`;
    if (!since.some((m) => m.role === 'agent' && textOf(m) === progress)) await ctx.setStatus('working', progress);
    await sleep(Number(wait[1]), undefined, { signal: ctx.signal });
  }
  if (text.includes('[fail]')) throw new Error('the demo agent was asked to fail ([fail] directive)');
  if (text.includes('[input]')) return { status: 'input-required', message: 'I need more input: what should I echo next?' };
  // Named after the run's message: a repeated run updates the same artifact instead of adding one.
  if (text.includes('[artifact]')) await ctx.emitArtifact({ artifactId: `echo-${ctx.message.id}`, name: 'echo', parts: [{ kind: 'text', text }] });
  const turns = ctx.history.filter((m) => m.role === 'user').length;
  const echo = turns > 1 ? `Echo (turn ${turns}): ${text}` : `Echo: ${text}`;
  if (!acceptsOutput(ctx.message, 'text/plain') && acceptsOutput(ctx.message, 'application/json')) {
    return { status: 'completed', message: [{ type: 'data-part', data: { echo } }] };
  }
  return { status: 'completed', message: echo };
};

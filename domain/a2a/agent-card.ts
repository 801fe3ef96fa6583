// The A2A agent card, built from configuration. Capabilities say only what works.
import type { AgentCard } from '@a2a-js/sdk';
import type { Config } from '../config.ts';
import { BEARER_SCHEME, parseSkills } from './skills.ts';
import { SERVICE_VERSION } from '../version.ts';

export const A2A_PATH = '/api/a2a/v1';


const cards = new WeakMap<Config, { card: AgentCard; extended: AgentCard }>();

function build(cfg: Config): { card: AgentCard; extended: AgentCard } {
  const url = cfg.PUBLIC_URL + A2A_PATH;
  const card: AgentCard = {
    protocolVersion: '0.3.0',
    name: cfg.AGENT_NAME,
    description: cfg.AGENT_DESCRIPTION,
    version: SERVICE_VERSION,
    url,
    preferredTransport: 'JSONRPC',
    additionalInterfaces: [{ url, transport: 'JSONRPC' }],
    capabilities: { streaming: cfg.A2A_STREAMING, pushNotifications: cfg.A2A_PUSH_NOTIFICATIONS, stateTransitionHistory: false },
    defaultInputModes: ['text/plain', 'application/json'],
    defaultOutputModes: ['text/plain', 'application/json'],
    skills: parseSkills(cfg.AGENT_SKILLS_JSON),
    securitySchemes: { [BEARER_SCHEME]: { type: 'http', scheme: 'bearer', description: 'An API key of this service with the a2a scope: Authorization: Bearer <api key>' } },
    security: [{ [BEARER_SCHEME]: [] }],
    supportsAuthenticatedExtendedCard: true,
  };
  // The extended card adds what only key holders need: where the full HTTP API is described.
  const extended: AgentCard = { ...card, documentationUrl: `${cfg.PUBLIC_URL}/api/openapi.json` };
  return { card, extended };
}

export function agentCard(cfg: Config, opts: { extended?: boolean } = {}): AgentCard {
  let built = cards.get(cfg);
  if (!built) cards.set(cfg, (built = build(cfg)));
  return opts.extended ? built.extended : built.card;
}

// The skills the agent card advertises: AGENT_SKILLS_JSON, or one describing the configured agent.
// Kept free of other imports so domain/config.ts can validate the setting at start.
import { Type, type Static } from '@sinclair/typebox';
import { Ajv, type ErrorObject } from 'ajv';
import type { AgentSkill } from '@a2a-js/sdk';

// The one security scheme the agent card declares (agent-card.ts): all a skill's requirements can name.
export const BEARER_SCHEME = 'bearer';

// A2A v0.3's AgentSkill, its members only: one it does not have (a misspelt `example`) would be served
// as configured and read by no client, and a `security` of another shape ends the 1.x SDK client's
// card resolution (compat.security.map is not a function), for every client of the agent.
const Skill = Type.Object({
  id: Type.String({ minLength: 1 }),
  name: Type.String({ minLength: 1 }),
  description: Type.String(),
  tags: Type.Array(Type.String()),
  examples: Type.Optional(Type.Array(Type.String())),
  inputModes: Type.Optional(Type.Array(Type.String())),
  outputModes: Type.Optional(Type.Array(Type.String())),
  security: Type.Optional(Type.Array(Type.Record(Type.String(), Type.Array(Type.String()), { propertyNames: { const: BEARER_SCHEME } }))),
}, { additionalProperties: false });
const Skills = Type.Array(Skill, { minItems: 1 });
const validateSkills = new Ajv({ allErrors: true, strict: false }).compile(Skills);

const DEFAULT_SKILLS: AgentSkill[] = [{
  id: 'run-task',
  name: 'Run a task',
  description: 'Runs the configured agent on a message; the task can ask for more input, stream progress and produce artifacts.',
  tags: ['tasks', 'agent'],
  examples: ['Summarise this text', 'Echo: hello'],
}];

const said = (e: ErrorObject) => {
  const { additionalProperty } = e.params as { additionalProperty?: string };
  const { propertyName } = e as { propertyName?: string }; // set on the errors of a property name's check
  if (additionalProperty !== undefined) return `has a member A2A's AgentSkill does not: ${additionalProperty}`;
  if (propertyName !== undefined) return `names the security scheme '${propertyName}': the agent card declares only '${BEARER_SCHEME}'`;
  return e.message;
};

/** Parses AGENT_SKILLS_JSON; throws an Error saying what is wrong (used by config validation). */
export function parseSkills(json: string | undefined): AgentSkill[] {
  if (json === undefined) return DEFAULT_SKILLS;
  let value: unknown;
  try { value = JSON.parse(json); } catch (e) { throw new Error(`is not valid JSON: ${(e as Error).message}`); }
  if (!validateSkills(value)) {
    const e = validateSkills.errors![0];
    throw new Error(`must be a non-empty array of skills {id, name, description, tags}: ${e.instancePath || '(root)'} ${said(e)}`);
  }
  const skills = value as Static<typeof Skills>;
  // A2A: a skill's id identifies it among the agent's; a second of the same id is one no client can tell apart.
  const twice = skills.findIndex((k, i) => skills.findIndex((o) => o.id === k.id) < i);
  if (twice >= 0) throw new Error(`has two skills with the id '${skills[twice].id}' (/${twice}): each skill needs an id of its own`);
  return skills;
}

// The skills the agent card advertises: AGENT_SKILLS_JSON, or one describing the configured agent.
// Kept free of other imports so domain/config.ts can validate the setting at start.
import { Type, type Static } from '@sinclair/typebox';
import { Ajv } from 'ajv';
import type { AgentSkill } from '@a2a-js/sdk';

const Skill = Type.Object({
  id: Type.String({ minLength: 1 }),
  name: Type.String({ minLength: 1 }),
  description: Type.String(),
  tags: Type.Array(Type.String()),
  examples: Type.Optional(Type.Array(Type.String())),
  inputModes: Type.Optional(Type.Array(Type.String())),
  outputModes: Type.Optional(Type.Array(Type.String())),
});
const Skills = Type.Array(Skill, { minItems: 1 });
const validateSkills = new Ajv({ allErrors: true, strict: false }).compile(Skills);

const DEFAULT_SKILLS: AgentSkill[] = [{
  id: 'run-task',
  name: 'Run a task',
  description: 'Runs the configured agent on a message; the task can ask for more input, stream progress and produce artifacts.',
  tags: ['tasks', 'agent'],
  examples: ['Summarise this text', 'Echo: hello'],
}];

/** Parses AGENT_SKILLS_JSON; throws an Error saying what is wrong (used by config validation). */
export function parseSkills(json: string | undefined): AgentSkill[] {
  if (json === undefined) return DEFAULT_SKILLS;
  let value: unknown;
  try { value = JSON.parse(json); } catch (e) { throw new Error(`is not valid JSON: ${(e as Error).message}`); }
  if (!validateSkills(value)) {
    const e = validateSkills.errors![0];
    throw new Error(`must be a non-empty array of skills {id, name, description, tags}: ${e.instancePath || '(root)'} ${e.message}`);
  }
  return value as Static<typeof Skills>;
}

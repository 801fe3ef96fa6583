import { Conflict } from './errors.ts';

export const TASK_STATES = ['submitted', 'working', 'input-required', 'auth-required', 'completed', 'canceled', 'failed', 'rejected', 'unknown'] as const;
export type TaskState = (typeof TASK_STATES)[number];

export const TERMINAL_STATES: readonly TaskState[] = ['completed', 'canceled', 'failed', 'rejected'];
export const INTERRUPTED_STATES: readonly TaskState[] = ['input-required', 'auth-required'];

const ALLOWED: Record<TaskState, readonly TaskState[]> = {
  submitted: ['working', 'canceled', 'rejected', 'failed'],
  working: ['working', 'input-required', 'auth-required', 'completed', 'failed', 'canceled'],
  'input-required': ['working', 'canceled', 'failed'],
  'auth-required': ['working', 'canceled', 'failed'],
  completed: [],
  canceled: [],
  failed: [],
  rejected: [],
  unknown: [],
};

// The states from which `to` may be entered.
export function allowedFrom(to: TaskState): TaskState[] {
  return TASK_STATES.filter((from) => ALLOWED[from].includes(to));
}

export const isTerminal = (s: TaskState) => TERMINAL_STATES.includes(s);
export const isInterrupted = (s: TaskState) => INTERRUPTED_STATES.includes(s);

export function assertTransition(from: TaskState, to: TaskState): void {
  if (!ALLOWED[from].includes(to)) {
    const why = isTerminal(from) ? `the task is already ${from}` : `'${to}' cannot follow '${from}'`;
    throw new Conflict(`Illegal status transition from '${from}' to '${to}': ${why}`, { from, to });
  }
}

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

// The states an agent run may end in (its return value), and from which states that end applies:
// only while the task is still active. A run may reject a task it has started to look at:
// working -> rejected is the run's to make, though PUT may not (the table above, SPEC section 3).
// canceled: an agent may give its task up itself, as a remote agent whose task was canceled there does.
export const RUN_RESULTS: readonly TaskState[] = ['completed', 'input-required', 'auth-required', 'failed', 'rejected', 'canceled'];
export const runEndsFrom = (to: TaskState): TaskState[] => (to === 'rejected' ? ['submitted', 'working'] : allowedFrom(to).filter((s) => !isTerminal(s)));
export const isInterrupted = (s: TaskState) => INTERRUPTED_STATES.includes(s);

// A run may start a task that is new or waits for input: the states in which a task can be owed one.
export const RUN_STARTS_FROM: readonly TaskState[] = ['submitted', ...INTERRUPTED_STATES];

// The run a task is under once a client changed its status: none. A client that sets a task waiting
// for input, or working, takes it from its run, which must not end it or write to it after (nor a
// retry of it, nor job recovery). Null cannot say this: tasks from before migration 0009 name no run
// and are any run's. Runs are named by random message ids, never this one.
export const CLIENT_RUN = '00000000-0000-0000-0000-000000000000';

// Whether a task is still the run's (of its trigger message): working, under that run. Tasks from
// before migration 0009 name no run. (The status-change statement applies the same rule in SQL.)
export const workingUnder = (task: { status: TaskState; run_message_id?: string | null }, messageId: string) =>
  task.status === 'working' && (!task.run_message_id || task.run_message_id === messageId);

// Whether a task is still held by this take of the run's job (migration 0037's run_attempt): working
// under the run, and not taken again since by another take (a copy started where this one stalled).
export const heldByTake = (task: { status: TaskState; run_message_id?: string | null; run_attempt?: number }, run: { messageId: string; attempt: number }) =>
  workingUnder(task, run.messageId) && task.run_attempt === run.attempt;

export function assertTransition(from: TaskState, to: TaskState): void {
  if (!ALLOWED[from].includes(to)) {
    const why = isTerminal(from) ? `the task is already ${from}` : `'${to}' cannot follow '${from}'`;
    throw new Conflict(`Illegal status transition from '${from}' to '${to}': ${why}`, { from, to });
  }
}

// A client's working -> working is a progress update: its message is the update (SPEC section 3).
// Without one it would say nothing, yet append a timeline item (which no byte cap counts) and drop
// the task's status message. (An agent run's progress may go without one: ctx.setStatus.)
export function assertProgressMessage(from: TaskState, to: TaskState, withMessage: boolean): void {
  if (from === 'working' && to === 'working' && !withMessage) {
    throw new Conflict(`Status 'working' of a working task is a progress update: it needs its progress message ('message')`, { from, to });
  }
}

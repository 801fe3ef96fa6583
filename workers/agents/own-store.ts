// Failures of this service's own Postgres met by a built-in agent's bookkeeping (the remote agent's
// rows of its remote tasks). The runtime takes an outage among them as it takes its own: the run goes
// back to the queue without using up an attempt (run-agent-task.ts). They are told apart by where
// they were thrown, not by their shape: a remote agent out of reach fails with the same codes
// (ECONNREFUSED), and that is the run's failure.
const failures = new WeakSet<object>();

export async function ownStore<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (err) {
    if (typeof err === 'object' && err !== null) failures.add(err);
    throw err;
  }
}

/** The failure of our own store that `err` is, or wraps as its cause. */
export function ownStoreFailure(err: unknown): object | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  if (failures.has(err)) return err;
  const { cause } = err as { cause?: unknown };
  return typeof cause === 'object' && cause !== null && failures.has(cause) ? cause : undefined;
}

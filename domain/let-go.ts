/**
 * Steps through `source`, each value let go of once taken. A `for await` or `yield*` keeps the step
 * it last took while it waits for the next one: an A2A stream waiting for its task to move held the
 * last event it sent (its snapshot, a message or artifact of megabytes) for as long as it waited.
 */
export function stepper<T>(source: AsyncIterator<T>) {
  let step: IteratorResult<T> | undefined;
  return {
    /** Whether `source` gave another value (then `take` it). */
    async more(): Promise<boolean> {
      step = await source.next();
      return !step.done;
    },
    take(): T {
      const { value } = step as IteratorYieldResult<T>;
      step = undefined;
      return value;
    },
    done: () => source.return?.(undefined),
  };
}

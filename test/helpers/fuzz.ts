// What the hostile-input sweeps share: the fast-check seed (FUZZ_SEED replays a failure) and
// requests and answers cut to a readable length in failure messages.
export const FUZZ_SEED = Number(process.env.FUZZ_SEED ?? 20261125);

export const truncate = (v: unknown, n = 600) => {
  const s = typeof v === 'string' ? v : JSON.stringify(v) ?? String(v);
  return s.length > n ? `${s.slice(0, n)}… (${s.length} chars)` : s;
};

// Which secrets an alias rotation's walk and sweep take, and how many it has left of them: shared by
// the rotation (alias-rotation.ts) and the end of a key job (crypto/key-jobs.ts), which counts them
// into the total of a rotation that ends before it completes.
import type { Tx } from '../db/knex.ts';
import type { KeyJobRow } from '../db/key-jobs.ts';
import { countSecretsToRotate, type RotationPass } from '../db/secrets.ts';

// The walk takes the secrets last written before the job started; the sweep, after the repoint, those since.
export const secretPass = (phase: 'walk' | 'sweep', startedAt: Date, afterId: string | null): RotationPass =>
  ({ afterId, written: phase === 'sweep' ? { since: startedAt } : { before: startedAt } });

// The secrets a rotation in its walk or sweep has still to move: those after its cursor in the pass it
// is in and, during the walk, all its sweep will take. Each secret is in one pass only, so none is
// counted twice; one the walk could not open stays under its old DEK behind the cursor, counted as
// failed, not here. Undefined outside those phases.
export async function secretsLeftToRotate(db: Tx, job: KeyJobRow): Promise<number | undefined> {
  const { alias, new_dek_id: newDekId, phase } = job.params as { alias: string; new_dek_id?: string; phase?: string };
  if (!newDekId || !job.started_at || (phase !== 'walk' && phase !== 'sweep')) return undefined;
  const sweep = await countSecretsToRotate(db, alias, newDekId, secretPass('sweep', job.started_at, phase === 'sweep' ? job.cursor : null));
  if (phase === 'sweep') return sweep;
  return sweep + await countSecretsToRotate(db, alias, newDekId, secretPass('walk', job.started_at, job.cursor));
}

// What a statement's plan read (EXPLAIN ANALYZE of the statements db/ sends), not times: tests of
// reads that must not walk all of a long task's rows.
import pg from 'pg';
import { testDb } from './stack.ts';

export interface Sent { text: string; values: unknown[] }

// The statements that name `table` sent through any pg client while `run` runs (knex's and the
// prepared reads of db/knex.ts pgQuery alike).
export async function statementsOn(table: string, run: () => Promise<unknown>): Promise<Sent[]> {
  const seen: Sent[] = [];
  const proto = pg.Client.prototype as unknown as { query: (...args: unknown[]) => unknown };
  const original = proto.query;
  proto.query = function (this: unknown, ...args: unknown[]) {
    const [config, values] = args;
    const text = typeof config === 'string' ? config : (config as { text?: string })?.text;
    if (text?.includes(table)) seen.push({ text, values: (typeof config === 'string' ? values : (config as { values?: unknown[] }).values) as unknown[] ?? [] });
    return original.apply(this, args);
  };
  try {
    await run();
  } finally {
    proto.query = original;
  }
  return seen;
}

// The rows of `table` the statements' plans read: those their scans returned and those their
// filters dropped, over all their loops.
export async function rowsRead(table: string, statements: Sent[]): Promise<number> {
  return (await plansOn(table, statements)).reduce((sum, node) => {
    const n = (k: string) => Number(node[k] ?? 0);
    return sum + (n('Actual Rows') + n('Rows Removed by Filter') + n('Rows Removed by Index Recheck')) * n('Actual Loops');
  }, 0);
}

// The plan nodes of each statement that read `table`.
export async function plansOn(table: string, statements: Sent[]): Promise<Record<string, unknown>[]> {
  const nodes: Record<string, unknown>[] = [];
  const client = testDb().client as { acquireConnection(): Promise<pg.Client>; releaseConnection(c: pg.Client): Promise<void> };
  const connection = await client.acquireConnection();
  try {
    for (const s of statements) {
      const { rows: [row] } = await connection.query(`explain (analyze, format json) ${s.text}`, s.values);
      const walk = (node: Record<string, unknown>) => {
        if (node['Relation Name'] === table) nodes.push(node);
        for (const child of (node.Plans ?? []) as Record<string, unknown>[]) walk(child);
      };
      walk(row['QUERY PLAN'][0].Plan);
    }
  } finally {
    await client.releaseConnection(connection);
  }
  return nodes;
}

// `npm run bench:a2a`: A2A task intake. Starts a real stack (local Postgres with normal
// durability, Redis with AOF, the API and one worker process running the demo echo agent) and,
// in the same run, the reference in-memory A2A server built from @a2a-js/sdk's server classes
// with an equivalent echo executor (bench/reference-a2a-server.ts). Against both it measures:
//   1. load, in BENCH_ROUNDS (3) rounds that each load ours, the floor, then the reference, so that
//      a noisy neighbour on a shared machine weighs on every side of a round: BENCH_CONNECTIONS (32)
//      clients sending non-blocking message/send for BENCH_SECONDS (10): tasks accepted/s, tasks
//      completed/s, start latency under load; ratios per round, and the round with the median one.
//      The floor (bench/floor-a2a.ts) is the least a durable service of our shape does: one row, one
//      job, one update, on the same Postgres and Redis;
//   2. burst intake: the same load against ours with the agent queue paused (nothing runs until
//      it resumes): tasks accepted/s by the API, Postgres and Redis alone, next to the reference's
//      median round; then how fast the worker runs that backlog once the queue resumes;
//   3. idle: BENCH_IDLE_TASKS (200) single sends, one at a time: enqueue-to-start latency
//      (ours: task created_at -> first 'working' timeline item; reference: request arrival ->
//      executor start) p50/p99, and ours from the job's hand-over to BullMQ to that item,
// and prints the figures, their ratios and the targets (> 1,000 accepted/s, p50 < 5 ms,
// >= 0.5 of the reference). BENCH_LOG_LEVEL (info: the default, which logs every request) sets our processes' log level;
// BENCH_PROFILE_DIR=dir writes V8 CPU profiles of every spawned process there (bench/harness.ts).
import { randomUUID } from 'node:crypto';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import { freePort } from '../scripts/local-services.ts';
import { createRedis } from '../queues/connection.ts';
import { answers, httpClient, load as loadLoop, pct, say, sortNum, startStack } from './harness.ts';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const IDLE_TASKS = Number(process.env.BENCH_IDLE_TASKS ?? 200);
const WARMUP_SECONDS = 2;
const TARGET_ACCEPTED = 1000;
const TARGET_P50_MS = 5;
const TARGET_RATIO = 0.5;

const stack = await startStack('a2a', { logLevel: 'info', env: { AGENT_KIND: 'demo' } });
const { db } = stack;
await db.raw(`create table floor_tasks (id uuid primary key, context_id uuid not null, status text not null, message jsonb not null,
  reply jsonb, created_at timestamptz not null default now(), started_at timestamptz, done_at timestamptz)`);

interface Target { name: string; url: string; headers: Record<string, string> }

const client = httpClient(CONNECTIONS);
async function post(target: Target, body: string): Promise<{ status: number; json: any }> {
  const res = await client.request(target.url, { method: 'POST', headers: target.headers, body });
  return { status: res.status, json: JSON.parse(res.body) };
}

let rpcId = 0;
const sendBody = (text: string) => JSON.stringify({
  jsonrpc: '2.0', id: ++rpcId, method: 'message/send',
  params: { message: { kind: 'message', role: 'user', messageId: randomUUID(), parts: [{ kind: 'text', text }] }, configuration: { blocking: false } },
});

// Non-blocking sends; the tasks accepted.
async function load(target: Target, seconds: number): Promise<{ taskIds: string[]; errors: number; elapsedMs: number; firstError?: string }> {
  const taskIds: string[] = [];
  const res = await loadLoop(seconds, CONNECTIONS, async (c, i) => {
    const { status, json } = await post(target, sendBody(`bench ${c}.${i}`));
    if (status !== 200 || json?.result?.kind !== 'task') throw new Error(`HTTP ${status} ${JSON.stringify(json).slice(0, 300)}`);
    taskIds.push(json.result.id);
  });
  return { taskIds, errors: res.errors, elapsedMs: res.elapsedMs, firstError: res.firstError };
}

// Polls `countEnded` (how many of `taskIds` have ended) until all have, for 3 minutes at most.
async function untilEnded(countEnded: string, taskIds: string[], what: string, timeoutMs = 180_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await db.raw(countEnded, [taskIds]);
    if (rows[0].n >= taskIds.length) return;
    if (Date.now() > deadline) throw new Error(`only ${rows[0].n} of ${taskIds.length} ${what} finished in ${timeoutMs} ms`);
    await sleep(200);
  }
}

const OURS_ENDED = `select count(*)::int as n from tasks where id = any(?::uuid[]) and status in ('completed', 'failed', 'canceled', 'rejected')`;
const FLOOR_ENDED = `select count(*)::int as n from floor_tasks where id = any(?::uuid[]) and status = 'completed'`;

// Ours: start latency and completion from Postgres, for the given (ended) tasks.
async function ourFigures(taskIds: string[]) {
  const starts = await startTimes(taskIds);
  const { rows: win } = await db.raw(
    `select count(*) filter (where status = 'completed')::int as completed,
            extract(epoch from (max(status_timestamp) - min(created_at))) * 1000 as window_ms,
            max(status_timestamp) as last_done_at
       from tasks where id = any(?::uuid[])`, [taskIds]);
  const latencies = starts.flatMap((r) => (r.working_at ? [r.working_at.getTime() - r.created_at.getTime()] : []));
  return { latencies: sortNum(latencies), completed: win[0].completed as number, windowMs: Number(win[0].window_ms), lastDoneAt: win[0].last_done_at as Date | null };
}

// Per task: its creation, its trigger message (whose id is its run's job id) and its first
// 'working' timeline item (null if it never started).
async function startTimes(taskIds: string[]): Promise<{ created_at: Date; message_id: string; working_at: Date | null }[]> {
  const { rows } = await db.raw(
    `select t.created_at, m.id as message_id,
            (select min(ti.created_at) from timeline_items ti
              where ti.task_id = t.id and ti.event_payload->>'type' = 'task-status-update' and ti.event_payload->>'status' = 'working') as working_at
       from tasks t join lateral (select id from messages where task_id = t.id and role = 'user' order by seq limit 1) m on true
      where t.id = any(?::uuid[])`, [taskIds]);
  return rows;
}

// Ours, the queue's share of start latency: from the job's hand-over to BullMQ (after the task's
// rows committed) to the first 'working' timeline item.
async function queueLatencies(queue: Queue, taskIds: string[]): Promise<number[]> {
  const out: number[] = [];
  for (const r of await startTimes(taskIds)) {
    const job = await queue.getJob(r.message_id);
    if (job && r.working_at) out.push(r.working_at.getTime() - job.timestamp);
  }
  return sortNum(out);
}

// The floor's tasks: completion and start latency (insert -> the run's start), as ourFigures.
async function floorFigures(taskIds: string[]) {
  const { rows } = await db.raw(
    `select count(*)::int as completed, extract(epoch from (max(done_at) - min(created_at))) * 1000 as window_ms,
            array_agg(extract(epoch from (started_at - created_at)) * 1000) as latencies
       from floor_tasks where id = any(?::uuid[])`, [taskIds]);
  return { completed: rows[0].completed as number, windowMs: Number(rows[0].window_ms), latencies: sortNum((rows[0].latencies as string[]).map(Number)) };
}

async function referenceStats(base: string) {
  const res = await fetch(`${base}stats`);
  return (await res.json()) as { completed: number; first_arrival: number; last_completed: number; start_latencies_ms: number[] };
}

async function idle(target: Target): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < IDLE_TASKS; i++) {
    const { json } = await post(target, sendBody(`idle ${i}`));
    if (json?.result?.kind === 'task') ids.push(json.result.id);
    await sleep(10);
  }
  return ids;
}

try {
  const [apiPort, refPort, floorPort] = [await freePort(), await freePort(), await freePort()];
  const queueConnection = createRedis(stack.redisUrl, 'worker');
  const agentQueue = new Queue('agent-tasks', { prefix: 'bench', connection: queueConnection });
  const floorQueue = new Queue('floor-tasks', { prefix: 'bench', connection: queueConnection });
  await Promise.all([
    stack.spawnReady('api/main.ts', { PORT: String(apiPort) }, answers(`http://127.0.0.1:${apiPort}/_internal/v1/ready`), 'api'),
    stack.spawnReady('workers/main.ts', {}, async () => (await agentQueue.getWorkersCount()) > 0, 'worker'),
    stack.spawnReady('bench/reference-a2a-server.ts', { PORT: String(refPort) }, answers(`http://127.0.0.1:${refPort}/stats`), 'reference'),
    stack.spawnReady('bench/floor-a2a.ts', { FLOOR_ROLE: 'api', PORT: String(floorPort) }, answers(`http://127.0.0.1:${floorPort}/`), 'floor api'),
    stack.spawnReady('bench/floor-a2a.ts', { FLOOR_ROLE: 'worker' }, async () => (await floorQueue.getWorkersCount()) > 0, 'floor worker'),
  ]);
  await floorQueue.close();
  const ours: Target = { name: 'taskbridge', url: `http://127.0.0.1:${apiPort}/api/a2a/v1`, headers: { authorization: `Bearer ${stack.adminKey}` } };
  const floor: Target = { name: 'floor', url: `http://127.0.0.1:${floorPort}/`, headers: {} };
  const refBase = `http://127.0.0.1:${refPort}/`;
  const reference: Target = { name: 'reference', url: refBase, headers: {} };

  say(`warming up the three servers (${WARMUP_SECONDS} s each)`);
  await load(ours, WARMUP_SECONDS);
  await load(floor, WARMUP_SECONDS);
  await load(reference, WARMUP_SECONDS);
  await sleep(1000);

  type Rate = { accepted: number; completed: number };
  const rounds: { ours: Rate; floor: Rate; ref: Rate }[] = [];
  const ourLoadLat: number[] = [];
  const floorLoadLat: number[] = [];
  const refLoadLat: number[] = [];
  let firstErrors: { ours?: string; floor?: string; ref?: string } = {};
  const sendErrors = { ours: 0, floor: 0, ref: 0 };
  // CPU time by process over each side's loads (sending and running its tasks), and the tasks it ran.
  const cpu = { ours: { ms: {} as Record<string, number>, tasks: 0 }, floor: { ms: {} as Record<string, number>, tasks: 0 }, ref: { ms: {} as Record<string, number>, tasks: 0 } };
  const measured = async <T extends { taskIds: string[] }>(side: keyof typeof cpu, run: () => Promise<T>): Promise<T> => {
    const before = stack.cpuMs();
    const out = await run();
    const after = stack.cpuMs();
    for (const [role, ms] of Object.entries(after)) cpu[side].ms[role] = (cpu[side].ms[role] ?? 0) + ms - (before[role] ?? 0);
    cpu[side].tasks += out.taskIds.length;
    return out;
  };
  for (let r = 1; r <= ROUNDS; r++) {
    say(`round ${r}/${ROUNDS}: ${CONNECTIONS} connections for ${SECONDS} s against taskbridge`);
    // Each side's CPU is measured until its tasks have ended; its figures are read after, as their
    // per-task reads (a lateral join a task for ours) are the bench's work, not the service's.
    const ourLoad = await measured('ours', async () => {
      const l = await load(ours, SECONDS);
      if (!l.taskIds.length) throw new Error(`taskbridge accepted no task: ${l.firstError}`);
      say(`round ${r}/${ROUNDS}: waiting for the ${l.taskIds.length} accepted tasks to complete`);
      await untilEnded(OURS_ENDED, l.taskIds, 'tasks');
      return l;
    });
    const ourDone = await ourFigures(ourLoad.taskIds);

    say(`round ${r}/${ROUNDS}: ${CONNECTIONS} connections for ${SECONDS} s against the floor`);
    const floorLoad = await measured('floor', async () => {
      const l = await load(floor, SECONDS);
      if (!l.taskIds.length) throw new Error(`the floor accepted no task: ${l.firstError}`);
      await untilEnded(FLOOR_ENDED, l.taskIds, 'floor tasks');
      return l;
    });
    const floorDone = await floorFigures(floorLoad.taskIds);

    say(`round ${r}/${ROUNDS}: ${CONNECTIONS} connections for ${SECONDS} s against the reference`);
    await fetch(`${refBase}stats/reset`, { method: 'POST' });
    const refLoad = await measured('ref', async () => {
      const l = await load(reference, SECONDS);
      await sleep(500);
      return l;
    });
    const refDone = await referenceStats(refBase);

    ourLoadLat.push(...ourDone.latencies);
    floorLoadLat.push(...floorDone.latencies);
    refLoadLat.push(...refDone.start_latencies_ms);
    firstErrors = { ours: firstErrors.ours ?? ourLoad.firstError, floor: firstErrors.floor ?? floorLoad.firstError, ref: firstErrors.ref ?? refLoad.firstError };
    sendErrors.ours += ourLoad.errors;
    sendErrors.floor += floorLoad.errors;
    sendErrors.ref += refLoad.errors;
    const round = {
      ours: { accepted: ourLoad.taskIds.length / (ourLoad.elapsedMs / 1000), completed: ourDone.completed / (ourDone.windowMs / 1000) },
      floor: { accepted: floorLoad.taskIds.length / (floorLoad.elapsedMs / 1000), completed: floorDone.completed / (floorDone.windowMs / 1000) },
      ref: { accepted: refLoad.taskIds.length / (refLoad.elapsedMs / 1000), completed: refDone.completed / ((refDone.last_completed - refDone.first_arrival) / 1000) },
    };
    rounds.push(round);
    say(`round ${r}/${ROUNDS}: accepted ${round.ours.accepted.toFixed(0)}/s, floor ${round.floor.accepted.toFixed(0)}/s, reference ${round.ref.accepted.toFixed(0)}/s (ratio ${(round.ours.accepted / round.ref.accepted).toFixed(2)}), ` +
      `completed ${round.ours.completed.toFixed(0)}/s, floor ${round.floor.completed.toFixed(0)}/s, reference ${round.ref.completed.toFixed(0)}/s (ratio ${(round.ours.completed / round.ref.completed).toFixed(2)})`);
    await sleep(1000);
  }

  // Burst intake: the same load with the agent queue paused, so the worker takes no CPU from the
  // intake path. What the API, Postgres and Redis alone sustain while the workers are busy or
  // stopped; the backlog runs once the queue resumes.
  say(`burst: ${CONNECTIONS} connections for ${SECONDS} s against taskbridge with the agent queue paused`);
  await agentQueue.pause();
  let burst: Awaited<ReturnType<typeof load>>;
  let resumedAt: number;
  try {
    burst = await load(ours, SECONDS);
  } finally {
    await agentQueue.resume();
    resumedAt = Date.now();
  }
  sendErrors.ours += burst.errors;
  firstErrors.ours ??= burst.firstError;
  const burstAccepted = burst.taskIds.length / (burst.elapsedMs / 1000);
  await untilEnded(OURS_ENDED, burst.taskIds, 'tasks');
  const drained = await ourFigures(burst.taskIds);
  const drainRate = drained.lastDoneAt ? drained.completed / ((drained.lastDoneAt.getTime() - resumedAt) / 1000) : NaN;

  say(`idle: ${IDLE_TASKS} single sends against each`);
  const idleIds = await idle(ours);
  await untilEnded(OURS_ENDED, idleIds, 'tasks');
  const ourIdle = await ourFigures(idleIds);
  const ourIdleQueue = await queueLatencies(agentQueue, idleIds);
  await agentQueue.close();
  queueConnection.disconnect();
  await fetch(`${refBase}stats/reset`, { method: 'POST' });
  await idle(reference);
  const refIdle = sortNum((await referenceStats(refBase)).start_latencies_ms);

  // The round whose ratio is the median one, for accepted and for completed tasks.
  const medianRound = (ratio: (r: (typeof rounds)[number]) => number) => [...rounds].sort((a, b) => ratio(a) - ratio(b))[Math.floor(rounds.length / 2)];
  const acceptedRatio = (r: (typeof rounds)[number]) => r.ours.accepted / r.ref.accepted;
  const completedRatio = (r: (typeof rounds)[number]) => r.ours.completed / r.ref.completed;
  const midAccepted = medianRound(acceptedRatio);
  const midCompleted = medianRound(completedRatio);
  const ourAccepted = midAccepted.ours.accepted;
  const ourLat = sortNum(ourLoadLat);
  const floorLat = sortNum(floorLoadLat);
  const refLat = sortNum(refLoadLat);
  const fmt = (v: number, unit: string) => (Number.isNaN(v) ? '-' : v.toFixed(unit === 'ms' ? 2 : 0)).padStart(12);
  const ratio = (a: number, b: number) => (Number.isNaN(a / b) ? '-' : (a / b).toFixed(2)).padStart(11);
  // Rates get three ratios: ours to the reference (the target's), ours to the floor, the floor to the reference.
  const row = (label: string, a: number, f: number, b: number, unit: string) =>
    console.log(`  ${label.padEnd(28)}${fmt(a, unit)}${fmt(f, unit)}${fmt(b, unit)}  ${unit.padEnd(7)}${unit === 'tasks/s' ? `${ratio(a, b)}${ratio(a, f)}${ratio(f, b)}` : ''}`);

  console.log(`\nA2A intake: non-blocking message/send, ${CONNECTIONS} connections, ${ROUNDS} rounds of ${SECONDS} s each side, ${os.cpus().length} CPUs, demo echo agent, 1 API + 1 worker process`);
  console.log(`  ${''.padEnd(28)}${'taskbridge'.padStart(12)}${'floor'.padStart(12)}${'reference'.padStart(12)}  ${'unit'.padEnd(7)}${'ours/ref'.padStart(11)}${'ours/floor'.padStart(11)}${'floor/ref'.padStart(11)}`);
  row('send errors', sendErrors.ours, sendErrors.floor, sendErrors.ref, 'errors');
  rounds.forEach((r, i) => {
    row(`round ${i + 1} accepted`, r.ours.accepted, r.floor.accepted, r.ref.accepted, 'tasks/s');
    row(`round ${i + 1} completed`, r.ours.completed, r.floor.completed, r.ref.completed, 'tasks/s');
  });
  row('accepted, median round', midAccepted.ours.accepted, midAccepted.floor.accepted, midAccepted.ref.accepted, 'tasks/s');
  row('completed, median round', midCompleted.ours.completed, midCompleted.floor.completed, midCompleted.ref.completed, 'tasks/s');
  row('accepted, queue paused', burstAccepted, NaN, midAccepted.ref.accepted, 'tasks/s');
  row(`backlog of ${burst.taskIds.length} run`, drainRate, NaN, NaN, 'tasks/s');
  row('start latency p50, load', pct(ourLat, 50), pct(floorLat, 50), pct(refLat, 50), 'ms');
  row('start latency p99, load', pct(ourLat, 99), pct(floorLat, 99), pct(refLat, 99), 'ms');
  row('start latency p50, idle', pct(ourIdle.latencies, 50), NaN, pct(refIdle, 50), 'ms');
  row('start latency p99, idle', pct(ourIdle.latencies, 99), NaN, pct(refIdle, 99), 'ms');
  row('enqueue->start p50, idle', pct(ourIdleQueue, 50), NaN, NaN, 'ms');
  row('enqueue->start p99, idle', pct(ourIdleQueue, 99), NaN, NaN, 'ms');
  const roles = [...new Set(Object.values(cpu).flatMap((c) => Object.keys(c.ms)))];
  if (roles.length) {
    console.log(`\n  CPU per task over the rounds' loads (ms, user + system, from /proc), by process:`);
    console.log(`  ${''.padEnd(14)}${roles.map((r) => r.padStart(15)).join('')}${'total'.padStart(9)}`);
    for (const [name, side] of [['taskbridge', cpu.ours], ['floor', cpu.floor], ['reference', cpu.ref]] as const) {
      const per = roles.map((r) => (side.ms[r] ?? 0) / side.tasks);
      console.log(`  ${name.padEnd(14)}${per.map((v) => v.toFixed(3).padStart(15)).join('')}${per.reduce((a, b) => a + b, 0).toFixed(3).padStart(9)}`);
    }
  }
  if (firstErrors.ours) console.log(`  first taskbridge error: ${firstErrors.ours}`);
  if (firstErrors.floor) console.log(`  first floor error: ${firstErrors.floor}`);
  if (firstErrors.ref) console.log(`  first reference error: ${firstErrors.ref}`);
  const verdict = (ok: boolean) => (ok ? 'met' : 'NOT met');
  console.log(`  targets: accepted > ${TARGET_ACCEPTED}/s ${verdict(ourAccepted > TARGET_ACCEPTED)}; idle start p50 < ${TARGET_P50_MS} ms ${verdict(pct(ourIdle.latencies, 50) < TARGET_P50_MS)}; ` +
    `accepted ratio >= ${TARGET_RATIO} ${verdict(acceptedRatio(midAccepted) >= TARGET_RATIO)}; completed ratio >= ${TARGET_RATIO} ${verdict(completedRatio(midCompleted) >= TARGET_RATIO)}`);
} finally {
  client.destroy();
  await stack.cleanup();
}

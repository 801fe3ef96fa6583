// Agent modules (AGENT_KIND=module): a module's replies, artifacts and final message reach the
// task; canceling a long-running module agent fires its abort signal on the worker; what the
// runtime does with results and calls a module should not make.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { lockWaits, ROOT, resetDb, startStack, startWorker, testDb, testEnv, textMessage, useStack, waitFor, type Stack, withQueue } from './helpers/stack.ts';

const A2A = '/api/a2a/v1';
const userMessage = (text: string) => ({ kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }] });

describe('agent modules', () => {
  let stack: Stack;
  let marker: string;
  const rpc = (method: string, params: unknown) => stack.client.post(A2A, { jsonrpc: '2.0', id: 1, method, params });
  // A Stripe that holds every refund request unanswered, and notes when its caller hangs up.
  const held: { closedAt?: number }[] = [];
  const stripe = http.createServer((_req, res) => {
    const call: { closedAt?: number } = {};
    held.push(call);
    res.on('close', () => { call.closedAt = Date.now(); });
  });

  before(async () => {
    await resetDb();
    await new Promise<void>((resolve) => stripe.listen(0, '127.0.0.1', resolve));
    marker = path.join(process.env.TEST_DATA_DIR!, `signal-agent-${randomUUID()}.marker`);
    stack = await startStack({
      AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/signal-agent.ts'), SIGNAL_AGENT_MARKER: marker, WORKER_SHUTDOWN_GRACE_MS: '1000',
      STRIPE_API_BASE_URL: `http://127.0.0.1:${(stripe.address() as AddressInfo).port}`, BRIDGE_ALLOW_PRIVATE: 'true', BRIDGE_TIMEOUT_MS: '60000',
      TASK_ARTIFACTS_MAX_BYTES: '8192', TASK_MESSAGES_MAX_BYTES: '8192',
    });
  });
  after(async () => {
    await stack?.stop();
    stripe.closeAllConnections();
    stripe.close();
  });

  it("a module's reply, artifact and final data message reach the task", async () => {
    const task = (await rpc('message/send', { message: userMessage('hello module') })).body.result;
    assert.equal(task.status.state, 'completed');
    assert.deepEqual(task.status.message.parts, [{ kind: 'data', data: { turns: 1, text: 'hello module' } }]);
    assert.deepEqual(task.history.map((m: any) => m.role), ['user', 'agent', 'agent']);
    assert.deepEqual(task.history[1].parts, [{ kind: 'text', text: 'working on: hello module' }]);
    assert.deepEqual(task.artifacts, [{ artifactId: 'summary', name: 'summary', parts: [{ kind: 'data', data: { length: 12 } }] }]);
    const timeline = await stack.client.get(`/api/task/v1/${task.id}/timeline?order=asc`);
    assert.deepEqual(timeline.body.items.map((i: any) => i.event_payload.type),
      ['message', 'task-status-update', 'task-status-update', 'message', 'artifact-update', 'message', 'task-status-update']);
  });

  it("a reply, progress or final message given as {parts, metadata} keeps the message's metadata", async () => {
    const task = (await rpc('message/send', { message: userMessage('with metadata') })).body.result;
    assert.equal(task.status.state, 'completed');
    assert.deepEqual(task.status.message.metadata, { source: 'final', score: 3 });
    const agent = task.history.filter((m: any) => m.role === 'agent').map((m: any) => [m.parts[0].text, m.metadata]);
    assert.deepEqual(agent, [['annotated', { source: 'reply' }], ['halfway', { source: 'progress' }], ['all done', { source: 'final', score: 3 }]]);
    // The task API shows the same.
    const rest = await stack.client.get(`/api/task/v1/${task.id}`);
    assert.deepEqual(rest.body.status_message.metadata, { source: 'final', score: 3 });
  });

  it('canceling a long-running module agent aborts its signal on the worker', async () => {
    const task = (await rpc('message/send', { message: userMessage('wait'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => {
      const r = await rpc('tasks/get', { id: task.id });
      return r.body.result.status.message?.parts?.[0]?.text === 'waiting to be canceled';
    }, 'the module agent to start waiting');
    assert.ok(!fs.existsSync(marker));
    const canceled = await rpc('tasks/cancel', { id: task.id });
    assert.equal(canceled.body.result.status.state, 'canceled');
    const text = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to observe its abort signal');
    assert.match(text, new RegExp(`aborted task ${task.id}: task canceled`));
    const after = await rpc('tasks/get', { id: task.id });
    assert.equal(after.body.result.status.state, 'canceled');
  });

  // What it guards is the path without the note: only the worker's check in Postgres can abort the run,
  // so with that check gone (or its interval past waitFor's 20 s) it fails. Not the check's 500 ms, the
  // README's "within about a second": that is a duration, which only a timed assertion could hold to.
  it("a cancel whose Redis note is lost still aborts the agent's signal on the worker, through the worker's check in Postgres", async () => {
    fs.rmSync(marker, { force: true });
    const task = (await rpc('message/send', { message: userMessage('wait'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'waiting to be canceled', 'the module agent to start waiting');
    // Canceled as the API cancels, but no note published: as when Redis was reconnecting at the time.
    await testDb().transaction(async (trx) => {
      await trx('tasks').where({ id: task.id }).update({ status: 'canceled', status_timestamp: new Date(), updated_at: new Date() });
      await trx('timeline_items').insert({ id: randomUUID(), task_id: task.id, created_at: new Date(), event_payload: { type: 'task-status-update', status: 'canceled' } });
    });
    const text = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to observe its abort signal');
    assert.equal(text, `aborted task ${task.id}: task canceled`);
    assert.equal((await rpc('tasks/get', { id: task.id })).body.result.status.state, 'canceled');
  });

  const finalOf = async (text: string) => {
    const task = (await rpc('message/send', { message: userMessage(text) })).body.result;
    return { state: task.status.state as string, message: task.status.message?.parts?.[0]?.text as string, task };
  };
  // Each case's text makes the run fail, after `attempts` attempt(s), saying why.
  const assertFailures = async (attempts: number, cases: [text: string, why: string][]) => {
    for (const [text, why] of cases) {
      const { state, message } = await finalOf(text);
      assert.deepEqual({ state, message }, { state: 'failed', message: `The agent failed after ${attempts} attempt(s): ${why}` }, text);
    }
  };

  it('a run may end rejected: the agent declines the task it started to look at', async () => {
    assert.deepEqual(await finalOf('reject').then(({ state, message }) => ({ state, message })), { state: 'rejected', message: 'not a task for me' });
  });

  it('a run that returns a status it cannot end in, calls setStatus with one, or replies with parts of the wrong shape fails, saying why', async () => {
    const cases: [string, RegExp][] = [
      ['status working', /returned status 'working'; a run ends in one of completed, input-required, auth-required, failed, rejected, canceled/],
      ['set completed', /setStatus takes 'working' only, not 'completed'/],
      // A2A parts (kind) where task API parts (type) belong: before, stored as parts A2A served as [null].
      ['a2a parts', /Invalid reply: reply\.0\.type/],
      ['extra member', /Invalid reply: reply\.meta is not an allowed member/],
      // Before, stored and served as a member of the artifact, which it replaced (line 1 lost).
      ['misspelt append', /Invalid artifact: artifact\.apend is not an allowed member/],
    ];
    for (const [text, why] of cases) {
      const { state, message, task } = await finalOf(text);
      assert.equal(state, 'failed', text);
      assert.match(message, why, text);
      assert.ok(task.history.every((m: any) => m.parts.every((p: any) => typeof p?.kind === 'string')), text);
    }
  });

  it('a handler that throws what is no Error (null, undefined, a string, an object) fails the task after its attempts, naming what it threw', async () => {
    // Before, null and undefined broke the runtime's own error handling: the job failed with a
    // TypeError, unretried, and the task stayed working until job recovery failed it saying nothing.
    await assertFailures(3, [
      ['throw null', 'the agent threw null'],
      ['throw undefined', 'the agent threw undefined'],
      ['throw string', 'no luck'],
      ['throw object', 'the agent threw {"code":"E_AGENT","detail":"quota"}'],
      // Before, the first two escaped the run's failure handling (each attempt logged as the
      // runtime's fault), and the task stayed working until job recovery failed it saying nothing.
      ['throw getter', 'the agent threw an object that could not be read'],
      ['throw proxy', 'the agent threw an object that could not be read'],
      ['throw empty', 'the agent threw TypeError with no message'],
      // Before, escaped the run's failure handling as the object forms did, and a cycle was "[object Object]".
      ['throw function proxy', 'the agent threw a function that could not be read'],
      ['throw function getter', 'the agent threw a function that could not be read'],
      ['throw cycle', 'the agent threw an object JSON cannot show (a cycle or a BigInt in it)'],
      ['throw cause getter', 'the agent threw an object that could not be read'],
    ]);
    assert.ok(!stack.workers[0].logs.some((l) => l.includes('agent run failed in the runtime')), 'no failure blamed on the runtime');
  });

  it("ctx.message shows a message's members, not the columns kept for the service (opens_task, weight)", async () => {
    const { state, message } = await finalOf('message keys');
    assert.equal(state, 'completed');
    assert.equal(message, 'client_message_id,created_at,id,metadata,parts,reference_task_ids,role,task_id');
  });

  it('an agent error that mentions stalling is retried like any other (only BullMQ\'s own stalled-too-often failure ends a run as lost)', async () => {
    // Before, any failure whose message matched /stalled/ failed the task at once as a lost run.
    const { state, message, task } = await finalOf('throw stalled once');
    assert.deepEqual({ state, message }, { state: 'completed', message: 'second attempt worked' });
    assert.deepEqual(task.history.filter((m: any) => m.role === 'agent').map((m: any) => m.parts[0].text), ['first attempt', 'second attempt worked']);
  });

  it("the writes a failed attempt left going are refused once it is over: the task holds the next attempt's alone", async () => {
    fs.rmSync(marker, { force: true });
    fs.rmSync(`${marker}.late`, { force: true });
    // Before, the reply and artifact the first attempt made after its failure landed while its retry waited.
    const { state, message, task } = await finalOf('late writes');
    assert.deepEqual({ state, message }, { state: 'completed', message: 'the next attempt worked' });
    assert.match(fs.readFileSync(marker, 'utf8'), /^reply refused: the run is over \(.*\); artifact refused: the run is over \(.*\)$/);
    assert.deepEqual(task.history.map((m: any) => m.role), ['user', 'agent']);
    assert.deepEqual(task.artifacts ?? [], []);
  });

  it("a thrown error's message that Postgres cannot store, or of any length, still fails the task, the reason cut to 1,000 characters", async () => {
    // Before, a NUL character made the failure's own write fail (the task stayed working until job
    // recovery failed it saying nothing of why), and 100,000 characters went whole into the task.
    const nul = await finalOf('throw nul');
    assert.deepEqual({ state: nul.state, message: nul.message }, { state: 'failed', message: 'The agent failed after 3 attempt(s): bad \ufffd byte' });
    const long = await finalOf('throw long');
    assert.equal(long.state, 'failed');
    assert.equal(long.message, `${`The agent failed after 3 attempt(s): ${'e'.repeat(100_000)}`.slice(0, 1000)}…`);
  });

  it('a reply, artifact or message JSON or Postgres cannot keep as given is refused, and fails the run at its first attempt', async () => {
    // Before: a NUL or an unpaired surrogate failed in Postgres (retried, 'first this' repeated, then
    // 'a database error (SQLSTATE 22P05)'), NaN was stored as null, a BigInt or a cycle was retried.
    const cases: [string, string][] = [
      ['nul reply', 'Invalid reply: reply.0.text contains a NUL character or an unpaired surrogate'],
      ['nan data', 'Invalid reply: reply.0.data.score is NaN, which JSON has not (it would be kept as null)'],
      ['bigint artifact', 'Invalid artifact: artifact.parts.0.data.id is a BigInt, which JSON has not'],
      ['cyclic metadata', `Invalid message: message.metadata${'.self'.repeat(63)} nests deeper than 64 levels`],
      ['lone surrogate', 'Invalid message: message.0.text contains a NUL character or an unpaired surrogate'],
      ['dense reply', 'Invalid reply: reply holds more than 100000 JSON values'],
    ];
    for (const [text, why] of cases) {
      const { state, message, task } = await finalOf(text);
      assert.deepEqual({ state, message }, { state: 'failed', message: `The agent failed after 1 attempt(s): ${why}` }, text);
      assert.deepEqual(task.history.filter((m: any) => m.role === 'agent').map((m: any) => m.parts[0].text), ['first this', message], text);
    }
  });

  it('a secret or provider instance looked up by what is no string, or by a name with a NUL character, fails the run at its first attempt', async () => {
    // Before: undefined failed in the query builder, whose message (our SQL) became the status
    // message after 3 attempts; a NUL failed in Postgres, retried, then 'a database error (SQLSTATE 22021)'.
    await assertFailures(1, [
      ['secret undefined', 'ctx.readSecret: the key must be a string, not undefined'],
      ['secret nul', "secret with key 'api\ufffdkey' not found"],
      ['invoke undefined', 'ctx.invokeFunction: the provider instance id must be a string, not undefined'],
      ['invoke nul', "provider_instance 'stripe\ufffdheld' not found"],
    ]);
  });

  it('a run that returns what is no {status?, message?} (a string, a misspelt member) fails, saying so', async () => {
    // Before, both completed the task with 'Task completed', the agent's answer dropped.
    await assertFailures(1, [
      ['return text', 'The agent returned a string; a run returns {status?, message?} or nothing'],
      ['return misspelt', "The agent returned a result with 'mesage'; a run returns {status?, message?} or nothing"],
    ]);
  });

  it('a refusal no retry can mend (an unknown secret, a wrong status) fails the run at its first attempt, without repeating its replies', async () => {
    const before = stack.workers[0].logs.length;
    const { state, message, task } = await finalOf('missing secret');
    assert.equal(state, 'failed');
    assert.match(message, /^The agent failed after 1 attempt\(s\): .*no-such-secret/);
    assert.deepEqual(task.history.filter((m: any) => m.role === 'agent' && m.parts[0].text === 'looking it up').length, 1);
    const wrong = await finalOf('status working');
    assert.match(wrong.message, /^The agent failed after 1 attempt\(s\): /);
    assert.ok(!stack.workers[0].logs.slice(before).some((l) => l.includes('it will be retried')), 'no retry');
  });

  it('artifacts emitted without an id each get one, which emitArtifact returns so the agent can append to it, in place', async () => {
    const { state, task } = await finalOf('anonymous artifacts');
    assert.equal(state, 'completed');
    // An append to an earlier artifact leaves it where it was, as tasks/get shows it too.
    assert.deepEqual(task.artifacts.map((a: any) => a.parts.map((p: any) => p.text)), [['first', 'first again'], ['second', 'and more']]);
    for (const a of task.artifacts) assert.equal(typeof a.artifactId, 'string');
    const got = (await rpc('tasks/get', { id: task.id })).body.result;
    assert.deepEqual(got.artifacts, task.artifacts);
  });

  it("an appended chunk's name, description and metadata merge into the artifact as the SDK's server merges them (tasks/get, send, a stream's snapshot)", async () => {
    const { state, task } = await finalOf('chunks');
    assert.equal(state, 'input-required');
    // Parts appended; a chunk's non-empty name replaces the name, its metadata keys are added; the
    // extensions stay as first sent. Before, the first chunk's name and metadata were kept.
    const story = { artifactId: 'story', name: 'story', metadata: { v: 1, keep: 'a', added: true }, extensions: ['urn:ext:a'], parts: ['once', 'upon', 'a time'].map((text) => ({ kind: 'text', text })) };
    assert.deepEqual(task.artifacts, [story]);
    assert.deepEqual((await rpc('tasks/get', { id: task.id })).body.result.artifacts, [story]);
    // The answer's stream starts with the task as it stands, then the last chunk.
    const streamed = await rpc('message/stream', { message: { ...userMessage('chunks: the end'), taskId: task.id } });
    const events = streamed.text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)).result);
    assert.equal(events[0].kind, 'task');
    assert.deepEqual(events[0].artifacts, [story]);
    assert.equal(events.at(-1).status.state, 'completed');
    const ended = { ...story, description: 'a short one', metadata: { v: 2, keep: 'a', added: true }, parts: [...story.parts, { kind: 'text', text: 'the end' }] };
    assert.deepEqual((await rpc('tasks/get', { id: task.id })).body.result.artifacts, [ended]);
  });

  it('a task holds at most TASK_ARTIFACTS_MAX_BYTES of artifacts: the update that would take it over is refused, and the agent may go on', async () => {
    const { state, message, task } = await finalOf('fill artifacts');
    assert.equal(state, 'completed');
    const bytes = Buffer.byteLength(JSON.stringify({ artifactId: 'part-0', parts: [{ kind: 'text', text: 'x'.repeat(3000) }] }));
    assert.equal(message, `artifact 2 refused: Task '${task.id}' holds ${2 * bytes} bytes of artifacts; this artifact update (${bytes} bytes) would take it over the 8192 a task may hold (TASK_ARTIFACTS_MAX_BYTES)`);
    assert.deepEqual(task.artifacts.map((a: any) => a.artifactId), ['part-0', 'part-1']);
  });

  it('a refused artifact fails the run at its first attempt; a task from before the count was kept is counted from its timeline', async () => {
    const before = stack.workers[0].logs.length;
    const first = (await rpc('message/send', { message: userMessage('big artifact') })).body.result;
    assert.equal(first.status.state, 'input-required');
    // As a task of an earlier release holds it: artifacts, and no count.
    assert.equal(await testDb()('tasks').where({ id: first.id }).update({ artifact_bytes: null }), 1);
    const second = (await rpc('message/send', { message: { ...userMessage('big artifact'), taskId: first.id } })).body.result;
    assert.equal(second.status.state, 'failed');
    assert.match(second.status.message.parts[0].text, new RegExp(`^The agent failed after 1 attempt\\(s\\): Task '${first.id}' holds 50\\d\\d bytes of artifacts; .*\\(TASK_ARTIFACTS_MAX_BYTES\\)$`));
    assert.deepEqual(second.artifacts.map((a: any) => a.artifactId), ['big-1']);
    assert.ok(!stack.workers[0].logs.slice(before).some((l) => l.includes('it will be retried')), 'no retry');
  });

  it("a run's messages count against TASK_MESSAGES_MAX_BYTES: a reply that would take the task over is refused, and the agent may go on", async () => {
    const { state, message, task } = await finalOf('fill replies');
    assert.equal(state, 'completed');
    const bytes = (m: unknown) => Buffer.byteLength(JSON.stringify(m));
    const held = bytes([{ type: 'text-part', text: 'fill replies' }]) + 2 * bytes([{ type: 'text-part', text: 'r'.repeat(3000) }]);
    assert.match(message, new RegExp(`^reply 2 refused: Task '${task.id}' holds ${held} bytes of messages; this message \\(3032 bytes\\) would take it over the 8192 a task may hold \\(TASK_MESSAGES_MAX_BYTES\\)$`));
    assert.equal(task.history.filter((m: any) => m.role === 'agent' && m.parts[0].text.startsWith('rrr')).length, 2);
  });

  it('a progress or final message that would take the task over fails the run at its first attempt', async () => {
    for (const text of ['big progress', 'big final']) {
      const { state, message, task } = await finalOf(text);
      assert.equal(state, 'failed', text);
      assert.match(message, new RegExp(`^The agent failed after 1 attempt\\(s\\): Task '${task.id}' holds \\d+ bytes of messages; this message \\(9032 bytes\\) .*\\(TASK_MESSAGES_MAX_BYTES\\)$`), text);
      assert.ok(!task.history.some((m: any) => m.parts[0].text?.length >= 9000), text);
    }
  });

  it("a final message that fits only without a client's message sent during the run fails the run, which the task holds", async () => {
    const task = (await rpc('message/send', { message: userMessage('final after a message'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'waiting for the go', 'the agent to wait');
    assert.equal((await stack.client.post(`/api/task/v1/${task.id}/message`, { role: 'user', parts: [{ type: 'text-part', text: 'c'.repeat(6000) }] })).status, 201);
    fs.writeFileSync(`${marker}.go`, '');
    const failed = await waitFor(async () => {
      const r = (await rpc('tasks/get', { id: task.id })).body.result;
      return r.status.state === 'failed' && r;
    }, 'the run to fail');
    assert.match(failed.status.message.parts[0].text, /^The agent failed after 1 attempt\(s\): Task '.+' holds \d+ bytes of messages; this message \(6032 bytes\) .*\(TASK_MESSAGES_MAX_BYTES\)$/);
    const [row] = await testDb()('tasks').where({ id: task.id }).select('message_bytes');
    assert.ok(Number(row.message_bytes) <= 8192 + 200, `held ${row.message_bytes}`);
  });

  it("a reply, artifact or message is checked as JSON.stringify writes it (a toJSON's shape), and one whose JSON cannot be had is refused at the run's first attempt", async () => {
    // Before, checked by its members and stored as its toJSON wrote it: a part stored as null, a
    // Date as a string where an object goes, metadata as 1; message/send and every tasks/get of the
    // task answered -32603 from then on.
    const cases: [string, string][] = [
      ['tojson part', 'Invalid reply: reply.0 must be object'],
      ['date data', 'Invalid reply: reply.0.data must be object'],
      ['tojson artifact', 'Invalid artifact: artifact.parts.0.kind is required'],
      ['tojson metadata', 'Invalid message: message.metadata must be object'],
      ['tojson throws', 'Invalid reply: it could not be read as JSON (no JSON for you)'],
      ['getter part', 'Invalid reply: reply.0.type is required'],
    ];
    for (const [text, why] of cases) {
      const { state, message, task } = await finalOf(text);
      assert.deepEqual({ state, message }, { state: 'failed', message: `The agent failed after 1 attempt(s): ${why}` }, text);
      assert.deepEqual(task.history.filter((m: any) => m.role === 'agent').map((m: any) => m.parts[0].text), ['first this', message], text);
      assert.equal((await rpc('tasks/get', { id: task.id })).body.result?.status.state, 'failed', text);
    }
  });

  it('a reply or message in the object form is read by its members, however the object has them (a getter of a class)', async () => {
    const { state, message, task } = await finalOf('getter message');
    assert.deepEqual({ state, message }, { state: 'completed', message: 'ended by a getter' });
    assert.deepEqual(task.history.filter((m: any) => m.role === 'agent').map((m: any) => m.parts[0].text), ['said by a getter', 'ended by a getter']);
  });

  it("a run's writes made all at once, awaited or not, land in the order made: an artifact then the chunks appended to it, replies", async () => {
    // Before, 4 went at a time and raced for the task's row: chunks out of order, some lost under
    // the artifact they were appended to, replies shuffled in the history.
    const { state, task } = await finalOf('unawaited writes');
    assert.equal(state, 'completed');
    assert.deepEqual(task.artifacts.map((a: any) => [a.artifactId, a.parts.map((p: any) => p.text)]), [['log', Array.from({ length: 60 }, (_, i) => `p${i}`)]]);
    const replies = task.history.filter((m: any) => m.role === 'agent' && /^q\d+$/.test(m.parts[0].text)).map((m: any) => m.parts[0].text);
    assert.deepEqual(replies, Array.from({ length: 20 }, (_, i) => `q${i}`));
  });

  it("a run's calls made all at once wait their turn in the run rather than for the worker's Postgres connections: 1,000 artifacts behind a locked task", async () => {
    const task = (await rpc('message/send', { message: userMessage('flood artifacts'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'ready to flood', 'the agent to be ready');
    // The task's row held locked past the pool's 10 s acquire timeout: each call that took a
    // connection waits for the lock; the others waited for a connection, and those that waited that
    // long were refused as if Postgres were out of reach (a run that let one through was handed back
    // to the queue, to flood it again, for ever).
    await testDb().transaction(async (trx) => {
      await trx('tasks').where({ id: task.id }).forUpdate().first();
      fs.writeFileSync(`${marker}.flood`, '');
      await new Promise((resolve) => setTimeout(resolve, 11_000));
    });
    const done = await waitFor(async () => {
      const r = (await rpc('tasks/get', { id: task.id })).body.result;
      return r.status.state === 'completed' && r;
    }, 'the run to complete');
    const { stored, reasons } = done.status.message.parts[0].data;
    // The task holds 8,192 bytes of artifacts: the calls past that are refused for it, and for nothing else.
    assert.deepEqual(reasons, ["Task 'ID' holds N bytes of artifacts; this artifact update (N bytes) would take it over the N a task may hold (TASK_ARTIFACTS_MAX_BYTES)"]);
    assert.equal(done.artifacts.length, stored);
  });

  it('a write of a run whose task was deleted meanwhile (TASK_RETENTION_DAYS) is refused as for an ended task', async () => {
    fs.rmSync(marker, { force: true });
    const task = (await rpc('message/send', { message: userMessage('reply when told'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'waiting to reply', 'the agent to wait');
    await testDb()('tasks').where({ id: task.id }).delete();
    fs.writeFileSync(`${marker}.reply`, '');
    const said = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to write its marker');
    assert.equal(said, 'reply refused: task is deleted');
    assert.equal((await finalOf('still here')).state, 'completed');
  });

  it('after a cancel, calls out of the run are refused, and a write left unawaited does not bring the worker down', async () => {
    fs.rmSync(marker, { force: true });
    const task = (await rpc('message/send', { message: userMessage('float'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'floating', 'the agent to start');
    await rpc('tasks/cancel', { id: task.id });
    const said = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to write its marker');
    assert.match(said, /^invoke refused: the run is over \(.*\); read refused: the run is over \(.*\)$/);
    await waitFor(async () => stack.workers[0].logs.some((l) => l.includes('unhandled promise rejection')), 'the unawaited refusal to be logged');
    assert.equal(stack.workers[0].child.exitCode, null);
    assert.equal((await finalOf('still here')).state, 'completed');
    const history = (await rpc('tasks/get', { id: task.id })).body.result.history;
    assert.ok(!history.some((m: any) => m.parts[0]?.text === 'too late'));
  });

  it('a canceled run abandons its call to a provider function: the provider sees the caller hang up', async () => {
    const B = '/api/bridge/v1';
    const cred = await stack.client.post(`${B}/available-providers/stripe/available-credentials/api_key/credential/resource-server`, { value: { api_key: 'sk_test_held' } });
    assert.equal(cred.status, 201, cred.text);
    assert.equal((await stack.client.post(`${B}/available-providers/stripe/available-credentials/api_key`, { provider_instance_id: 'stripe-held', display_name: 'Stripe', resource_server_credential_id: cred.body.id })).status, 201);
    assert.equal((await stack.client.post(`${B}/provider/stripe-held/function/stripe_process_refund/enable`, {})).status, 201);
    fs.rmSync(marker, { force: true });
    const task = (await rpc('message/send', { message: userMessage('refund'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => held.length === 1, 'the refund request to reach Stripe');
    const canceledAt = Date.now();
    await rpc('tasks/cancel', { id: task.id });
    const said = await waitFor(async () => fs.existsSync(marker) && fs.readFileSync(marker, 'utf8'), 'the agent to write its marker');
    assert.equal(said, 'refund refused: stripe: call abandoned by its caller');
    await waitFor(async () => held[0].closedAt !== undefined, 'Stripe to see the caller hang up');
    assert.ok(held[0].closedAt! - canceledAt < 15_000, `hung up ${held[0].closedAt! - canceledAt} ms after the cancel`);
    assert.equal((await rpc('tasks/get', { id: task.id })).body.result.status.state, 'canceled');

    // Bad params fail the run at once, named as the agent passed them (not as an HTTP body's).
    const bad = await finalOf('refund without params');
    assert.equal(bad.state, 'failed');
    assert.equal(bad.message, 'The agent failed after 1 attempt(s): Invalid params: params must have exactly one of payment_intent or charge');
    assert.doesNotMatch(bad.message, /body/);
  });

  it("a run's provider calls that wait do not hold up its replies (each kind goes 4 at a time apart)", async () => {
    // stripe-held (the test above) holds every call until its caller hangs up.
    const before = held.length;
    const task = (await rpc('message/send', { message: userMessage('refunds then reply'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => held.length === before + 4, 'the 4 refunds to reach Stripe');
    // Before, the reply waited for one of the 4 calls in flight, which the provider held for ever.
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.history.some((m: any) => m.role === 'agent' && m.parts[0].text === 'replied while 4 refunds wait'), 'the reply');
    await rpc('tasks/cancel', { id: task.id });
  });

  it('a worker shutting down hands back a run that ignores its signal once the grace period is over', async () => {
    const [worker] = stack.workers;
    const task = (await rpc('message/send', { message: userMessage('ignore'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'ignoring the signal', 'the agent to start');
    // The agent sleeps a minute; stop() would SIGKILL after 15 s. The worker must leave by itself.
    await worker.stop();
    assert.equal(worker.child.signalCode, null, 'exited by itself');
    assert.equal(worker.child.exitCode, 0);
    assert.ok(worker.logs.some((l) => l.includes('grace period over')));
    assert.ok(worker.logs.some((l) => l.includes('"msg":"worker stopped"')));
    // Not completed by the leaving worker after its minute: handed back, waiting for another worker.
    assert.equal((await rpc('tasks/get', { id: task.id })).body.result.status.state, 'working');
    const waiting = await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['wait']));
    assert.ok(waiting.some((j) => j?.data.task_id === task.id), 'the run is back in the queue');
  });

  it('a worker shutting down hands back a run that starts only after the grace period is over (its start held behind a lock)', async () => {
    // No worker runs now (the test before stopped the stack's): the run waits in the queue.
    const task = (await rpc('message/send', { message: userMessage('ignore'), configuration: { blocking: false } })).body.result;
    const trx = await testDb().transaction();
    try {
      await trx('tasks').where({ id: task.id }).forUpdate().first();
      const worker = await startWorker(stack.env);
      stack.workers.push(worker);
      // Its start is the one statement waiting for a lock (the text shown is cut before its update).
      await waitFor(async () => (await lockWaits('with b as%')) > 0, 'the run\'s start to wait for the row', 20000, 50);
      worker.child.kill('SIGTERM');
      await waitFor(async () => worker.logs.some((l) => l.includes('worker shutting down')), 'the shutdown to begin', 10000, 20);
      // Past the grace period (1 s) with no run registered: nothing was aborted then. The worker logs
      // nothing at its end when it hands back no run, so this waits three times it.
      await new Promise((resolve) => setTimeout(resolve, 3000));
      await trx.rollback();
      // The run starting now ignores its signal and sleeps a minute: before, the worker waited for it
      // until its queues could not close in time and exited 1 (or was killed), the job left locked.
      await worker.stop();
      assert.equal(worker.child.signalCode, null, 'exited by itself');
      assert.equal(worker.child.exitCode, 0, worker.logs.slice(-5).join('\n'));
      assert.ok(worker.logs.some((l) => l.includes('"msg":"worker stopped"')));
    } finally {
      if (!trx.isCompleted()) await trx.rollback();
    }
    // Handed back before its agent started: the agent's first step (its progress message) never came.
    assert.equal((await rpc('tasks/get', { id: task.id })).body.result.status.message, undefined);
    const waiting = await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['wait']));
    assert.ok(waiting.some((j) => j?.data.task_id === task.id), 'the run is back in the queue');
  });

  it('a worker shutting down lets the writes of a run it aborts land until it hands the run back', async () => {
    // No worker runs now (the tests before stopped theirs).
    const worker = await startWorker(stack.env);
    stack.workers.push(worker);
    const task = (await rpc('message/send', { message: userMessage('reply on abort'), configuration: { blocking: false } })).body.result;
    await waitFor(async () => (await rpc('tasks/get', { id: task.id })).body.result.status.message?.parts?.[0]?.text === 'replying once aborted', 'the agent to start');
    await worker.stop();
    const after = (await rpc('tasks/get', { id: task.id })).body.result;
    assert.equal(after.status.state, 'working');
    assert.ok(after.history.some((m: any) => m.role === 'agent' && /^aborted: /.test(m.parts[0]?.text)), 'the reply made on the way out is there');
    const waiting = await withQueue(stack.env, 'agent-tasks', (queue) => queue.getJobs(['wait']));
    assert.ok(waiting.some((j) => j?.data.task_id === task.id), 'the run is back in the queue');
  });

  it('a worker starts with a CommonJS module that exports a handler by name', async () => {
    const worker = await startWorker(testEnv({ AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/cjs-agent.cjs') }));
    await worker.stop();
  });

  it('a worker refuses to start with a module that exports no handler', async () => {
    const env = testEnv({ AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/no-handler-agent.ts') });
    await assert.rejects(startWorker(env), /exports no handler function/);
  });

  it('a worker refuses to start with a module whose top level throws what is no Error, saying what', async () => {
    // Before, the worker's own reading of the error threw: an uncaught TypeError, not the load failure.
    const env = testEnv({ AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/throw-null-agent.mjs') });
    await assert.rejects(startWorker(env), /could not be loaded: its top level threw null/);
  });
});

describe("the README's smallest agent module", () => {
  // Relative, as the README shows it: resolved from the working directory (the repository's root).
  const stack = useStack({ AGENT_KIND: 'module', AGENT_MODULE: './test/fixtures/echo-agent.mjs' });

  it('completes a task with its answer', async () => {
    const id = (await stack.client.post('/api/task/v1', { message: textMessage('hi there') })).body.task.id;
    const done = await waitFor(async () => {
      const t = (await stack.client.get(`/api/task/v1/${id}`)).body;
      return t.task.status === 'completed' && t;
    }, 'the task to complete');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: 'You said: hi there' }]);
  });
});

describe('AGENT_RUN_TIMEOUT_MS', () => {
  const marker = path.join(process.env.TEST_DATA_DIR!, `timeout-agent-${randomUUID()}.marker`);
  const stack = useStack({
    AGENT_KIND: 'module', AGENT_MODULE: path.join(ROOT, 'test/fixtures/signal-agent.ts'), SIGNAL_AGENT_MARKER: marker,
    // Well past what a run that is left alone takes on a loaded machine.
    AGENT_RUN_TIMEOUT_MS: '4500', AGENT_ATTEMPTS: '3', AGENT_BACKOFF_MS: '0',
  });
  const send = async (text: string) => (await stack.client.post('/api/task/v1', { message: textMessage(text) })).body.task.id as string;
  const ended = (id: string) => waitFor(async () => {
    const t = (await stack.client.get(`/api/task/v1/${id}`)).body;
    return ['completed', 'failed'].includes(t.task.status) && t;
  }, `task ${id} to end`, 30000);
  const TIMED_OUT = 'the run did not finish within AGENT_RUN_TIMEOUT_MS (4500 ms)';

  it('aborts a run past it, as a cancel does, and fails the task at once instead of retrying', async () => {
    const id = await send('wait');
    const done = await ended(id);
    assert.equal(done.task.status, 'failed');
    assert.deepEqual(done.status_message.parts, [{ type: 'text-part', text: `The agent failed after 1 attempt(s): ${TIMED_OUT}` }]);
    // The agent saw its signal fire, with the reason.
    assert.equal(fs.readFileSync(marker, 'utf8'), `aborted task ${id}: ${TIMED_OUT}`);
    const timeline = await stack.client.get(`/api/task/v1/${id}/timeline?order=asc`);
    assert.equal(timeline.body.items.filter((i: any) => i.event_payload.type === 'task-status-update' && i.event_payload.status === 'working').length, 2,
      'one run: its start and its one progress status');
  });

  it('ends a run whose agent ignores its signal, without waiting for the agent', async () => {
    // The agent sleeps for a minute; the task ends long before.
    const done = await ended(await send('ignore'));
    assert.equal(done.task.status, 'failed');
    assert.equal(done.status_message.parts[0].text, `The agent failed after 1 attempt(s): ${TIMED_OUT}`);
  });

  it('leaves a run within it alone', async () => {
    const done = await ended(await send('hello module'));
    assert.equal(done.task.status, 'completed');
  });
});

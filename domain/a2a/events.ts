// A task's timeline as A2A stream events. Postgres is the source: the follower re-reads the
// timeline after every wake-up note (domain/task-waiter.ts) and on a slow poll, so events
// arrive once each, in timeline order, whatever happens to the notes.
import type { Message as A2AMessage, TaskArtifactUpdateEvent, TaskStatusUpdateEvent } from '@a2a-js/sdk';
import type { Tx } from '../../db/knex.ts';
import { timelineSince, type TimelineRow } from '../../db/timeline.ts';
import * as messages from '../../db/messages.ts';
import { getTask } from '../../db/tasks.ts';
import type { Message } from '../shapes/task.ts';
import { isInterrupted, isTerminal, type TaskState } from '../task-states.ts';
import type { TaskFollow } from '../task-waiter.ts';
import { toA2AArtifact, toA2AMessage } from './mapping.ts';
import { TaskNotFoundError } from './errors.ts';

export type StreamEvent = TaskStatusUpdateEvent | TaskArtifactUpdateEvent | A2AMessage;

// A missed note delays an event by at most this long.
const POLL_MS = 2000;
const PAGE = 500;

/** The state a stream ends on: terminal, or waiting for the client (interrupted). */
export const isFinalState = (s: TaskState) => isTerminal(s) || isInterrupted(s);

export function statusEvent(taskId: string, contextId: string, state: TaskState, timestamp: string, message?: A2AMessage): TaskStatusUpdateEvent {
  return {
    kind: 'status-update', taskId, contextId, final: isFinalState(state),
    status: { state, timestamp, ...(message ? { message } : {}) },
  };
}

async function toEvents(db: Tx, taskId: string, contextId: string, rows: TimelineRow[]): Promise<StreamEvent[]> {
  const seen = new Map<string, Message>();
  const statusMessageIds = new Set<string>();
  for (const { event_payload: e } of rows) {
    if (e.type === 'message') seen.set(e.message.id, e.message);
    if (e.type === 'task-status-update' && e.status_message_id) statusMessageIds.add(e.status_message_id);
  }
  const out: StreamEvent[] = [];
  for (const row of rows) {
    const e = row.event_payload;
    const at = new Date(row.created_at).toISOString();
    if (e.type === 'message') {
      // A status message travels inside its status-update event, not twice.
      if (!statusMessageIds.has(e.message.id)) out.push(toA2AMessage(e.message, contextId));
    } else if (e.type === 'artifact-update') {
      const { append, lastChunk, ...artifact } = e.artifact as Record<string, unknown> & { append?: boolean; lastChunk?: boolean };
      out.push({
        kind: 'artifact-update', taskId, contextId, artifact: toA2AArtifact(artifact),
        ...(append !== undefined ? { append } : {}), ...(lastChunk !== undefined ? { lastChunk } : {}),
      });
    } else {
      const id = e.status_message_id;
      const msg = id ? seen.get(id) ?? (await messages.getMessage(db, id)) : undefined;
      out.push(statusEvent(taskId, contextId, e.status, at, msg ? toA2AMessage(msg, contextId) : undefined));
    }
  }
  return out;
}

/**
 * Yields the task's events after `afterSeq` until a final status-update (which is yielded) or
 * until `signal` aborts; throws TaskNotFoundError once the task is gone. `follow` must have been
 * registered before `afterSeq` was read.
 */
export async function* followTimeline(
  db: Tx, follow: TaskFollow, task: { id: string; contextId: string }, afterSeq: number, signal: AbortSignal,
): AsyncGenerator<StreamEvent> {
  const cursor: Cursor = { after: afterSeq, held: [] };
  // Read in a function of its own, and each event let go of once handed over: a stream waits for
  // its task to move holding no page (up to 8 MiB as parsed) of what it last sent.
  let page: Page | undefined;
  let event: StreamEvent | undefined;
  while (!signal.aborted) {
    page = await nextPage(db, task, cursor);
    while ((event = page.events.shift())) {
      yield event;
      if (event.kind === 'status-update' && event.final) return;
    }
    if (page.more) continue;
    page = undefined;
    await follow.wait(POLL_MS, signal);
  }
}

// A status message's item and its status-update are written together, one right after the other,
// so a read holds both or neither, unless the read was cut between the two (PAGE rows, 8 MiB): a
// message that ends a cut read waits (`held`) for the next read (at once: more is there), which starts
// with its status-update if it has one, rather than going out alone and again inside it. A read that
// was not cut holds all, so nothing waits on a live stream.
interface Cursor { after: number; held: TimelineRow[] }
interface Page { events: StreamEvent[]; more: boolean }

async function nextPage(db: Tx, task: { id: string; contextId: string }, cursor: Cursor): Promise<Page> {
  const { rows, more } = await timelineSince(db, task.id, cursor.after, PAGE);
  if (!rows.length) {
    // Deleted (by hand: the retention purge takes ended tasks only): no final event will come, and nothing
    // notes a delete, so an empty read looks; the client gets -32001, not an endless stream.
    if (!(await getTask(db, task.id))) throw new TaskNotFoundError(task.id);
    return { events: [], more: false };
  }
  cursor.after = rows[rows.length - 1].seq;
  const read = [...cursor.held, ...rows];
  cursor.held = more && read[read.length - 1].event_payload.type === 'message' ? read.splice(-1) : [];
  return { events: await toEvents(db, task.id, task.contextId, read), more };
}

import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { ErrorBody, PageQuery, Paginated, RequiredPageQuery, requestErrors, resourceErrors, Uuid } from '../../domain/shapes/common.ts';
import { ContextInfoPaginatedResponse, CreateMessageRequest, CreateTaskRequest, GetTaskResponse, Message, Task, TaskStatus, TimelineItem, UpdateTaskRequest } from '../../domain/shapes/task.ts';
import * as taskDomain from '../../domain/tasks.ts';
import * as taskRepo from '../../db/tasks.ts';
import { listMessages } from '../../db/messages.ts';
import { listTimeline } from '../../db/timeline.ts';

const tag = 'task';
const TaskId = Type.Object({ task_id: Uuid });
const AddedMessage = Type.Object({ message: Message, timeline_item: TimelineItem });
const CreatedTask = Type.Object({ task: Task, message: Message });

export const taskRoutes = [
  defineRoute({
    method: 'get', path: '/api/task/v1/context', operationId: 'list-contexts', tag, scope: 'task:read',
    summary: 'List task contexts, each once, newest first',
    query: Type.Object(RequiredPageQuery),
    responses: { 200: ContextInfoPaginatedResponse, ...requestErrors },
  }, async ({ query, services }) => {
    const page = await taskRepo.listContexts(services.db, query.page_size, query.next_page_token);
    return page;
  }),

  defineRoute({
    method: 'get', path: '/api/task/v1/context/:context_id/task', operationId: 'list-tasks-by-context', tag, scope: 'task:read',
    summary: 'List the tasks of a context, newest first',
    params: Type.Object({ context_id: Uuid }),
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(Task), ...requestErrors },
  }, async ({ params, query, services }) => {
    const page = await taskRepo.listTasks(services.db, { context_id: params.context_id }, query.page_size!, query.next_page_token);
    return { ...page, items: page.items.map(taskRepo.toTask) };
  }),

  defineRoute({
    method: 'get', path: '/api/task/v1', operationId: 'list-tasks', tag, scope: 'task:read',
    summary: 'List tasks, newest first, optionally filtered by status or context',
    query: Type.Object({ ...PageQuery, status: Type.Optional(TaskStatus), context_id: Type.Optional(Uuid) }),
    responses: { 200: Paginated(Task), ...requestErrors },
  }, async ({ query, services }) => {
    const page = await taskRepo.listTasks(services.db, { status: query.status, context_id: query.context_id }, query.page_size!, query.next_page_token);
    return { ...page, items: page.items.map(taskRepo.toTask) };
  }),

  defineRoute({
    method: 'post', path: '/api/task/v1', operationId: 'create-task', tag, scope: 'task:write',
    summary: 'Create a task with its first message and enqueue its execution',
    body: CreateTaskRequest,
    // 409: the write lost a race, as any write may (a deadlock: raceConflict); a retry succeeds. Not
    // for a context task retention is deleting meanwhile: the intake waits for the purge and makes the
    // context again (db/tasks.ts insertTaskBundles).
    // 200: a retry of the send that created a task (domain/tasks.ts), answered with that task.
    responses: { 201: CreatedTask, 200: CreatedTask, ...resourceErrors, 409: ErrorBody },
    responseDescriptions: {
      201: 'The task is created',
      200: 'A retry: a task was created by a message with this client_message_id, role and content (and the same metadata and context_id, where given); nothing is stored, that task is returned as it stands, with its first message',
    },
  }, async ({ body, services, ctx }) => {
    const { task, message, retry } = await taskDomain.createTask(services, body);
    ctx.status = retry ? 200 : 201;
    return { task, message };
  }),

  defineRoute({
    method: 'get', path: '/api/task/v1/:task_id', operationId: 'get-task', tag, scope: 'task:read',
    summary: 'Get a task with its first messages and its status message',
    params: TaskId,
    // It takes no parameter: its messages_next_page_token continues at GET …/message. Refused here,
    // that token (or a page_size) would answer the same first page again, and a client would loop.
    query: Type.Object({}),
    responses: { 200: GetTaskResponse, ...resourceErrors },
  }, async ({ params, services }) => taskDomain.getTaskWithMessages(services.db, params.task_id)),

  defineRoute({
    method: 'put', path: '/api/task/v1/:task_id', operationId: 'update-task-status', tag, scope: 'task:write',
    summary: 'Change a task status, optionally with a status message',
    params: TaskId, body: UpdateTaskRequest,
    responses: { 200: Task, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, body, services }) => taskDomain.updateStatus(services, params.task_id, body.status, body.message)),

  defineRoute({
    method: 'get', path: '/api/task/v1/:task_id/message', operationId: 'list-task-messages', tag, scope: 'task:read',
    summary: 'List the messages of a task, oldest first',
    params: TaskId, query: Type.Object(PageQuery),
    responses: { 200: Paginated(Message), ...resourceErrors },
  }, async ({ params, query, services }) => {
    await taskDomain.requireTask(services.db, params.task_id);
    return listMessages(services.db, params.task_id, query.page_size!, query.next_page_token);
  }),

  defineRoute({
    method: 'post', path: '/api/task/v1/:task_id/message', operationId: 'send-message', tag, scope: 'task:write',
    summary: 'Add a message to a task; a user message to an interrupted task continues it',
    params: TaskId, body: CreateMessageRequest,
    // 200: a retry of a message the task holds (domain/tasks.ts), answered with the original.
    responses: { 201: AddedMessage, 200: AddedMessage, ...resourceErrors, 409: ErrorBody },
    responseDescriptions: {
      201: 'The message is stored',
      200: 'A retry: the task holds a message with this client_message_id, role and content; nothing is stored, the original is returned',
    },
  }, async ({ params, body, services, ctx }) => {
    const { message, timeline_item, retried } = await taskDomain.addMessage(services, params.task_id, body);
    ctx.status = retried ? 200 : 201;
    return { message, timeline_item };
  }),

  defineRoute({
    method: 'get', path: '/api/task/v1/:task_id/timeline', operationId: 'task-history', tag, scope: 'task:read',
    summary: 'The timeline of a task, newest first (order=asc for oldest first)',
    params: TaskId,
    query: Type.Object({ ...PageQuery, order: Type.Optional(Type.Union([Type.Literal('asc'), Type.Literal('desc')], { default: 'desc' })) }),
    responses: { 200: Paginated(TimelineItem), ...resourceErrors },
  }, async ({ params, query, services }) => {
    await taskDomain.requireTask(services.db, params.task_id);
    return listTimeline(services.db, params.task_id, query.order ?? 'desc', query.page_size!, query.next_page_token);
  }),
];

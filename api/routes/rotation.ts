import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { ErrorBody, NoInput } from '../../domain/shapes/common.ts';
import { AliasName, KeyJob, toKeyJob } from '../../domain/shapes/encryption.ts';
import { startAliasRotation } from '../../domain/alias-rotation.ts';

export const rotationRoutes = [
  defineRoute({
    method: 'post', path: '/api/encryption/v1/dek/alias/:alias/rotate', operationId: 'rotate-dek-alias', tag: 'encryption', scope: 'encryption:write',
    summary: 'Rotate an alias: new DEK under its envelope key, re-encrypt everything using the alias, repoint it (202 job; 200 with the job already running)',
    params: Type.Object({ alias: AliasName }),
    body: NoInput,
    // No 502: the request only queues the job; its worker makes the new DEK.
    responses: { 202: KeyJob, 200: KeyJob, 400: ErrorBody, 401: ErrorBody, 403: ErrorBody, 404: ErrorBody, 409: ErrorBody },
  }, async ({ params, services, ctx }) => {
    const { job, created } = await startAliasRotation(services, params.alias);
    ctx.status = created ? 202 : 200;
    return toKeyJob(job);
  }),
];

import { Type } from '@sinclair/typebox';
import { defineRoute } from '../route.ts';
import { ErrorBody, kmsErrors, NoControlChars, PageQuery, Paginated, requestErrors, resourceErrors, Success, Uuid } from '../../domain/shapes/common.ts';
import {
  Alias, AliasName, CreateAliasRequest, CreateDekRequest, CreateEnvelopeKeyRequest, DataEncryptionKey, DekId, DekListItem,
  EnvelopeId, EnvelopeKey, EnvelopeKeyWithCount, ImportDekRequest, KeyJob, MigrateRequest, UpdateAliasRequest,
  toAlias, toDek, toDekListItem, toEnvelopeKey, toKeyJob,
} from '../../domain/shapes/encryption.ts';
import * as keys from '../../domain/crypto/key-management.ts';
import { startMigrateAll } from '../../domain/crypto/dek-migration.ts';
import { cancelKeyJob, getJob } from '../../domain/crypto/key-jobs.ts';
import { envelopeKeyRow } from '../../domain/keyring.ts';

const tag = 'encryption';
const base = '/api/encryption/v1';
const Envelope = Type.Object({ envelope_id: EnvelopeId });

export const encryptionRoutes = [
  defineRoute({
    method: 'post', path: `${base}/envelope`, operationId: 'create-envelope-key', tag, scope: 'encryption:write',
    summary: 'Create an envelope key: a new local key file, or a reference to an AWS KMS key',
    body: CreateEnvelopeKeyRequest,
    responses: { 201: EnvelopeKey, ...resourceErrors, 409: ErrorBody },
  }, async ({ body, services }) => toEnvelopeKey(await keys.createEnvelopeKey(services, body))),

  defineRoute({
    method: 'get', path: `${base}/envelope`, operationId: 'list-envelope-keys', tag, scope: 'encryption:read',
    summary: 'List envelope keys, newest first',
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(EnvelopeKey), ...requestErrors },
  }, async ({ query, services }) => {
    const page = await keys.listEnvelopeKeys(services.db, query.page_size!, query.next_page_token);
    return { ...page, items: page.items.map(toEnvelopeKey) };
  }),

  defineRoute({
    method: 'get', path: `${base}/envelope/:envelope_id`, operationId: 'get-envelope-key', tag, scope: 'encryption:read',
    summary: 'Get an envelope key with the number of DEKs it wraps',
    params: Envelope,
    responses: { 200: EnvelopeKeyWithCount, ...resourceErrors },
  }, async ({ params, services }) => {
    const row = await keys.getEnvelopeKeyWithCount(services.db, params.envelope_id);
    return { ...toEnvelopeKey(row), dek_count: row.dek_count };
  }),

  defineRoute({
    method: 'delete', path: `${base}/envelope/:envelope_id`, operationId: 'delete-envelope-key', tag, scope: 'encryption:write',
    summary: 'Delete an envelope key that wraps no DEK (its local key file is kept)',
    params: Envelope,
    responses: { 200: Success, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, services }) => {
    await keys.deleteEnvelopeKey(services, params.envelope_id);
    return { success: true };
  }),

  defineRoute({
    method: 'post', path: `${base}/envelope/:envelope_id/dek`, operationId: 'create-dek', tag, scope: 'encryption:write',
    summary: 'Create a DEK under an envelope key (generated, or from an encrypted_dek that must unwrap); an id taken, or once a deleted DEK\'s, is 409',
    params: Envelope,
    body: CreateDekRequest,
    responses: { 201: DataEncryptionKey, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ params, body, services }) => {
    const dek = await keys.createDekUnder(services, params.envelope_id, { id: body.id, encryptedDek: body.encrypted_dek });
    return toDek(dek, await envelopeKeyRow(services.db, dek.envelope_key_id));
  }),

  defineRoute({
    method: 'post', path: `${base}/envelope/:envelope_id/dek/import`, operationId: 'import-dek', tag, scope: 'encryption:write',
    summary: 'Import a wrapped DEK; it must unwrap with the envelope key; an id taken, or once a deleted DEK\'s, is 409',
    params: Envelope,
    body: ImportDekRequest,
    responses: { 201: DataEncryptionKey, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ params, body, services }) => {
    const dek = await keys.createDekUnder(services, params.envelope_id, { id: body.id, encryptedDek: body.encrypted_data_encryption_key, encryptedDekField: 'encrypted_data_encryption_key' });
    return toDek(dek, await envelopeKeyRow(services.db, dek.envelope_key_id));
  }),

  defineRoute({
    method: 'get', path: `${base}/envelope/:envelope_id/dek`, operationId: 'list-deks', tag, scope: 'encryption:read',
    summary: 'List the DEKs wrapped by an envelope key, newest first (without wrapped keys)',
    params: Envelope,
    query: Type.Object(PageQuery),
    responses: { 200: Paginated(DekListItem), ...resourceErrors },
  }, async ({ params, query, services }) => {
    const page = await keys.listDeks(services.db, params.envelope_id, query.page_size!, query.next_page_token);
    return { ...page, items: page.items.map(toDekListItem) };
  }),

  defineRoute({
    method: 'post', path: `${base}/envelope/:envelope_id/dek/:dek_id/migrate`, operationId: 'migrate-dek', tag, scope: 'encryption:write',
    summary: 'Re-wrap one DEK under another envelope key, in place (same id, aliases and data)',
    params: Type.Object({ envelope_id: EnvelopeId, dek_id: DekId }),
    body: MigrateRequest,
    responses: { 200: DekListItem, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ params, body, services }) => toDekListItem(await keys.migrateDek(services, params.envelope_id, params.dek_id, body.to_envelope_encryption_key_id))),

  defineRoute({
    method: 'post', path: `${base}/envelope/:envelope_id/migrate`, operationId: 'migrate-all-deks', tag, scope: 'encryption:write',
    summary: 'Re-wrap every DEK of an envelope key under another, as a background job (202; 200 with the running job if one runs to the same target, 409 if it goes elsewhere)',
    params: Envelope,
    body: MigrateRequest,
    responses: { 202: KeyJob, 200: KeyJob, ...resourceErrors, 409: ErrorBody, ...kmsErrors },
  }, async ({ params, body, services, ctx }) => {
    const { job, created } = await startMigrateAll(services, params.envelope_id, body.to_envelope_encryption_key_id);
    ctx.status = created ? 202 : 200;
    return toKeyJob(job);
  }),

  defineRoute({
    method: 'get', path: `${base}/job/:job_id`, operationId: 'get-key-job', tag, scope: 'encryption:read',
    summary: 'Get a key job (bulk migration, alias rotation) with its progress',
    params: Type.Object({ job_id: Uuid }),
    responses: { 200: KeyJob, ...resourceErrors },
  }, async ({ params, services }) => toKeyJob(await getJob(services.db, params.job_id))),

  defineRoute({
    method: 'post', path: `${base}/job/:job_id/cancel`, operationId: 'cancel-key-job', tag, scope: 'encryption:write',
    summary: 'Cancel a queued or running key job: it stops after the batch in flight, what it moved staying moved (200 with the job canceled; 202 with it still running while a batch is in flight, canceled once that batch ends; 409 once it ended otherwise)',
    params: Type.Object({ job_id: Uuid }),
    responses: { 200: KeyJob, 202: KeyJob, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, services, log, ctx }) => {
    const { job, outcome } = await cancelKeyJob(services, params.job_id);
    if (outcome !== 'already') log.info({ job_id: job.id, kind: job.kind, done: job.done, failed: job.failed, total: job.total }, outcome === 'canceled' ? 'key job canceled' : 'key job cancel requested: it stops after the batch in flight');
    ctx.status = outcome === 'requested' ? 202 : 200;
    return toKeyJob(job);
  }),

  defineRoute({
    method: 'post', path: `${base}/dek/alias`, operationId: 'create-dek-alias', tag, scope: 'encryption:write',
    summary: 'Give a DEK an alias',
    body: CreateAliasRequest,
    responses: { 201: Alias, ...resourceErrors, 409: ErrorBody },
  }, async ({ body, services }) => toAlias(await keys.createAlias(services, body.alias, body.dek_id))),

  defineRoute({
    method: 'get', path: `${base}/dek/alias/:alias`, operationId: 'get-dek-by-alias', tag, scope: 'encryption:read',
    summary: 'Get a DEK by alias, or else by DEK id',
    params: Type.Object({ alias: Type.String({ minLength: 1, maxLength: 200, pattern: NoControlChars }) }),
    responses: { 200: DataEncryptionKey, ...resourceErrors },
  }, async ({ params, services }) => {
    const dek = await keys.getDekByAliasOrId(services.db, params.alias);
    return toDek(dek, await envelopeKeyRow(services.db, dek.envelope_key_id));
  }),

  defineRoute({
    method: 'put', path: `${base}/dek/alias/:alias`, operationId: 'update-dek-alias', tag, scope: 'encryption:write',
    summary: 'Point an alias at another DEK',
    params: Type.Object({ alias: AliasName }),
    body: UpdateAliasRequest,
    responses: { 200: Alias, ...resourceErrors },
  }, async ({ params, body, services }) => toAlias(await keys.updateAliasTarget(services, params.alias, body.new_dek_id))),

  defineRoute({
    method: 'delete', path: `${base}/dek/alias/:alias`, operationId: 'delete-dek-alias', tag, scope: 'encryption:write',
    summary: 'Delete an alias that no secret uses',
    params: Type.Object({ alias: AliasName }),
    responses: { 200: Success, ...resourceErrors, 409: ErrorBody },
  }, async ({ params, services }) => {
    await keys.removeAlias(services, params.alias);
    return { success: true };
  }),
];

import { Type } from '@sinclair/typebox';
import { Body, FreeObject, NoControlChars, NotDotSegment, Timestamp, Uuid } from './common.ts';
import type { EnvelopeKeyRow } from '../../db/envelope-keys.ts';
import type { AliasRow, DekListRow, DekRow } from '../../db/deks.ts';
import type { KeyJobRow } from '../../db/key-jobs.ts';
import { worded } from '../schema-check.ts';
import { KEY_JOB_ENDED, KEY_JOB_OPEN } from '../key-job-states.ts';

export const FileName = Type.String({ pattern: worded('^[A-Za-z0-9_.-]{1,255}$', 'must be a file name: 1 to 255 of A-Z a-z 0-9 _ . -'), description: 'plain file name under KEYS_DIR (no separators, no "..")' });
const dekId = { pattern: worded('^[A-Za-z0-9_.:-]{1,200}$', 'must be 1 to 200 of A-Z a-z 0-9 _ . : -'), description: 'DEK id: a UUID unless given at creation' };
export const DekId = Type.String(dekId);
export const NewDekId = Type.String({ ...dekId, ...NotDotSegment, description: `${dekId.description}; not "." or ".."` });
const aliasName = { pattern: worded('^[A-Za-z0-9_.:-]{1,128}$', 'must be 1 to 128 of A-Z a-z 0-9 _ . : -') };
export const AliasName = Type.String(aliasName);
export const NewAliasName = Type.String({ ...aliasName, ...NotDotSegment, description: 'not "." or ".."' });
// 2048, not KMS_ARN_MAX_LENGTH: ids of keys stored before that cap stay addressable.
export const EnvelopeId = Type.String({ minLength: 1, maxLength: 2048, pattern: NoControlChars, description: 'file_name of a local key, ARN of a KMS key (URL-encoded in paths)' });
const WrappedDek = Type.String({ minLength: 1, maxLength: 16384, description: 'base64 wrapped DEK' });

export const EnvelopeKey = Type.Object({
  id: Type.String(),
  type: Type.Union([Type.Literal('local'), Type.Literal('aws_kms')]),
  file_name: Type.Optional(Type.String()),
  arn: Type.Optional(Type.String()),
  region: Type.Optional(Type.String()),
  created_at: Timestamp,
}, { $id: 'EnvelopeEncryptionKey' });
export const EnvelopeKeyWithCount = Type.Intersect([EnvelopeKey, Type.Object({ dek_count: Type.Integer() })]);

// The longest KMS alias ARN (alias names are at most 256 characters, a region at most 64 here) with
// room to spare; the id of a key is its ARN, and a list's page token carries the last id of a page, so
// an id this long still leaves its token within the 2048 characters a token may have.
const KMS_ARN_MAX_LENGTH = 512;

// One shape for both kinds; which members a kind needs is checked by the domain.
export const CreateEnvelopeKeyRequest = Body({
  type: Type.Union([Type.Literal('local'), Type.Literal('aws_kms')]),
  file_name: Type.Optional(FileName),
  arn: Type.Optional(Type.String({ minLength: 1, maxLength: KMS_ARN_MAX_LENGTH, description: `KMS key or alias ARN, at most ${KMS_ARN_MAX_LENGTH} characters` })),
  region: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
});

export const DataEncryptionKey = Type.Object({
  id: Type.String(),
  envelope_encryption_key_id: EnvelopeKey,
  encrypted_data_encryption_key: Type.String(),
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'DataEncryptionKey' });
export const DekListItem = Type.Object({
  id: Type.String(),
  envelope_encryption_key_id: Type.String(),
  created_at: Timestamp,
  updated_at: Timestamp,
}, { $id: 'DataEncryptionKeyListItem' });

export const CreateDekRequest = Body({ id: Type.Optional(NewDekId), encrypted_dek: Type.Optional(WrappedDek) });
export const ImportDekRequest = Body({ id: Type.Optional(NewDekId), encrypted_data_encryption_key: WrappedDek });
export const MigrateRequest = Body({ to_envelope_encryption_key_id: EnvelopeId });

export const Alias = Type.Object({ alias: Type.String(), data_encryption_key_id: Type.String(), created_at: Timestamp, updated_at: Timestamp }, { $id: 'DataEncryptionKeyAlias' });
export const CreateAliasRequest = Body({ dek_id: DekId, alias: NewAliasName });
export const UpdateAliasRequest = Body({ new_dek_id: DekId });

export const KeyJob = Type.Object({
  id: Uuid,
  kind: Type.String(),
  status: Type.Union([...KEY_JOB_OPEN, ...KEY_JOB_ENDED].map((s) => Type.Literal(s))),
  total: Type.Integer(),
  done: Type.Integer(),
  failed: Type.Integer(),
  errors: Type.Array(Type.Object({ id: Type.String(), message: Type.String() }), { description: 'items that failed (id: a DEK or secret, counted in failed) and, last, the reason the job failed (id: the job\'s own)' }),
  params: FreeObject,
  created_at: Timestamp,
  started_at: Type.Optional(Timestamp),
  finished_at: Type.Optional(Timestamp),
}, { $id: 'Job' });

const iso = (d: Date) => d.toISOString();

export function toEnvelopeKey(r: EnvelopeKeyRow) {
  return {
    id: r.id, type: r.type,
    ...(r.file_name !== null ? { file_name: r.file_name } : {}),
    ...(r.arn !== null ? { arn: r.arn, region: r.region! } : {}),
    created_at: iso(r.created_at),
  };
}

export const toDek = (r: DekRow, envelope: EnvelopeKeyRow) => ({
  id: r.id, envelope_encryption_key_id: toEnvelopeKey(envelope), encrypted_data_encryption_key: r.encrypted_dek,
  created_at: iso(r.created_at), updated_at: iso(r.updated_at),
});

export const toDekListItem = (r: DekListRow) => ({ id: r.id, envelope_encryption_key_id: r.envelope_key_id, created_at: iso(r.created_at), updated_at: iso(r.updated_at) });

export const toAlias = (r: AliasRow) => ({ alias: r.alias, data_encryption_key_id: r.dek_id, created_at: iso(r.created_at), updated_at: iso(r.updated_at) });

export const toKeyJob = (r: KeyJobRow) => ({
  id: r.id, kind: r.kind, status: r.status, total: r.total, done: r.done, failed: r.failed, errors: r.errors, params: r.params,
  created_at: iso(r.created_at),
  ...(r.started_at ? { started_at: iso(r.started_at) } : {}),
  ...(r.finished_at ? { finished_at: iso(r.finished_at) } : {}),
});

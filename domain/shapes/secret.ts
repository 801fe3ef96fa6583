import { Type, type Static } from '@sinclair/typebox';
import { Body, Timestamp, Uuid } from './common.ts';
import { AliasName, DekId } from './encryption.ts';
import { worded } from '../schema-check.ts';

const secretKey = {
  minLength: 1, maxLength: 256, pattern: worded('^[A-Za-z0-9_./-]+$', 'must be made of A-Z a-z 0-9 _ . / -'),
  description: 'Key name: 1..256 of A-Z a-z 0-9 _ . - /. In a path, encode "/" as %2F.',
};
export const SecretKey = Type.String(secretKey);
// A new key (common.ts NotDotSegment), between its slashes too: a proxy that decodes %2F (nginx's
// proxy_pass with a path does) resolves 'a/../b' to 'b', and one that merges slashes, or a router
// that ignores a trailing slash, reads 'a//b' or 'a/' as another key. Patterns of their own, so that
// a refused key is told which rule it breaks.
export const NewSecretKey = Type.String({
  ...secretKey,
  allOf: [
    { pattern: worded('^(?!(?:.*/)?\\.\\.?(?:/|$))', 'must not be "." or "..", nor have such a part between slashes (a URL cannot address it)') },
    { pattern: worded('^(?!/|.*//|.*/$)', 'must not begin or end with "/" nor hold "//" (a proxy that merges slashes, or a router that ignores a trailing one, reads it as another key)') },
  ],
  description: `${secretKey.description} Not "." or "..", nor with such a part between slashes; no empty part (no leading, trailing or double "/").`,
});

const common = {
  id: Uuid,
  key: SecretKey,
  dek_alias: AliasName,
  created_at: Timestamp,
  updated_at: Timestamp,
};

export const Secret = Type.Object({ ...common, encrypted_secret: Type.String({ description: 'base64(nonce ‖ AES-256-GCM ciphertext ‖ tag) under the DEK' }) }, { $id: 'Secret' });
export type Secret = Static<typeof Secret>;

// Why list-decrypted could not open a stored secret: its value changed in the table, its DEK not
// unwrapping with its envelope key, that key unusable (a local key file gone or of the wrong size), or
// KMS refusing its KMS key (disabled, pending deletion, deleted).
export const SECRET_DECRYPT_ERRORS = ['value_does_not_decrypt', 'dek_does_not_unwrap', 'envelope_key_unusable', 'kms_key_unusable'] as const;
export type SecretDecryptErrorCode = typeof SECRET_DECRYPT_ERRORS[number];

export const DecryptedSecret = Type.Object({
  ...common,
  decrypted_value: Type.Optional(Type.String({ description: 'The raw value; absent when decrypt_error is given' })),
  decrypt_error: Type.Optional(Type.Object({
    code: Type.Union(SECRET_DECRYPT_ERRORS.map((c) => Type.Literal(c))),
    message: Type.String({ description: 'What could not be opened, naming the secret, DEK or envelope key (never key material)' }),
  }, { description: 'Given instead of decrypted_value when the stored secret cannot be opened; the rest of the page is answered' })),
}, { $id: 'DecryptedSecret' });
export type DecryptedSecret = Static<typeof DecryptedSecret>;

export const CreateSecretRequest = Body({
  key: NewSecretKey,
  raw_value: Type.String(),
  dek_alias: Type.Optional(AliasName),
});

export const ImportSecretRequest = Body({
  id: Type.Optional(Uuid),
  key: NewSecretKey,
  encrypted_value: Type.String({ description: 'A value encrypted with the DEK the alias names (or data_encryption_key_id), in the format of encrypted_secret' }),
  dek_alias: AliasName,
  // An export (GET /api/a2a/v1/definition) names the DEK a secret was written with, which may be an
  // older one than its alias names now.
  data_encryption_key_id: Type.Optional(DekId),
});

export const UpdateSecretRequest = Body({
  raw_value: Type.String(),
  dek_alias: Type.Optional(AliasName),
});

export const SecretIdParams = Type.Object({ secret_id: Uuid });
export const SecretKeyParams = Type.Object({ key: SecretKey });

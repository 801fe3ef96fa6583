// AES-256-GCM in the wire format shared with the Soma platform:
// base64(nonce 12 bytes ‖ ciphertext ‖ 16-byte tag). Used both to wrap DEKs under a local
// envelope key and to encrypt values under a DEK. Associated data (`aad`), when given, is bound to
// the value without being stored in it: the value then opens only with the same aad.
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { InvalidRequest } from '../errors.ts';

export const KEY_BYTES = 32;
const NONCE_BYTES = 12;
const TAG_BYTES = 16;

// A value that does not decrypt under the key it names (wrong key, corrupt or truncated data).
export class DecryptError extends InvalidRequest {}

export function seal(key: Buffer, plaintext: Buffer, aad?: Buffer): Buffer {
  const nonce = randomBytes(NONCE_BYTES);
  const cipher = createCipheriv('aes-256-gcm', key, nonce);
  if (aad) cipher.setAAD(aad);
  const body = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([nonce, body, cipher.getAuthTag()]);
}

export function open(key: Buffer, blob: Buffer, what: string, aad?: Buffer): Buffer {
  if (blob.length < NONCE_BYTES + TAG_BYTES) throw new DecryptError(`${what} is too short to be an AES-256-GCM value`);
  const decipher = createDecipheriv('aes-256-gcm', key, blob.subarray(0, NONCE_BYTES));
  decipher.setAuthTag(blob.subarray(blob.length - TAG_BYTES));
  if (aad) decipher.setAAD(aad);
  try {
    return Buffer.concat([decipher.update(blob.subarray(NONCE_BYTES, blob.length - TAG_BYTES)), decipher.final()]);
  } catch {
    throw new DecryptError(`${what} does not decrypt with the key it names`);
  }
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

// Strict base64: Buffer.from would silently skip invalid characters.
export function fromBase64(value: string, what: string): Buffer {
  if (value.length % 4 !== 0 || !BASE64.test(value)) throw new DecryptError(`${what} is not valid base64`);
  return Buffer.from(value, 'base64');
}

export function sealBase64(key: Buffer, plaintext: Buffer, aad?: Buffer): string {
  return seal(key, plaintext, aad).toString('base64');
}

export function openBase64(key: Buffer, value: string, what: string, aad?: Buffer): Buffer {
  return open(key, fromBase64(value, what), what, aad);
}

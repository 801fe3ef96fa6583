// The AES-256-GCM wire format written out by hand from its description, base64(nonce 12 ‖ ct ‖ tag 16),
// so that tests check the service's ciphertexts without its own code.
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

export function openByHand(key: Buffer, b64: string): Buffer {
  const raw = Buffer.from(b64, 'base64');
  const d = createDecipheriv('aes-256-gcm', key, raw.subarray(0, 12));
  d.setAuthTag(raw.subarray(raw.length - 16));
  return Buffer.concat([d.update(raw.subarray(12, raw.length - 16)), d.final()]);
}

export function sealByHand(key: Buffer, data: Buffer): string {
  const nonce = randomBytes(12);
  const c = createCipheriv('aes-256-gcm', key, nonce);
  return Buffer.concat([nonce, c.update(data), c.final(), c.getAuthTag()]).toString('base64');
}

// Envelope keys (KEKs) wrap DEKs. Local keys are 32 random bytes in a file under KEYS_DIR; KMS
// keys wrap through AWS KMS. Wrapped formats: local = base64(nonce ‖ AES-256-GCM ct ‖ tag),
// KMS = base64 of the KMS ciphertext blob.
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { KMSClient, EncryptCommand, DecryptCommand, GenerateDataKeyCommand } from '@aws-sdk/client-kms';
import { AppError, InvalidRequest, Upstream } from '../errors.ts';
import type { EnvelopeKeyRow } from '../../db/envelope-keys.ts';
import { DecryptError, fromBase64, KEY_BYTES, openBase64, sealBase64 } from './aes-gcm.ts';

export interface KeyWrapper {
  wrap(dek: Buffer): Promise<string>;
  unwrap(wrapped: string): Promise<Buffer>;
  generate(): Promise<{ plain: Buffer; wrapped: string }>;
}

// A configured key that cannot be used (file gone, wrong size): a server-side fault.
export class KeyUnusable extends AppError {
  constructor(message: string) {
    super(500, 'internal', message);
  }
}

const FILE_NAME = /^[A-Za-z0-9_.-]{1,255}$/;

export function checkFileName(name: string): void {
  if (!FILE_NAME.test(name) || name.includes('..') || name === '.') {
    throw new InvalidRequest(`file_name '${name}' is not a plain file name`, [
      { path: 'body.file_name', message: 'must be 1..255 characters of [A-Za-z0-9_.-] without ".."' },
    ]);
  }
}

function keyPath(keysDir: string, name: string): string {
  checkFileName(name);
  return path.join(keysDir, name);
}

// Whether a key file of that name is there (one copied in before a first start is adopted).
export const localKeyFileExists = (keysDir: string, name: string): boolean => fs.existsSync(keyPath(keysDir, name));

// Creates the key file (0600) or adopts an existing one of the right size, e.g. a restored key,
// made 0600 if others could read it. The key is written to a temporary file and linked into
// place, so a key file is never seen half-written and two creators cannot both win.
export function createLocalKeyFile(keysDir: string, name: string): void {
  const file = keyPath(keysDir, name);
  fs.mkdirSync(keysDir, { recursive: true, mode: 0o700 });
  const tmp = path.join(keysDir, `.new-key-${randomBytes(8).toString('hex')}.tmp`);
  const fd = fs.openSync(tmp, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
  try {
    fs.writeSync(fd, randomBytes(KEY_BYTES));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  try {
    fs.linkSync(tmp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    const st = fs.lstatSync(file);
    if (!st.isFile() || st.size !== KEY_BYTES) {
      throw new InvalidRequest(`key file '${name}' already exists and is not a ${KEY_BYTES}-byte key`, [
        { path: 'body.file_name', message: `names an existing file that is not a ${KEY_BYTES}-byte key` },
      ]);
    }
    if (st.mode & 0o077) {
      try {
        // On the file opened without following links: the name cannot be swapped for a link meanwhile.
        const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
        try { fs.fchmodSync(fd, 0o600); } finally { fs.closeSync(fd); }
      } catch {
        throw new InvalidRequest(`key file '${name}' can be read by other users and this process cannot make it 0600`, [
          { path: 'body.file_name', message: 'names a key file other users can read' },
        ]);
      }
    }
  } finally {
    fs.rmSync(tmp, { force: true });
  }
}

// Reads a key file; never creates one.
const unreadable = (name: string, err: unknown) => new KeyUnusable(`local envelope key '${name}' cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
function checkKeySize(name: string, data: Buffer): Buffer {
  if (data.length !== KEY_BYTES) throw new KeyUnusable(`local envelope key '${name}' is ${data.length} bytes, not ${KEY_BYTES}`);
  return data;
}

// Without blocking the event loop: KEYS_DIR may be a network volume.
export async function readLocalKeyFile(keysDir: string, name: string): Promise<Buffer> {
  const file = keyPath(keysDir, name);
  let data: Buffer;
  try {
    const handle = await fs.promises.open(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
    try { data = await handle.readFile(); } finally { await handle.close(); }
  } catch (err) {
    throw unreadable(name, err);
  }
  return checkKeySize(name, data);
}

export function localWrapper(kek: Buffer): KeyWrapper & { wrapSync(dek: Buffer): string; unwrapSync(wrapped: string): Buffer } {
  const unwrapSync = (wrapped: string) => {
    const dek = openBase64(kek, wrapped, 'encrypted DEK');
    if (dek.length !== KEY_BYTES) throw new DecryptError(`encrypted DEK unwraps to ${dek.length} bytes, not ${KEY_BYTES}`);
    return dek;
  };
  const wrapSync = (dek: Buffer) => sealBase64(kek, dek);
  return {
    wrapSync,
    unwrapSync,
    async wrap(dek) { return wrapSync(dek); },
    async unwrap(wrapped) { return unwrapSync(wrapped); },
    async generate() {
      const plain = randomBytes(KEY_BYTES);
      return { plain, wrapped: wrapSync(plain) };
    },
  };
}

// The partitions AWS has (aws-eusc's regions start eusc-); any other is no KMS key, and letting one
// be any length let an id outgrow the page tokens that carry it (KMS_ARN_MAX_LENGTH).
const KMS_ARN = /^arn:(?:aws|aws-cn|aws-us-gov|aws-iso|aws-iso-b|aws-iso-e|aws-iso-f|aws-eusc):kms:([a-z]{2,4}(?:-[a-z]+)+-\d+):(\d{12}):(?:key\/[A-Za-z0-9-]{1,128}|alias\/[A-Za-z0-9/_-]{1,250})$/;

// `accounts` (AWS_KMS_ACCOUNTS): the accounts whose keys may be used. A key in an account someone
// else controls would give them every DEK wrapped under it (a migration to it sends them the DEKs).
export function checkKmsArn(arn: string, region: string, accounts?: string): void {
  const m = KMS_ARN.exec(arn);
  if (!m) throw new InvalidRequest(`arn '${arn}' is not a KMS key or alias ARN`, [{ path: 'body.arn', message: 'must be arn:aws:kms:<region>:<account>:key/<id> or …:alias/<name>' }]);
  if (m[1] !== region) throw new InvalidRequest(`region '${region}' does not match the ARN's region '${m[1]}'`, [{ path: 'body.region', message: `must be ${m[1]}, the ARN's region` }]);
  const allowed = accounts?.split(',');
  if (allowed && !allowed.includes(m[2])) {
    throw new InvalidRequest(`AWS account ${m[2]} is not one whose KMS keys may be used (AWS_KMS_ACCOUNTS: ${allowed.join(', ')})`, [{ path: 'body.arn', message: `must be a key of account ${allowed.join(' or ')}` }]);
  }
}

const kmsClients = new Map<string, KMSClient>();
function kmsClient(region: string, endpoint: string | undefined): KMSClient {
  const k = `${region} ${endpoint ?? ''}`;
  let c = kmsClients.get(k);
  if (!c) {
    c = new KMSClient({ region, ...(endpoint ? { endpoint } : {}), maxAttempts: 3 });
    kmsClients.set(k, c);
  }
  return c;
}

// KMS refusing a key for its state, which lasts until someone changes it (KMS's error, the key's state).
const KMS_KEY_STATES = new Map([
  ['DisabledException', 'is disabled'],
  ['KMSInvalidStateException', 'is in a state that cannot be used, such as pending deletion'],
  ['NotFoundException', 'does not exist'],
]);

// A KMS key that KMS refuses as it stands (disabled, pending deletion, deleted): a 502 as any KMS
// refusal, but a state of that one key rather than KMS failing, so list-decrypted lists the values
// under it and answers the rest. `lasting` when the state stays until someone changes it, which key
// jobs do not retry: KMSInvalidStateException also stands for a custom key store (CloudHSM, external)
// that is disconnected for a while, so it lasts only when KMS says the key is pending deletion.
export class KmsKeyUnusable extends Upstream {
  constructor(message: string, readonly lasting: boolean) {
    super(message, { upstream: 'aws_kms' });
  }
}

// A refusal of a KMS key for a state that lasts until someone changes it: key jobs do not retry it.
export const isLastingKmsRefusal = (err: unknown): err is KmsKeyUnusable => err instanceof KmsKeyUnusable && err.lasting;

// KMS failures: a ciphertext KMS rejects is the caller's bad value; anything else is upstream.
function kmsError(err: unknown, op: string, arn: string): Error {
  const e = err as { name?: string; message?: string };
  if (e.name === 'InvalidCiphertextException' || e.name === 'IncorrectKeyException') return new DecryptError('encrypted DEK does not unwrap with this KMS key');
  const state = KMS_KEY_STATES.get(e.name ?? '');
  if (state) {
    const lasting = e.name !== 'KMSInvalidStateException' || /pending deletion/i.test(e.message ?? '');
    return new KmsKeyUnusable(`AWS KMS ${op} failed: ${e.name} (KMS key '${arn}' ${state})`, lasting);
  }
  return new Upstream(`AWS KMS ${op} failed: ${e.name ?? 'error'}`, { upstream: 'aws_kms' });
}

// A whole KMS call, retries included: the SDK sets no timeout, so an endpoint that accepts and never
// answers would hold the API request, or the key job, that waits on it for ever.
const KMS_TIMEOUT_MS = 15_000;
const KMS_CIPHERTEXT_MAX_BYTES = 6144;

export function kmsWrapper(arn: string, region: string, endpoint: string | undefined, timeoutMs = KMS_TIMEOUT_MS): KeyWrapper {
  const client = kmsClient(region, endpoint);
  // An explicit timer, not AbortSignal.timeout, which Node 20 may garbage-collect unfired (nodejs/node#57736).
  const send = async <T>(op: string, call: (opts: { abortSignal: AbortSignal }) => Promise<T>): Promise<T> => {
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), timeoutMs);
    try {
      return await call({ abortSignal: timeout.signal });
    } catch (err) {
      if (timeout.signal.aborted) throw new Upstream(`AWS KMS ${op} failed: no answer within ${timeoutMs} ms`, { upstream: 'aws_kms' });
      throw kmsError(err, op, arn);
    } finally {
      clearTimeout(timer);
    }
  };
  return {
    async wrap(dek) {
      const out = await send('Encrypt', (o) => client.send(new EncryptCommand({ KeyId: arn, Plaintext: dek }), o));
      if (!out.CiphertextBlob) throw new Upstream('AWS KMS Encrypt returned no ciphertext', { upstream: 'aws_kms' });
      return Buffer.from(out.CiphertextBlob).toString('base64');
    },
    async unwrap(wrapped) {
      const blob = fromBase64(wrapped, 'encrypted DEK');
      if (!blob.length) throw new DecryptError('encrypted DEK is empty');
      // KMS refuses a longer CiphertextBlob as a ValidationException, which would read as KMS failing (502).
      if (blob.length > KMS_CIPHERTEXT_MAX_BYTES) throw new DecryptError(`encrypted DEK is ${blob.length} bytes, more than the ${KMS_CIPHERTEXT_MAX_BYTES} bytes of ciphertext AWS KMS takes`);
      const out = await send('Decrypt', (o) => client.send(new DecryptCommand({ KeyId: arn, CiphertextBlob: blob }), o));
      if (!out.Plaintext || out.Plaintext.length !== KEY_BYTES) throw new DecryptError(`encrypted DEK does not unwrap to a ${KEY_BYTES}-byte key`);
      return Buffer.from(out.Plaintext);
    },
    async generate() {
      const out = await send('GenerateDataKey', (o) => client.send(new GenerateDataKeyCommand({ KeyId: arn, KeySpec: 'AES_256' }), o));
      if (!out.Plaintext || !out.CiphertextBlob) throw new Upstream('AWS KMS GenerateDataKey returned no key', { upstream: 'aws_kms' });
      // Stored, a key of another length would fail every value sealed with it.
      if (out.Plaintext.length !== KEY_BYTES) throw new Upstream(`AWS KMS GenerateDataKey returned a ${out.Plaintext.length}-byte key, not ${KEY_BYTES}`, { upstream: 'aws_kms' });
      return { plain: Buffer.from(out.Plaintext), wrapped: Buffer.from(out.CiphertextBlob).toString('base64') };
    },
  };
}

export async function wrapperForRow(row: EnvelopeKeyRow, keysDir: string, kmsEndpoint: string | undefined): Promise<KeyWrapper> {
  if (row.type === 'local') return localWrapper(await readLocalKeyFile(keysDir, row.file_name!));
  return kmsWrapper(row.arn!, row.region!, kmsEndpoint);
}

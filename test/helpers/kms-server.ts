// A local AWS KMS stand-in speaking the KMS JSON protocol (POST /, X-Amz-Target:
// TrentService.<Op>, application/x-amz-json-1.1) for the calls the real SDK makes: Encrypt,
// Decrypt, GenerateDataKey, and the key state changes a test makes through the SDK: DisableKey,
// EnableKey, ScheduleKeyDeletion, CancelKeyDeletion. A key not enabled is refused as KMS refuses it
// (DisabledException, KMSInvalidStateException, NotFoundException once deleted). Ciphertext blobs
// name their key, as real KMS blobs do.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';

export interface KmsServer {
  url: string;
  calls: { op: string; keyId?: string }[];
  /** Holds the answers to calls of `op` (recorded in `calls` as they arrive) until the function it returns is called; given an error type, they are answered with that error. */
  hold(op: string): (fail?: string) => void;
  /** Ends a key's deletion waiting period (KMS has no call for it): the key is deleted. */
  deleteKey(arn: string): void;
  close(): Promise<void>;
}

export async function startKmsServer(keyArns: string[]): Promise<KmsServer> {
  const keys = new Map(keyArns.map((arn) => [arn, randomBytes(32)]));
  const states = new Map<string, 'Enabled' | 'Disabled' | 'PendingDeletion' | 'Deleted'>(keyArns.map((arn) => [arn, 'Enabled']));
  const calls: { op: string; keyId?: string }[] = [];
  const held = new Map<string, Promise<string | undefined>>();

  const seal = (arn: string, plain: Buffer) => {
    const nonce = randomBytes(12);
    const c = createCipheriv('aes-256-gcm', keys.get(arn)!, nonce);
    const ct = Buffer.concat([c.update(plain), c.final()]);
    const name = Buffer.from(arn);
    return Buffer.concat([Buffer.from([name.length >> 8, name.length & 255]), name, nonce, ct, c.getAuthTag()]);
  };
  const open = (blob: Buffer): { arn: string; plain: Buffer } | undefined => {
    if (blob.length < 2) return undefined;
    const n = blob.readUInt16BE(0);
    const arn = blob.subarray(2, 2 + n).toString();
    const key = keys.get(arn);
    const rest = blob.subarray(2 + n);
    if (!key || rest.length < 28) return undefined;
    try {
      const d = createDecipheriv('aes-256-gcm', key, rest.subarray(0, 12));
      d.setAuthTag(rest.subarray(rest.length - 16));
      return { arn, plain: Buffer.concat([d.update(rest.subarray(12, rest.length - 16)), d.final()]) };
    } catch {
      return undefined;
    }
  };

  const server = http.createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => { raw += c; });
    req.on('end', () => {
      const reply = (status: number, body: object) => {
        res.writeHead(status, { 'content-type': 'application/x-amz-json-1.1' });
        res.end(JSON.stringify(body));
      };
      const fail = (type: string, message: string) => reply(400, { __type: type, message });
      const target = String(req.headers['x-amz-target'] ?? '');
      if (req.method !== 'POST' || !String(req.headers['content-type']).startsWith('application/x-amz-json-1.1') || !target.startsWith('TrentService.')) {
        return fail('UnknownOperationException', 'not a KMS JSON request');
      }
      if (!/^AWS4-HMAC-SHA256 Credential=/.test(String(req.headers.authorization ?? ''))) return fail('UnrecognizedClientException', 'unsigned request');
      let body: Record<string, string>;
      try { body = JSON.parse(raw); } catch { return fail('SerializationException', 'bad JSON'); }
      const op = target.slice('TrentService.'.length);
      calls.push({ op, keyId: body.KeyId });
      const hold = held.get(op);
      if (hold) return void hold.then((error) => (error ? fail(error, `${op} failed`) : answer(op, body, reply, fail)));
      answer(op, body, reply, fail);
    });
  });
  type Reply = (status: number, body: object) => void;
  type Fail = (type: string, message: string) => void;
  // KMS's refusal of a use of a key that is not enabled: [error type, message]; undefined when it is.
  const unusable = (arn: string): [string, string] | undefined => {
    const state = states.get(arn);
    if (state === 'Disabled') return ['DisabledException', `${arn} is disabled.`];
    if (state === 'PendingDeletion') return ['KMSInvalidStateException', `${arn} is pending deletion.`];
    if (state === 'Deleted') return ['NotFoundException', `Key '${arn}' does not exist`];
    return undefined;
  };
  const answer = (op: string, body: Record<string, string>, reply: Reply, fail: Fail) => {
    if (['DisableKey', 'EnableKey', 'ScheduleKeyDeletion', 'CancelKeyDeletion'].includes(op)) {
      const state = states.get(body.KeyId);
      if (!state || state === 'Deleted') return fail('NotFoundException', `Key '${body.KeyId}' does not exist`);
      const pending = state === 'PendingDeletion';
      if (op === 'CancelKeyDeletion') {
        if (!pending) return fail('KMSInvalidStateException', `${body.KeyId} is not pending deletion.`);
        // As in KMS, a key whose deletion is canceled is disabled.
        states.set(body.KeyId, 'Disabled');
        return reply(200, { KeyId: body.KeyId });
      }
      if (pending) return fail('KMSInvalidStateException', `${body.KeyId} is pending deletion.`);
      if (op === 'ScheduleKeyDeletion') {
        states.set(body.KeyId, 'PendingDeletion');
        const days = Number(body.PendingWindowInDays ?? 30);
        return reply(200, { KeyId: body.KeyId, KeyState: 'PendingDeletion', PendingWindowInDays: days, DeletionDate: Date.now() / 1000 + days * 86_400 });
      }
      states.set(body.KeyId, op === 'DisableKey' ? 'Disabled' : 'Enabled');
      return reply(200, {});
    }
    if (op === 'Encrypt' || op === 'GenerateDataKey') {
      if (!keys.has(body.KeyId)) return fail('NotFoundException', `key ${body.KeyId} not found`);
      const refused = unusable(body.KeyId);
      if (refused) return fail(...refused);
      const plain = op === 'Encrypt' ? Buffer.from(body.Plaintext, 'base64') : randomBytes(body.KeySpec === 'AES_128' ? 16 : 32);
      const out = { CiphertextBlob: seal(body.KeyId, plain).toString('base64'), KeyId: body.KeyId, EncryptionAlgorithm: 'SYMMETRIC_DEFAULT' };
      return reply(200, op === 'Encrypt' ? out : { ...out, Plaintext: plain.toString('base64') });
    }
    if (op === 'Decrypt') {
      const blob = Buffer.from(body.CiphertextBlob ?? '', 'base64');
      // KMS's own length constraint on CiphertextBlob (1 to 6,144 bytes): a validation error, not a ciphertext one.
      if (!blob.length || blob.length > 6144) return fail('ValidationException', "1 validation error detected: Value at 'ciphertextBlob' failed to satisfy constraint: Member must have length less than or equal to 6144");
      const opened = open(blob);
      if (!opened) return fail('InvalidCiphertextException', 'ciphertext does not decrypt');
      if (body.KeyId && body.KeyId !== opened.arn) return fail('IncorrectKeyException', 'ciphertext was made under another key');
      const refused = unusable(opened.arn);
      if (refused) return fail(...refused);
      return reply(200, { Plaintext: opened.plain.toString('base64'), KeyId: opened.arn, EncryptionAlgorithm: 'SYMMETRIC_DEFAULT' });
    }
    return fail('UnknownOperationException', `operation ${op} not implemented here`);
  };
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    calls,
    hold(op) {
      let release!: (error?: string) => void;
      held.set(op, new Promise<string | undefined>((resolve) => { release = resolve; }));
      return (error?: string) => { held.delete(op); release(error); };
    },
    deleteKey(arn) {
      states.set(arn, 'Deleted');
    },
    close: () => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()); }),
  };
}

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { loadConfig } from '../domain/config.ts';
import { createServices, type Services } from '../domain/services.ts';
import { DecryptError, openBase64, sealBase64 } from '../domain/crypto/aes-gcm.ts';
import { checkKmsArn, createLocalKeyFile, KeyUnusable, kmsWrapper, localWrapper, readLocalKeyFile } from '../domain/crypto/envelope-keys.ts';
import { UnrecoverableError, type Job } from 'bullmq';
import { createEnvelopeKey, bootstrapKeys } from '../domain/crypto/key-management.ts';
import { startMigrateAll } from '../domain/crypto/dek-migration.ts';
import { createDek, decryptWithDek, encryptWithDek, forgetWrapper, repointAlias, resolveAlias, startKeyringInvalidation } from '../domain/keyring.ts';
import { createMigrateDeksProcessor } from '../workers/migrate-deks.ts';
import type { JobPayloads } from '../queues/names.ts';
import { insertAlias } from '../db/deks.ts';
import { AppError, InvalidRequest, NotFound, Upstream } from '../domain/errors.ts';
import { resetDb, testEnv, useProcessEnv } from './helpers/stack.ts';
import { startKmsServer, type KmsServer } from './helpers/kms-server.ts';
import { openByHand, sealByHand } from './helpers/aes-gcm-by-hand.ts';

describe('crypto: AES-256-GCM formats and local envelope keys', () => {
  it('round-trips values and rejects a wrong key, a tampered value and bad base64', () => {
    const key = randomBytes(32);
    const sealed = sealBase64(key, Buffer.from('héllo'));
    assert.equal(openBase64(key, sealed, 'v').toString(), 'héllo');
    assert.throws(() => openBase64(randomBytes(32), sealed, 'v'), DecryptError);
    const raw = Buffer.from(sealed, 'base64');
    raw[14] ^= 1;
    assert.throws(() => openBase64(key, raw.toString('base64'), 'v'), DecryptError);
    assert.throws(() => openBase64(key, 'not*base64', 'v'), DecryptError);
    assert.throws(() => openBase64(key, 'AAAA', 'v'), DecryptError);
    assert.ok(new DecryptError('x') instanceof InvalidRequest);
  });

  it('wraps DEKs compatibly with a plain AES-256-GCM implementation of the format', async () => {
    const kek = randomBytes(32);
    const w = localWrapper(kek);
    const { plain, wrapped } = await w.generate();
    assert.equal(Buffer.from(wrapped, 'base64').length, 12 + 32 + 16);
    assert.deepEqual(openByHand(kek, wrapped), plain);
    const foreign = randomBytes(32);
    assert.deepEqual(await w.unwrap(sealByHand(kek, foreign)), foreign);
    await assert.rejects(w.unwrap(sealByHand(kek, randomBytes(16))), DecryptError);
  });

  it('creates key files 0600, adopts a 32-byte file, rejects traversal and wrong sizes, never creates on read', async () => {
    const dir = path.join(process.env.TEST_DATA_DIR!, 'keys-unit');
    createLocalKeyFile(dir, 'a.key');
    const st = fs.statSync(path.join(dir, 'a.key'));
    assert.equal(st.size, 32);
    assert.equal(st.mode & 0o777, 0o600);
    const before = await readLocalKeyFile(dir, 'a.key');
    createLocalKeyFile(dir, 'a.key');
    assert.deepEqual(await readLocalKeyFile(dir, 'a.key'), before);
    for (const bad of ['../x', '..', '.', 'a/b', 'a..b', '', 'x'.repeat(256), 'a\0b']) {
      assert.throws(() => createLocalKeyFile(dir, bad), InvalidRequest, bad);
      await assert.rejects(readLocalKeyFile(dir, bad), InvalidRequest, bad);
    }
    fs.writeFileSync(path.join(dir, 'short.key'), randomBytes(16));
    assert.throws(() => createLocalKeyFile(dir, 'short.key'), InvalidRequest);
    await assert.rejects(readLocalKeyFile(dir, 'short.key'), KeyUnusable);
    await assert.rejects(readLocalKeyFile(dir, 'missing.key'), KeyUnusable);
    // A symlink in the keys directory is not adopted nor followed, even to a 32-byte file.
    fs.writeFileSync(path.join(process.env.TEST_DATA_DIR!, 'outside.key'), randomBytes(32));
    fs.symlinkSync(path.join(process.env.TEST_DATA_DIR!, 'outside.key'), path.join(dir, 'link.key'));
    assert.throws(() => createLocalKeyFile(dir, 'link.key'), InvalidRequest);
    await assert.rejects(readLocalKeyFile(dir, 'link.key'), KeyUnusable);
    assert.deepEqual(fs.readdirSync(dir).filter((f) => f.endsWith('.tmp')), []);
    assert.equal(fs.existsSync(path.join(dir, 'missing.key')), false);
  });
});

describe('keyring: DEKs, aliases and value encryption against Postgres', () => {
  let s: Services;
  before(async () => {
    await resetDb();
    s = createServices(loadConfig(testEnv({ LOG_LEVEL: 'silent' })), 'cli');
    await startKeyringInvalidation(s);
  });
  after(async () => s?.close());
  // What the alias names now, and a value sealed with it.
  const encryptUnder = async (alias: string, plaintext: string) => {
    const dekId = await resolveAlias(s.db, alias);
    return { dekId, ciphertext: await encryptWithDek(s, dekId, plaintext) };
  };

  it('bootstraps a local envelope key and the default alias once', async () => {
    assert.equal(await s.db.transaction((trx) => bootstrapKeys(s, trx)), 'created');
    assert.equal(await s.db.transaction((trx) => bootstrapKeys(s, trx)), undefined);
    const { dekId, ciphertext } = await encryptUnder('default', 'first secret');
    assert.equal(await resolveAlias(s.db, 'default'), dekId);
    assert.equal(await decryptWithDek(s, dekId, ciphertext), 'first secret');
  });

  it('encrypts with DEKs, repoints aliases, and reports unknown names', async () => {
    const kek = await createEnvelopeKey(s, { type: 'local', file_name: 'keyring-test.key' });
    const a = await createDek(s, kek.id);
    const b = await createDek(s, kek.id, undefined, { id: 'dek-b' });
    await insertAlias(s.db, 'app', a.id);
    const one = await encryptUnder('app', 'v1');
    assert.equal(one.dekId, a.id);
    await s.db.transaction((trx) => repointAlias(trx, 'app', b.id));
    const two = await encryptUnder('app', 'v2');
    assert.equal(two.dekId, 'dek-b');
    assert.equal(await decryptWithDek(s, a.id, one.ciphertext), 'v1');
    assert.equal(await decryptWithDek(s, b.id, two.ciphertext), 'v2');
    await assert.rejects(decryptWithDek(s, b.id, one.ciphertext), DecryptError);
    await assert.rejects(encryptUnder('nope', 'x'), (e: unknown) => e instanceof NotFound && e.data.resource === 'dek_alias');
    await assert.rejects(encryptWithDek(s, 'nope', 'x'), NotFound);
    await assert.rejects(s.db.transaction((trx) => repointAlias(trx, 'nope', b.id)), NotFound);
    await assert.rejects(s.db.transaction((trx) => repointAlias(trx, 'app', 'nope')), NotFound);
    // An imported DEK must unwrap under its envelope key.
    const imported = await createDek(s, kek.id, undefined, { encryptedDek: a.encrypted_dek });
    assert.notEqual(imported.id, a.id);
    await assert.rejects(createDek(s, kek.id, undefined, { encryptedDek: sealBase64(randomBytes(32), randomBytes(32)) }), InvalidRequest);
    await assert.rejects(createDek(s, kek.id, undefined, { id: 'dek-b' }), (e: unknown) => e instanceof AppError && e.status === 409);
  });

  // The migration worker drops every process's cached DEKs as a migration ends (its last batch, a
  // cancel, a failure). That note going nowhere (Redis away) must not change how the job ends for
  // BullMQ: a failed one still rejects with UnrecoverableError (no retry), a completed one resolves.
  it('ends a DEK migration as it ended when the cache invalidation cannot be published', async () => {
    const job = (jobId: string) => ({ data: { job_id: jobId }, name: 'migrate-deks', attemptsMade: 0, opts: { attempts: 5 }, updateProgress: async () => undefined }) as unknown as Job<JobPayloads['key-jobs']>;
    const run = createMigrateDeksProcessor(s, new AbortController().signal);
    for (const f of ['mig-src.key', 'mig-dst.key', 'mig-gone.key']) await createEnvelopeKey(s, { type: 'local', file_name: f });
    await createDek(s, 'mig-src.key');
    await createDek(s, 'mig-gone.key');
    const done = await startMigrateAll(s, 'mig-src.key', 'mig-dst.key');
    const failing = await startMigrateAll(s, 'mig-gone.key', 'mig-dst.key');
    // Its source key file gone (and not cached here): its first batch fails for good.
    fs.rmSync(path.join(s.cfg.KEYS_DIR, 'mig-gone.key'));
    forgetWrapper('mig-gone.key');
    const publish = s.bus.publish;
    s.bus.publish = async () => { throw new Error('Redis is away'); };
    try {
      await run(job(done.job.id));
      assert.equal((await s.db('key_jobs').where({ id: done.job.id }).first()).status, 'completed');
      await assert.rejects(run(job(failing.job.id)), UnrecoverableError);
      assert.equal((await s.db('key_jobs').where({ id: failing.job.id }).first()).status, 'failed');
    } finally {
      s.bus.publish = publish;
    }
  });
});

describe('crypto: AWS KMS envelope keys through the real SDK against a local KMS endpoint', () => {
  const arn = 'arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab';
  const other = 'arn:aws:kms:eu-west-1:123456789012:alias/other';
  let kms: KmsServer;
  useProcessEnv({ AWS_ACCESS_KEY_ID: 'AKIDLOCALTEST', AWS_SECRET_ACCESS_KEY: 'local-test-secret' });
  before(async () => {
    kms = await startKmsServer([arn, other]);
  });
  after(async () => kms?.close());

  it('generates, wraps and unwraps DEKs with GenerateDataKey, Encrypt and Decrypt', async () => {
    const w = kmsWrapper(arn, 'eu-west-1', kms.url);
    const { plain, wrapped } = await w.generate();
    assert.equal(plain.length, 32);
    assert.deepEqual(await w.unwrap(wrapped), plain);
    const mine = randomBytes(32);
    assert.deepEqual(await w.unwrap(await w.wrap(mine)), mine);
    assert.deepEqual(kms.calls.map((c) => c.op), ['GenerateDataKey', 'Decrypt', 'Encrypt', 'Decrypt']);
    assert.ok(kms.calls.every((c) => c.keyId === arn));
  });

  it('maps a foreign or corrupt ciphertext to DecryptError and other KMS failures to Upstream', async () => {
    const w = kmsWrapper(arn, 'eu-west-1', kms.url);
    const foreign = await kmsWrapper(other, 'eu-west-1', kms.url).wrap(randomBytes(32));
    await assert.rejects(w.unwrap(foreign), DecryptError);
    await assert.rejects(w.unwrap(Buffer.from('garbage').toString('base64')), DecryptError);
    await assert.rejects(w.unwrap('**'), DecryptError);
    const missing = 'arn:aws:kms:eu-west-1:123456789012:key/ffffffff-0000-0000-0000-000000000000';
    await assert.rejects(kmsWrapper(missing, 'eu-west-1', kms.url).generate(), Upstream);
  });

  it('ends a call to a KMS endpoint that accepts and never answers, and refuses a generated key of the wrong length', async () => {
    const silent = http.createServer(() => undefined);
    const short = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-amz-json-1.1' });
      res.end(JSON.stringify({ Plaintext: randomBytes(16).toString('base64'), CiphertextBlob: randomBytes(60).toString('base64'), KeyId: arn }));
    });
    await Promise.all([silent, short].map((s) => new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve))));
    const urlOf = (s: http.Server) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
    try {
      // Without the timeout the call never ends (the test's own timeout fails it).
      await assert.rejects(kmsWrapper(arn, 'eu-west-1', urlOf(silent), 500).wrap(randomBytes(32)), (e: unknown) => e instanceof Upstream && /no answer within 500 ms/.test(e.message));
      await assert.rejects(kmsWrapper(arn, 'eu-west-1', urlOf(short)).generate(), (e: unknown) => e instanceof Upstream && /16-byte/.test(e.message));
    } finally {
      silent.closeAllConnections();
      await Promise.all([silent, short].map((s) => new Promise((resolve) => s.close(resolve))));
    }
  });

  it('accepts only KMS key or alias ARNs whose region matches', () => {
    checkKmsArn(arn, 'eu-west-1');
    checkKmsArn(other, 'eu-west-1');
    assert.throws(() => checkKmsArn(arn, 'us-east-1'), InvalidRequest);
    for (const bad of ['arn:aws:s3:::bucket', 'arn:aws:kms:eu-west-1:123:key/x', 'key/abc', `${arn}/../x`]) assert.throws(() => checkKmsArn(bad, 'eu-west-1'), InvalidRequest, bad);
  });
});

// `npm run cli -- definition apply <file>`: applies a definition export (GET /api/a2a/v1/definition) to
// a running installation through its HTTP API, each part after those it needs: envelope keys and
// the file's names only checked (missingKeysMessage, domain/definition-check.ts), then DEKs under
// them with their ids, aliases, secrets, then each provider's credentials, the instance and its
// functions. An item already there as the file has it is skipped, one there otherwise is a conflict
// left as it is (domain/definition-match.ts), so applying twice, or after a run cut short, writes
// only what is missing. Prints ids, keys and names, never a
// value, token or key material (the file holds those only sealed anyway).
import { constants } from 'node:buffer';
import fs from 'node:fs/promises';
import type { TSchema } from '@sinclair/typebox';
import { setTimeout as sleep } from 'node:timers/promises';
import { Definition } from '../domain/shapes/definition.ts';
import type { CredentialKind } from '../db/bridge.ts';
import type { ListedCredential } from '../domain/shapes/bridge.ts';
import { InvalidRequest, memberPath, NotFound } from '../domain/errors.ts';
import { checkValid, compileSchema } from '../domain/schema-check.ts';
import { DEFAULT_ALIAS } from '../domain/crypto/key-management.ts';
import { retryAfterMs } from '../domain/retry-after.ts';
import { findUnstorable } from '../domain/storable-json.ts';
import { definitionProblems, definitionReferences, naming, targetCannotMake, type TargetCatalog, type TargetNames } from '../domain/definition-check.ts';
import {
  aliasTargets, credentialDifference, disableUnfinished, providerDifference, secretDifference, settableStatus,
  type DefinitionCredential, type DefinitionProvider, type DefinitionSecret,
} from '../domain/definition-match.ts';

const FORMAT = 'taskbridge-definition/v1';
const KINDS = ['deks', 'aliases', 'secrets', 'credentials', 'providers', 'functions'] as const;
type Kind = (typeof KINDS)[number];
type Outcome = 'created' | 'updated' | 'present' | 'conflict' | 'failed';
// outdated: there otherwise than the file has it, and made as the file has it (`default`; a provider an
// earlier apply left undisabled): its write is an update.
type Found = { state: 'absent' } | { state: 'outdated' } | { state: 'present' } | { state: 'conflict'; why: string };
const absent: Found = { state: 'absent' };
const present: Found = { state: 'present' };
const differing = (why: string | undefined): Found => (why === undefined ? present : { state: 'conflict', why });
// The kinds of which an item can be outdated: their lines count updates.
const UPDATED_KINDS: readonly Kind[] = ['aliases', 'providers'];

// Secrets are independent of one another: a few requests at once keep a large export from taking a
// round trip after another.
const SECRETS_AT_ONCE = 8;
const PROGRESS_EVERY = 500;
// Answers that ask to come back later (over the target's RATE_LIMIT_PER_SECOND; busy, or its database
// out of reach a moment): asked again after their Retry-After (or a backoff without one), this many times.
const AGAIN_LATER = [429, 503];
const RETRIES = 8;

// The file cannot be applied at all (exit 2).
export class DefinitionFileError extends Error {}
// The run cannot go on: the API out of reach, the key refused (exit 1).
export class ApplyAborted extends Error {}
// An answer the step did not expect: the item failed.
class Refused extends Error {}

// Unknown members warned of one a line; a newer release's export may add one to every item.
const UNKNOWN_SHOWN = 20;

// Read whole: no streaming JSON parser is among the dependencies, so an export takes its size
// several times over in memory while it is parsed. `warn` is told of members the file has that this
// command does not know: ignored, not refused, so that a newer release's export still applies.
export async function readDefinition(file: string, warn: (line: string) => void): Promise<Definition> {
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (e) {
    // Past the longest string Node.js holds: its own message, 'Invalid string length', says nothing of what to do.
    if (e instanceof RangeError) throw new DefinitionFileError(`${file} is too large to read whole (over ${Math.floor(constants.MAX_STRING_LENGTH / 2 ** 20)} MiB): apply it in parts, each the file with fewer items: first with its envelope_keys only (secrets and providers empty), then with no envelope_keys and some of its secrets or providers`);
    throw new DefinitionFileError(`cannot read ${file}: ${(e as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new DefinitionFileError(`${file} is not JSON: ${(e as Error).message}`);
  }
  const format = (doc as { format?: unknown } | null)?.format;
  if (format !== FORMAT) throw new DefinitionFileError(`${file} is not a definition export: its format is ${JSON.stringify(format)}, not "${FORMAT}" (GET /api/a2a/v1/definition writes one)`);
  try {
    checkValid(compileSchema(Definition), doc, 'file');
  } catch (e) {
    if (e instanceof InvalidRequest) throw new DefinitionFileError(`${file} is not a valid definition export: ${e.message}`);
    throw e;
  }
  const def = doc as Definition;
  // A credential is sent as its import's body, whose free-form value and metadata the schema leaves
  // unbounded: one the API would refuse (nested past its limit, which also overflows JSON.stringify
  // here) is refused with the file, before anything is written, not after what comes before it.
  for (const [i, p] of def.providers.entries()) {
    for (const member of ['resource_server_credential', 'user_credential'] as const) {
      const c = p[member];
      const problem = c && findUnstorable(c, `file.providers.${i}.${member}`);
      if (problem) throw new DefinitionFileError(`${file} cannot be applied: ${member.replace(/_/g, ' ')} ${c.id} of provider ${p.id}: ${problem.path} ${problem.message}, as the API refuses a body; nothing was written`);
    }
  }
  const unknown: string[] = [];
  unknownMembers(Definition, doc, 'file', unknown);
  for (const path of unknown.slice(0, UNKNOWN_SHOWN)) warn(`warning: ${path} is not a member of a definition export this command knows: ignored (misspelt, or of a newer release's export)`);
  if (unknown.length > UNKNOWN_SHOWN) warn(`warning: and ${unknown.length - UNKNOWN_SHOWN} more members this command does not know: ignored`);
  return def;
}

// The members of `value` its schema names none of, in file order: the schema check lets them
// through, so a misspelt optional member would be dropped unsaid. Only objects whose members the
// schema lists are looked into (a free-form one, FreeObject, holds any).
function unknownMembers(schema: TSchema, value: unknown, path: string, found: string[]): void {
  if (Array.isArray(value)) {
    if (schema.items) for (const [i, v] of value.entries()) unknownMembers(schema.items, v, `${path}.${i}`, found);
  } else if (value !== null && typeof value === 'object' && schema.properties && schema.additionalProperties === undefined) {
    for (const [k, v] of Object.entries(value)) {
      if (Object.hasOwn(schema.properties, k)) unknownMembers(schema.properties[k], v, memberPath(path, k), found);
      else found.push(memberPath(path, k));
    }
  }
}

interface Answer { status: number; body: any }

function api(base: string, key: string, timeoutMs: number) {
  return async (method: string, path: string, body?: unknown): Promise<Answer> => {
    const request = `${method} ${path.split('?')[0]}`;
    // The timeout is the whole answer's, its body too: one that stops halfway is one not answered in time.
    const timedOut = () => new ApplyAborted(`the API at ${base} did not answer ${request} within ${timeoutMs / 1000} s (--timeout)`);
    const why = (e: unknown) => ((e as Error).cause as Error | undefined)?.message ?? (e as Error).message;
    // Written before the request is sent: a body that cannot be written is this process's fault, not the API out of reach.
    let payload: string | undefined;
    try {
      payload = body === undefined ? undefined : JSON.stringify(body);
    } catch (e) {
      throw new ApplyAborted(`cannot write the body of ${request}: ${(e as Error).message}`);
    }
    let res: Response;
    for (let tried = 0; ; tried++) {
      try {
        res = await fetch(base + path, {
          method, signal: AbortSignal.timeout(timeoutMs),
          headers: { authorization: `Bearer ${key}`, ...(payload === undefined ? {} : { 'content-type': 'application/json' }) },
          body: payload,
        });
      } catch (e) {
        if ((e as Error).name === 'TimeoutError') throw timedOut();
        throw new ApplyAborted(`cannot reach the API at ${base}: ${why(e)}`);
      }
      if (!AGAIN_LATER.includes(res.status) || tried === RETRIES) break;
      await res.body?.cancel();
      await sleep(retryAfterMs(res.headers.get('retry-after') ?? undefined) ?? Math.min(1000 * 2 ** tried, 30_000));
    }
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      if ((e as Error).name === 'TimeoutError') throw timedOut();
      throw new ApplyAborted(`the API at ${base} broke off its answer to ${request}: ${why(e)}`);
    }
    let parsed: unknown;
    try { parsed = text ? JSON.parse(text) : undefined; } catch { parsed = undefined; }
    // Every answer a step goes on with is JSON: anything else is some other server than the API.
    if (res.ok && parsed === undefined) throw new ApplyAborted(notTheApi(base, request, `${res.status} ${res.headers.get('content-type') ?? 'with no content-type'}, not JSON`));
    if (res.status === 401) throw new ApplyAborted(`the API at ${base} refused TASKBRIDGE_API_KEY (401)`);
    if (res.status === 403) throw new ApplyAborted(`TASKBRIDGE_API_KEY may not ${request} (403): use an admin key`);
    return { status: res.status, body: parsed };
  };
}

const expect = (a: Answer, ...ok: number[]): Answer => {
  if (!ok.includes(a.status)) throw new Refused(`${a.status} ${a.body?.message ?? ''}`.trim());
  return a;
};
const lookup = (a: Answer): Answer | undefined => (expect(a, 200, 404).status === 200 ? a : undefined);
const enc = encodeURIComponent;
// The DEK the alias look-up answers for a name: an alias's, else the DEK of that id. '.' and '..',
// names earlier releases stored, fetch drops from a URL's path (%2E too), so no look-up can name
// them: they are not looked up, and their import or create tells (a target refuses such a new name).
const dekNamed = async (name: string, get: (path: string) => Promise<Answer | undefined>) =>
  (name === '.' || name === '..' ? undefined : (await get(`/api/encryption/v1/dek/alias/${enc(name)}`))?.body);

export interface ApplyOptions { url: string; apiKey: string; dryRun: boolean; timeoutMs: number; out(line: string): void; err(line: string): void }

export async function applyDefinition(def: Definition, opts: ApplyOptions): Promise<number> {
  const call = api(opts.url.replace(/\/+$/, ''), opts.apiKey, opts.timeoutMs);
  const { out, err, dryRun } = opts;
  const tally = Object.fromEntries(KINDS.map((k) => [k, { created: 0, updated: 0, present: 0, conflict: 0, failed: 0 }])) as Record<Kind, Record<Outcome, number>>;
  const totals = {
    deks: def.envelope_keys.reduce((n, k) => n + k.data_encryption_keys.length, 0),
    aliases: def.envelope_keys.reduce((n, k) => n + k.data_encryption_keys.reduce((m, d) => m + d.aliases.length, 0), 0),
    secrets: def.secrets.length,
    credentials: new Set(def.providers.flatMap((p) => [p.resource_server_credential?.id, p.user_credential?.id].filter(Boolean))).size,
    providers: def.providers.length,
    functions: def.providers.reduce((n, p) => n + p.functions.length, 0),
  };
  const counted = (kind: Kind) => Object.values(tally[kind]).reduce((a, b) => a + b, 0);
  const line = (kind: Kind) => {
    const t = tally[kind];
    const updated = UPDATED_KINDS.includes(kind) ? ` ${t.updated} ${dryRun ? 'to update' : 'updated'},` : '';
    return `${kind}: ${t.created} ${dryRun ? 'to create' : 'created'},${updated} ${t.present} already there, ${t.conflict} conflicts, ${t.failed} failed`;
  };

  // A dry run writes nothing, so a copy of an item further on in the file (a secret or a function
  // listed twice) is found absent again: it is counted as the run would find it, there.
  const toCreate = new Set<string>();
  const wouldWrite = (kind: Kind, name: string) => {
    const key = `${kind} ${name}`;
    if (toCreate.has(key)) return 'present';
    toCreate.add(key);
    return 'created';
  };
  // One item: looked up, then written when absent or outdated (not in a dry run). `write` may find it there after all.
  // `write` may find, as it writes, the item there otherwise than the look-up could tell (a conflict).
  const item = async (kind: Kind, name: string, look: () => Promise<Found>, write: () => Promise<'created' | 'present' | { conflict: string }>): Promise<Outcome> => {
    let outcome: Outcome;
    try {
      const found = await look();
      if (found.state === 'conflict') err(`conflict: ${name}: ${found.why}; left as it is`);
      const writes = found.state === 'absent' || found.state === 'outdated';
      const written = writes ? (dryRun ? wouldWrite(kind, name) : await write()) : found.state;
      if (typeof written === 'object') err(`conflict: ${name}: ${written.conflict}; left as it is`);
      outcome = typeof written === 'object' ? 'conflict' : written === 'created' && found.state === 'outdated' ? 'updated' : written;
    } catch (e) {
      // NotFound: a controller the comparison needs (domain/bridge/catalog.ts) that this command's release lacks.
      if (!(e instanceof Refused || e instanceof NotFound)) throw e;
      err(`failed: ${name}: ${e.message}`);
      outcome = 'failed';
    }
    tally[kind][outcome] += 1;
    const n = counted(kind);
    if (n % PROGRESS_EVERY === 0 && n < totals[kind]) out(`${kind}: ${n}/${totals[kind]}`);
    return outcome;
  };
  const look = async (path: string) => lookup(await call('GET', path));
  const created = (a: Answer) => {
    expect(a, 201, 200);
    return 'created' as const;
  };

  // Before anything is written, a failed look-up stops the run: what it would have told is not known.
  const check = async (path: string) => {
    try {
      return await look(path);
    } catch (e) {
      if (e instanceof Refused) throw new ApplyAborted(`GET ${path.split('?')[0]} at ${opts.url}: ${e.message}`);
      throw e;
    }
  };
  // The target's catalog, not this command's: the target's release decides what it can make.
  const catalog: TargetCatalog = new Map();
  let token: string | undefined;
  do {
    const page = await check(`/api/bridge/v1/available-providers?page_size=1000${token ? `&next_page_token=${enc(token)}` : ''}`);
    if (!Array.isArray(page?.body?.items)) throw new ApplyAborted(notTheApi(opts.url, 'GET /api/bridge/v1/available-providers', page ? 'no list of provider controllers' : '404'));
    for (const c of page.body.items) catalog.set(c.type_id, c);
    token = page.body.next_page_token;
  } while (token);

  // Envelope keys first: every DEK needs its own, and the API cannot bring one's key material over.
  const missing = [];
  for (const k of def.envelope_keys) {
    if (!await check(`/api/encryption/v1/envelope/${enc(k.id)}`)) missing.push(k);
  }
  if (missing.length) {
    err(missingKeysMessage(missing));
    return 1;
  }
  // Then the whole file against itself and the target: one that cannot be applied whole is not applied in part.
  const refs = definitionReferences(def);
  const names: TargetNames = { aliases: new Set(), deks: new Set() };
  // The DEK each alias the file's secrets and credentials use names on the target (the file's aliases
  // once applied): an import seals a value with it.
  const aliasDeks = new Map<string, string>();
  // The look-up answers a DEK by alias, else by id: a name answered as a DEK of that id is no alias.
  for (const alias of refs.aliases) {
    const there = await dekNamed(alias, check);
    if (there && there.id !== alias) {
      names.aliases.add(alias);
      aliasDeks.set(alias, there.id);
    }
  }
  for (const id of refs.deks) {
    if ((await dekNamed(id, check))?.id === id) names.deks.add(id);
  }
  const problems = definitionProblems(def, names);
  if (problems.length) {
    err(`Error: the file cannot be applied as it is; nothing was written:\n${problems.map((p) => `  ${p}`).join('\n')}`);
    return 1;
  }
  out(`envelope keys: all ${def.envelope_keys.length} on the target${dryRun ? ' (dry run: nothing is written)' : ''}`);

  for (const k of def.envelope_keys) {
    for (const d of k.data_encryption_keys) {
      await item('deks', `DEK ${d.id}`, async () => {
        // Looked up by alias first, then by id: another DEK's alias of that name hides this DEK, which
        // only its import then finds (taken: 409).
        const there = await dekNamed(d.id, look);
        if (!there || there.id !== d.id) return absent;
        if (there.envelope_encryption_key_id.id !== k.id) return differing(`it is under envelope key ${there.envelope_encryption_key_id.id}, not ${k.id}`);
        return differing(there.encrypted_data_encryption_key === d.encrypted_data_encryption_key ? undefined : 'it is wrapped otherwise');
      }, async () => {
        const a = await call('POST', `/api/encryption/v1/envelope/${enc(k.id)}/dek/import`, { id: d.id, encrypted_data_encryption_key: d.encrypted_data_encryption_key });
        // Hidden by an alias named like it: there, but its wrapping cannot be read to compare. A 409
        // with deleted_at is an id the target's deleted DEK had, never used again: failed, as it says.
        if (a.status === 409 && a.body?.data?.resource === 'dek' && a.body.data.deleted_at === undefined) return 'present';
        if (a.status === 400 && /does not unwrap/.test(a.body?.message)) {
          throw new Refused(`400 ${a.body.message}: is the target's key ${k.id} the source's? An installation started before the key files were copied made its own`);
        }
        return created(a);
      });
    }
  }
  out(line('deks'));

  // Aliases of the file left otherwise on the target (a conflict, or failed), and why: nothing is
  // imported under them, as its value would be sealed with a DEK other than the file's of that name.
  const unusableAliases = new Map<string, string>();
  for (const [alias, dekId] of aliasTargets(def)) {
    let before: string | undefined;
    const named = async (): Promise<string | undefined> => (await dekNamed(alias, look))?.id;
    const outcome = await item('aliases', `alias ${alias}`, async () => {
      const there = await named();
      // Answered by the DEK of that id, the name may be no alias at all (the look-up falls back to DEK
      // ids): only its create tells.
      if (there === undefined || there === alias) return absent;
      before = there;
      if (before === dekId) return present;
      // Every installation has a `default` from its first start, pointing at a DEK of its own.
      if (alias === DEFAULT_ALIAS) return { state: 'outdated' };
      return differing(`it names DEK ${before}, not ${dekId}`);
    }, async () => {
      if (before === undefined) {
        const a = await call('POST', '/api/encryption/v1/dek/alias', { alias, dek_id: dekId });
        // Taken: the alias is there (named like the DEK the look-up answered, or made meanwhile by
        // another run of this file), so the look-up now answers the DEK it names.
        if (a.status === 409 && a.body?.data?.resource === 'dek_alias') {
          const there = await named();
          if (there === dekId) return 'present';
          if (there !== undefined) {
            before = there;
            return { conflict: `it names DEK ${there}, not ${dekId}` };
          }
        }
        return created(a);
      }
      out(`alias ${alias}: pointed at DEK ${dekId} (it named ${before})`);
      return created(await call('PUT', `/api/encryption/v1/dek/alias/${enc(alias)}`, { new_dek_id: dekId }));
    });
    if (outcome === 'conflict' || outcome === 'failed') {
      unusableAliases.set(alias, outcome === 'conflict' ? 'is a conflict' : 'failed');
      if (before !== undefined) aliasDeks.set(alias, before);
    } else {
      aliasDeks.set(alias, dekId);
    }
  }
  out(line('aliases'));
  // A secret or credential not on the target: absent, unless its alias cannot take it.
  const importable = (s: { dek_alias: string }): Found => {
    const why = unusableAliases.get(s.dek_alias);
    if (why !== undefined) throw new Refused(`its alias '${s.dek_alias}' ${why} (above): not imported`);
    return absent;
  };

  // Found by key after not by id, it may be this secret all the same: imported in between by another
  // run, or by this one where the file lists it twice (alike: domain/definition-check.ts).
  const secretThere = async (s: DefinitionSecret) =>
    (await look(`/api/secret/v1/${enc(s.id)}`)) ?? look(`/api/secret/v1/key/${enc(s.key)}`);
  const sameSecret = (s: DefinitionSecret, there: Answer) =>
    (there.body.id === s.id ? differing(secretDifference(s, there.body, aliasDeks.get(s.dek_alias))) : differing(`its key is taken by secret ${there.body.id}`));
  const applySecret = (s: DefinitionSecret) => item('secrets', `secret ${s.key} (${s.id})`, async () => {
    const there = await secretThere(s);
    return there ? sameSecret(s, there) : importable(s);
  }, async () => {
    const a = await call('POST', '/api/secret/v1/import', {
      id: s.id, key: s.key, encrypted_value: s.encrypted_value, dek_alias: s.dek_alias, data_encryption_key_id: s.data_encryption_key_id,
    });
    // Taken between the look-up and the import, the same way.
    if (a.status === 409) {
      const there = await secretThere(s);
      if (there && sameSecret(s, there).state === 'present') return 'present';
    }
    return created(a);
  });
  // A run stopped by one of them (the API out of reach) is stopped for all: the others take no more
  // secrets, and the run says so once those they are writing are done, not while they go on.
  let next = 0;
  let stopped = false;
  const applying = await Promise.allSettled(Array.from({ length: Math.min(SECRETS_AT_ONCE, def.secrets.length) }, async () => {
    try {
      while (!stopped && next < def.secrets.length) await applySecret(def.secrets[next++]);
    } catch (e) {
      stopped = true;
      throw e;
    }
  }));
  const stop = applying.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (stop) throw stop.reason;
  out(line('secrets'));

  const seenCredentials = new Set<string>();
  // Credentials of the file not on the target as the file has them (a conflict, or failed), and why:
  // no provider of the file is made on them, whichever provider's step found it.
  const unusable = new Map<string, string>();
  for (const p of def.providers) await applyProvider(p);
  out(line('credentials'));
  out(line('providers'));
  out(line('functions'));

  async function applyProvider(p: DefinitionProvider): Promise<void> {
    // A provider (or function) the target cannot make fails on its own, the rest of the file applied.
    const unmakeable = targetCannotMake(p, catalog);
    const refuseUnmakeable = (not: string, fn?: string) => {
      const why = fn === undefined ? unmakeable : targetCannotMake(p, catalog, fn);
      if (why !== undefined) throw new Refused(`${why}: ${not}`);
    };
    const base = `/api/bridge/v1/available-providers/${p.provider_controller_type_id}/available-credentials/${p.credential_controller_type_id}`;
    const credentials: [CredentialKind, DefinitionCredential | undefined][] = [['resource_server', p.resource_server_credential], ['user', p.user_credential]];
    let there: Answer | undefined;
    try {
      there = await look(`/api/bridge/v1/provider/${p.id}`);
    } catch (e) {
      if (!(e instanceof Refused)) throw e;
      err(`failed: provider ${p.id}: ${e.message}`);
      tally.providers.failed += 1;
      return;
    }
    for (const [kind, c] of credentials) {
      if (!c || seenCredentials.has(c.id)) continue;
      seenCredentials.add(c.id);
      const theirs = there?.body[kind === 'user' ? 'user_credential' : 'resource_server_credential'];
      // The target's credential of c's id as GET /credential/{id} shows it, and how it differs from c.
      const listedCredential = async (): Promise<ListedCredential | undefined> => (await look(`/api/bridge/v1/credential/${enc(c.id)}`))?.body;
      const listedDifference = (listed: ListedCredential) => (listed.kind !== kind ? `it is a ${listed.kind.replace('_', ' ')} credential`
        : listed.provider_controller_type_id !== p.provider_controller_type_id ? `it is a credential of provider controller '${listed.provider_controller_type_id}'`
          : credentialDifference(c, listed, p.provider_controller_type_id, kind));
      // A conflict at p's place is p's: c itself may be on the target as the file has it (another
      // provider's, or left without one), and a provider of the file that shares it is made on it.
      let alikeElsewhere = false;
      const outcome = await item('credentials', `${kind.replace('_', ' ')} credential ${c.id} of provider ${p.id}`, async () => {
        if (!there) {
          refuseUnmakeable('not imported');
          return importable(c);
        }
        if (theirs?.id !== c.id) {
          const listed = await listedCredential();
          alikeElsewhere = listed !== undefined && listedDifference(listed) === undefined;
          return differing(`provider ${p.id} has ${theirs ? `credential ${theirs.id}` : 'none'} in its place`);
        }
        return differing(credentialDifference(c, theirs, p.provider_controller_type_id, kind));
      }, async () => {
        const a = await call('POST', `${base}/credential/${kind === 'user' ? 'user-credential' : 'resource-server'}/import`, c);
        if (a.status !== 409 || a.body?.data?.resource !== 'credential') return created(a);
        // There without an instance (imported by an earlier run whose instance was not made, or by
        // hand): compared as GET /credential/{id} shows it. One that differs, or could not be read, is left.
        const listed = await listedCredential();
        const why = !listed ? 'it was deleted meanwhile' : listedDifference(listed);
        if (why !== undefined) return { conflict: why };
        return 'present';
      });
      if (outcome === 'conflict' && !alikeElsewhere) unusable.set(c.id, 'on the target is not the file\'s (the conflict above)');
      if (outcome === 'failed') unusable.set(c.id, 'failed (above)');
    }
    const made = await item('providers', `provider ${p.id}`, async () => {
      if (!there) {
        refuseUnmakeable('not made');
        return absent;
      }
      const why = providerDifference(p, there.body);
      return why === undefined && disableUnfinished(p, there.body) ? { state: 'outdated' } : differing(why);
    }, async () => {
      let madeMeanwhile = false;
      if (!there) {
        const taken = [p.resource_server_credential?.id, p.user_credential?.id].find((id) => id !== undefined && unusable.has(id));
        if (taken) throw new Refused(`its credential ${taken} ${unusable.get(taken)}: not made`);
        const a = await call('POST', base, {
          provider_instance_id: p.id, display_name: p.display_name,
          ...(p.resource_server_credential ? { resource_server_credential_id: p.resource_server_credential.id } : {}),
          ...(p.user_credential ? { user_credential_id: p.user_credential.id } : {}),
          ...(p.return_on_successful_brokering ? { return_on_successful_brokering: p.return_on_successful_brokering } : {}),
        });
        // Made between the look-up and the create (another run of this file): compared as the look-up would.
        if (a.status === 409 && a.body?.data?.resource === 'provider_instance' && a.body.data.id === p.id) {
          const now = await look(`/api/bridge/v1/provider/${p.id}`);
          const why = now ? providerDifference(p, now.body) : 'it was deleted meanwhile';
          if (why !== undefined) return { conflict: why };
          madeMeanwhile = true;
        } else {
          created(a);
        }
      }
      // Before any function is enabled on it: nothing can be invoked through it while it is active.
      // One made meanwhile may not be disabled yet by the run that made it; disabling again changes nothing.
      if (p.status === 'disabled') created(await call('PATCH', `/api/bridge/v1/provider/${p.id}`, { status: 'disabled' }));
      if (madeMeanwhile) return 'present';
      if (there) out(`provider ${p.id}: disabled (an earlier run made it ${there.body.status} and was cut before disabling it)`);
      if (settableStatus(p.status) !== p.status) out(`provider ${p.id}: made active; it was ${p.status}, which only a failed token refresh sets`);
      return 'created';
    });
    const enabled = new Set<string>((there?.body.functions ?? []).map((f: { function_controller_type_id: string }) => f.function_controller_type_id));
    for (const f of p.functions) {
      if (made === 'failed') {
        err(`failed: function ${f} of provider ${p.id}: its provider failed`);
        tally.functions.failed += 1;
        continue;
      }
      // Enabled, it is there for a copy of it further on in the file's list.
      await item('functions', `function ${f} of provider ${p.id}`, async () => {
        if (enabled.has(f)) return present;
        refuseUnmakeable('not enabled', f);
        return absent;
      }, async () => {
        const a = await call('POST', `/api/bridge/v1/provider/${p.id}/function/${f}/enable`, {});
        // Enabled meanwhile (another run of this file): a function instance has nothing but its name
        // and provider to differ in, which the 409 names, so it is there as the file has it.
        const done = a.status === 409 && a.body?.data?.resource === 'function_instance' ? 'present' : created(a);
        enabled.add(f);
        return done;
      });
    }
  }

  const changed = KINDS.some((k) => tally[k].created + tally[k].updated > 0);
  const troubles = KINDS.reduce((n, k) => n + tally[k].conflict + tally[k].failed, 0);
  out(`\nSummary${dryRun ? ' (dry run: nothing was written)' : ''}:`);
  for (const k of KINDS) out(`  ${line(k)}`);
  if (!changed && !troubles) out('Nothing to do: everything in the file is already on the target.');
  if (troubles) out(`${troubles} item(s) not applied: see the conflict and failure lines above.`);
  // Not in the file to apply: the exporting installation could not express them (not a failure of this run).
  const omitted = def.omitted ?? [];
  if (omitted.length) out(`the export left out ${omitted.length} item${omitted.length === 1 ? '' : 's'} (its omitted list), not applied: ${naming(omitted.map((o) => `function ${o.function_controller_type_id} of provider ${o.provider_id}`))}`);
  return troubles ? 1 : 0;
}

const notTheApi = (base: string, request: string, answer: string) =>
  `${request} at ${base} answered ${answer}: it does not look like the taskbridge API; check --url (the API's base, e.g. http://host:3000)`;

function missingKeysMessage(keys: Definition['envelope_keys']): string {
  const named = keys.map((k) => (k.type === 'local' ? `local key ${k.id} (file ${k.file_name})` : `AWS KMS key ${k.id} (${k.region})`));
  const steps = [
    keys.some((k) => k.type === 'local') && '  local key: copy the file from the source\'s KEYS_DIR into the target\'s KEYS_DIR (on every web and worker host), then register it:\n'
      + '    POST /api/encryption/v1/envelope {"type":"local","file_name":"<file>"}   (it adopts the existing 32-byte file)',
    keys.some((k) => k.type === 'aws_kms') && '  AWS KMS key: grant the target\'s hosts use of the key, then register it:\n'
      + '    POST /api/encryption/v1/envelope {"type":"aws_kms","arn":"<arn>","region":"<region>"}',
  ].filter(Boolean);
  return `Error: the target has no envelope key ${named.join(', ')}; nothing was written.\n`
    + `Every DEK in the file is wrapped by its envelope key, which this command cannot bring over. For each:\n${steps.join('\n')}\nthen run this again.`;
}

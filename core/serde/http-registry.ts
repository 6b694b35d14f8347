// The SchemaRegistry contract over HTTP, against any Confluent-compatible Schema Registry (Confluent's own,
// Apicurio's /apis/ccompat/v7, Redpanda's) through @confluentinc/schemaregistry. Subjects and ids mean what
// they mean in Confluent's API, so records framed here decode with any Confluent deserializer and back.
// The client module itself, not the package's index: the index also loads the serializers and their encryption
// rules (Google, Azure, AWS and HashiCorp KMS clients), a second of start-up for every process that talks to a
// registry, and rlstream frames its records itself (./events.ts). The package has no exports map.
import { SchemaRegistryClient, type SchemaInfo } from '@confluentinc/schemaregistry/dist/schemaregistry-client.js';
import { RlstreamError } from '../errors.ts';
import { retry } from '../retry.ts';
import type { SchemaRegistry } from './registry.ts';

export interface HttpRegistryOptions {
  /** Base URL(s) of the registry, e.g. http://127.0.0.1:18081/apis/ccompat/v7 (tried in order). */
  url: string | string[];
  /** HTTP basic auth ("user:password" as Confluent's USER_INFO), if the registry needs it. */
  basicAuth?: { username: string; password: string };
  /** Per-request timeout, ms (default 10000). */
  timeoutMs?: number;
  /** Retries of a failed request (5xx, 429) by the client (default 2). */
  maxRetries?: number;
  /**
   * The compatibility level each subject registered here must have (default BACKWARD, what the event contract
   * promises: a reader of the current schema decodes every older record). A subject at a level that already
   * implies it (BACKWARD_TRANSITIVE, FULL, FULL_TRANSITIVE) is left as it is; null leaves every level alone.
   */
  compatibility?: 'BACKWARD' | 'BACKWARD_TRANSITIVE' | 'FULL' | 'FULL_TRANSITIVE' | null;
}

// Confluent's error codes (error_code in the response body).
const SUBJECT_NOT_FOUND = 40401;
const VERSION_NOT_FOUND = 40402;
const SCHEMA_NOT_FOUND = 40403;
const INVALID_SCHEMA = 42201;
/** Levels under which a reader of the newest schema decodes every older record of the subject. */
const IMPLIES_BACKWARD: Record<string, readonly string[]> = {
  BACKWARD: ['BACKWARD', 'BACKWARD_TRANSITIVE', 'FULL', 'FULL_TRANSITIVE'],
  BACKWARD_TRANSITIVE: ['BACKWARD_TRANSITIVE', 'FULL_TRANSITIVE'],
  FULL: ['FULL', 'FULL_TRANSITIVE'],
  FULL_TRANSITIVE: ['FULL_TRANSITIVE'],
};
/**
 * A 409 on register is either a real incompatibility or, on Apicurio, a lost race: two first registrations of
 * one subject both try to create it and all but one get "artifact already exists" (six at once gave one 200 and
 * five 409s). Both carry error_code 409, so the schema is looked up after a 409 and registration is tried again
 * a few times; only a 409 that persists while the schema is still not under the subject is an incompatibility.
 * Setting a subject's level races the same way ("rule already exists"), and is read again and retried.
 */
const CONFLICT_ATTEMPTS = 4;
/** How a conflict is tried again: 3 more times, from ~100 ms, spread so racing starters do not collide again. */
const CONFLICT_RETRY = { retriable: isConflict, retries: CONFLICT_ATTEMPTS - 1, initialDelayMs: 100, jitter: 0.25 };

function isConflict(err: unknown): boolean {
  return (err as RestErrorLike | null)?.status === 409;
}

interface RestErrorLike {
  status?: number;
  errorCode?: number;
  message?: string;
  code?: string;
}

function validate(o: HttpRegistryOptions): string[] {
  const urls = Array.isArray(o.url) ? o.url : [o.url];
  if (urls.length === 0) throw new RlstreamError('CONFIG_INVALID', 'registry.url must name at least one URL');
  urls.forEach((u, i) => {
    const field = Array.isArray(o.url) ? `registry.url[${i}]` : 'registry.url';
    let parsed: URL;
    try {
      parsed = new URL(String(u));
    } catch {
      throw new RlstreamError('CONFIG_INVALID', `${field} is not a URL: ${JSON.stringify(u)}`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new RlstreamError('CONFIG_INVALID', `${field} must be http or https, got ${parsed.protocol}`);
  });
  if (o.timeoutMs !== undefined && (!Number.isInteger(o.timeoutMs) || o.timeoutMs < 1)) throw new RlstreamError('CONFIG_INVALID', `registry.timeoutMs must be a positive integer, got ${o.timeoutMs}`);
  if (o.maxRetries !== undefined && (!Number.isInteger(o.maxRetries) || o.maxRetries < 0)) throw new RlstreamError('CONFIG_INVALID', `registry.maxRetries must be an integer >= 0, got ${o.maxRetries}`);
  if (o.basicAuth && (!o.basicAuth.username || typeof o.basicAuth.password !== 'string')) throw new RlstreamError('CONFIG_INVALID', 'registry.basicAuth needs a username and a password');
  return urls.map((u) => String(u).replace(/\/+$/, ''));
}

/** Maps a client failure to our catalogue: unknown schemas, incompatibility, and an unreachable registry. */
function fromRest(err: unknown, what: string): RlstreamError {
  if (err instanceof RlstreamError) return err;
  const e = (typeof err === 'object' && err !== null ? err : {}) as RestErrorLike;
  const detail = e.message ?? String(err);
  if (e.errorCode === SCHEMA_NOT_FOUND || e.errorCode === SUBJECT_NOT_FOUND || e.errorCode === VERSION_NOT_FOUND) {
    return new RlstreamError('SERDE_UNKNOWN_SCHEMA', `${what}: ${detail}`, { cause: err });
  }
  if (e.status === 409) return new RlstreamError('REGISTRY_INCOMPATIBLE', `${what}: ${detail}`, { cause: err });
  if (e.status === 422 || e.errorCode === INVALID_SCHEMA) return new RlstreamError('INPUT_INVALID', `${what}: the registry rejected the schema: ${detail}`, { cause: err });
  if (e.status === undefined || e.status >= 500 || e.status === 429 || e.status === 408) {
    return new RlstreamError('REGISTRY_UNAVAILABLE', `${what}: registry unreachable or failing (${e.code ?? e.status ?? detail})`, { cause: err, retriable: true });
  }
  return new RlstreamError('INTERNAL', `${what}: registry answered ${e.status}: ${detail}`, { cause: err });
}

export class HttpSchemaRegistry implements SchemaRegistry {
  private readonly client: SchemaRegistryClient;
  private readonly textById = new Map<number, string>();
  private readonly compatibility: HttpRegistryOptions['compatibility'];
  /** Subjects whose compatibility level this client has checked (or set), each checked once. */
  private readonly levelChecked = new Map<string, Promise<void>>();

  private readonly urls: string[];

  constructor(options: HttpRegistryOptions) {
    const baseURLs = validate(options);
    // For messages: without any credentials written into a URL.
    this.urls = baseURLs.map((u) => {
      const x = new URL(u);
      x.username = '';
      x.password = '';
      return x.toString().replace(/\/+$/, '');
    });
    this.compatibility = options.compatibility === undefined ? 'BACKWARD' : options.compatibility;
    this.client = new SchemaRegistryClient({
      baseURLs,
      createAxiosDefaults: { timeout: options.timeoutMs ?? 10_000 },
      maxRetries: options.maxRetries ?? 2,
      retriesWaitMs: 200,
      retriesMaxWaitMs: 2000,
      ...(options.basicAuth
        ? { basicAuthCredentials: { credentialsSource: 'USER_INFO' as const, userInfo: `${options.basicAuth.username}:${options.basicAuth.password}` } }
        : {}),
    });
  }

  async register(subject: string, schema: string): Promise<number> {
    if (typeof subject !== 'string' || subject === '') throw new RlstreamError('INPUT_INVALID', 'registry subject must be a non-empty string');
    await this.ensureLevel(subject);
    try {
      return await retry(
        async () => {
          try {
            const id = await this.client.register(subject, { schemaType: 'AVRO', schema });
            this.textById.set(id, schema);
            return id;
          } catch (err) {
            if (!isConflict(err)) throw fromRest(err, `register ${subject}`);
            const found = await this.lookup(subject, schema);
            if (found === null) throw err; // still not under the subject: tried again, then an incompatibility
            this.textById.set(found, schema);
            return found;
          }
        },
        CONFLICT_RETRY,
      );
    } catch (err) {
      throw isConflict(err) ? fromRest(err, `register ${subject}`) : err;
    }
  }

  /** The id of this exact schema under the subject, or null when the subject does not hold it. */
  private async lookup(subject: string, schema: string): Promise<number | null> {
    try {
      const meta = await this.client.getIdFullResponse(subject, { schemaType: 'AVRO', schema });
      return meta.id ?? null;
    } catch (err) {
      const e = fromRest(err, `look up ${subject}`);
      if (e.code === 'SERDE_UNKNOWN_SCHEMA') return null;
      throw e;
    }
  }

  /**
   * Give the subject the compatibility level the contract promises, before its first registration here: a
   * registry's default is often NONE (Apicurio's is), under which an incompatible schema would be accepted and
   * old records would stop decoding. Setting a level is idempotent, so concurrent first starts may all do it.
   */
  private ensureLevel(subject: string): Promise<void> {
    const want = this.compatibility;
    if (want === null || want === undefined) return Promise.resolve();
    let p = this.levelChecked.get(subject);
    if (!p) {
      let level: string | undefined;
      p = retry(async () => {
        level = undefined;
        try {
          const c = await this.client.getConfig(subject);
          level = c.compatibilityLevel ?? c.compatibility;
        } catch (err) {
          const e = fromRest(err, `compatibility level of ${subject}`);
          // No subject yet, or no level of its own (Confluent answers 40408): set one.
          if (e.code !== 'SERDE_UNKNOWN_SCHEMA' && (err as RestErrorLike).errorCode !== 40408) throw e;
        }
        if (level !== undefined && IMPLIES_BACKWARD[want]!.includes(level)) return;
        try {
          // The client encodes the subject in getConfig but not in updateConfig.
          await this.client.updateConfig(encodeURIComponent(subject), { compatibility: want as never });
        } catch (err) {
          // Concurrent first starts race here too: Apicurio answers 409 "rule already exists" to all but one
          // of them. Read the level again (the winner's) rather than fail.
          if (!isConflict(err)) throw fromRest(err, `set the compatibility level of ${subject} to ${want} (it is ${level ?? 'unset'})`);
          throw err;
        }
      }, CONFLICT_RETRY).catch((err: unknown) => {
        throw isConflict(err) ? fromRest(err, `set the compatibility level of ${subject} to ${want} (it is ${level ?? 'unset'})`) : err;
      });
      p.catch(() => this.levelChecked.delete(subject)); // a failed check is tried again by the next register
      this.levelChecked.set(subject, p);
    }
    return p;
  }

  async getById(id: number): Promise<string> {
    if (!Number.isInteger(id) || id < 0) throw new RlstreamError('SERDE_UNKNOWN_SCHEMA', `schema id ${id} is not a valid id`);
    const known = this.textById.get(id);
    if (known !== undefined) return known;
    let info: SchemaInfo;
    try {
      // The subject is optional in the API; an empty one asks for the id alone.
      info = await this.client.getBySubjectAndId('', id);
    } catch (err) {
      const e = fromRest(err, `schema id ${id}`);
      if (e.code !== 'SERDE_UNKNOWN_SCHEMA') throw e;
      // Ids come from records, so a record names an id this registry never gave (or lost): say so.
      throw new RlstreamError(
        'SERDE_UNKNOWN_SCHEMA',
        `${e.message} (a record names schema id ${id}, which this registry (${this.urls.join(', ')}) does not hold: the records were written through another registry, or through this one before it lost its storage; point registry.url at that registry, or give the registry persistent storage as infra/registry/run.sh does)`,
        { cause: err },
      );
    }
    if (info.schemaType !== undefined && info.schemaType !== 'AVRO') throw new RlstreamError('SERDE_UNKNOWN_SCHEMA', `schema id ${id} is ${info.schemaType}, not AVRO`);
    this.textById.set(id, info.schema);
    return info.schema;
  }

  async versions(subject: string): Promise<number[]> {
    let versions: number[];
    try {
      versions = await this.client.getAllVersions(subject);
    } catch (err) {
      const e = fromRest(err, `versions of ${subject}`);
      if (e.code === 'SERDE_UNKNOWN_SCHEMA') return []; // an unknown subject has no versions
      throw e;
    }
    const ids: number[] = [];
    for (const v of [...versions].sort((a, b) => a - b)) {
      try {
        const meta = await this.client.getSchemaMetadata(subject, v, false);
        if (meta.id !== undefined && !ids.includes(meta.id)) ids.push(meta.id);
      } catch (err) {
        throw fromRest(err, `version ${v} of ${subject}`);
      }
    }
    return ids;
  }

  async close(): Promise<void> {
    await this.client.close();
  }
}

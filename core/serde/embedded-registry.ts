// A schema registry kept in the log itself: each registration is a record of the `_schemas` topic (one
// partition, so its order is the order of ids), which makes a recorded log self-describing. Ids are the
// order of first registration and survive reopening because they are read back from the topic. A new
// version of a subject must be BACKWARD compatible with the latest one (the new schema reads old data).
import avro from 'avsc';
import { RlstreamError } from '../errors.ts';
import type { Consumer, EventLog, Producer } from '../log/types.ts';
import { type Logger, silentLogger } from '../telemetry.ts';
import { TOPICS } from '../topics.ts';
import type { SchemaRegistry } from './registry.ts';

interface Registration {
  subject: string;
  id: number;
  schema: string;
}

function parseSchema(text: string, what: string): avro.Type {
  try {
    return avro.Type.forSchema(JSON.parse(text) as avro.Schema, { wrapUnions: false });
  } catch (cause) {
    throw new RlstreamError('INPUT_INVALID', `${what} is not a valid Avro schema: ${(cause as Error).message}`, { cause });
  }
}

/** Throws REGISTRY_INCOMPATIBLE unless data written with `writer` can be read with `reader`. */
export function checkBackward(subject: string, reader: string, writer: string): void {
  const r = parseSchema(reader, `new schema for ${subject}`);
  const w = parseSchema(writer, `registered schema for ${subject}`);
  try {
    r.createResolver(w);
  } catch (cause) {
    throw new RlstreamError('REGISTRY_INCOMPATIBLE', `schema for subject ${subject} is not backward compatible with its latest version: ${(cause as Error).message}`, { cause });
  }
}

export class EmbeddedRegistry implements SchemaRegistry {
  private readonly byId = new Map<number, string>();
  private readonly idByText = new Map<string, number>();
  private readonly subjects = new Map<string, number[]>();
  private queue: Promise<unknown> = Promise.resolve();

  private constructor(
    private readonly log: EventLog,
    private readonly consumer: Consumer,
    private readonly producer: Producer,
    private readonly logger: Logger,
  ) {}

  /** Open the registry on a log, creating `_schemas` when missing and reading every registration in it. */
  static async open(log: EventLog, logger: Logger = silentLogger): Promise<EmbeddedRegistry> {
    await log.createTopic({ name: TOPICS.schemas, partitions: 1 });
    // A private group that never commits: every opening reads the whole topic from the beginning.
    const consumer = await log.consumer({ groupId: `_schemas-reader-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`, topics: [TOPICS.schemas] });
    const registry = new EmbeddedRegistry(log, consumer, await log.producer(), logger.child({ component: 'embedded-registry' }));
    await registry.catchUp();
    return registry;
  }

  private apply(value: Buffer, offset: number): void {
    let r: Registration;
    try {
      r = JSON.parse(value.toString('utf8')) as Registration;
    } catch {
      this.logger.warn('embedded registry: skipping an unreadable _schemas record', { offset });
      return;
    }
    if (!this.byId.has(r.id)) {
      this.byId.set(r.id, r.schema);
      if (!this.idByText.has(r.schema)) this.idByText.set(r.schema, r.id);
    }
    const ids = this.subjects.get(r.subject) ?? [];
    if (!ids.includes(r.id)) ids.push(r.id);
    this.subjects.set(r.subject, ids);
  }

  /** Read registrations up to the topic's current end (another registry on the same log may have added some). */
  private async catchUp(): Promise<void> {
    const high = (await this.log.offsets(TOPICS.schemas))[0]?.high ?? 0;
    let position = this.consumer.assignment()[0]?.offset ?? 0;
    const deadline = Date.now() + 30_000;
    while (position < high) {
      if (Date.now() > deadline) throw new RlstreamError('REGISTRY_UNAVAILABLE', `could not read ${TOPICS.schemas} up to offset ${high}`);
      for (const rec of await this.consumer.poll({ timeoutMs: 500 })) {
        this.apply(rec.value, rec.offset);
        position = rec.offset + 1;
      }
    }
  }

  /** Calls run one at a time, so two registrations never pick the same new id. */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.queue.then(fn, fn);
    this.queue = p.catch(() => {});
    return p;
  }

  register(subject: string, schema: string): Promise<number> {
    return this.serial(async () => {
      await this.catchUp();
      const ids = this.subjects.get(subject) ?? [];
      const known = this.idByText.get(schema);
      if (known !== undefined && ids.includes(known)) return known;
      parseSchema(schema, `schema for ${subject}`);
      const latest = ids[ids.length - 1];
      if (latest !== undefined) checkBackward(subject, schema, this.byId.get(latest)!);
      const id = known ?? Math.max(0, ...this.byId.keys()) + 1;
      const value = Buffer.from(JSON.stringify({ subject, id, schema } satisfies Registration));
      await this.producer.send(TOPICS.schemas, [{ key: subject, value, partition: 0 }]);
      await this.catchUp();
      return id;
    });
  }

  async getById(id: number): Promise<string> {
    let s = this.byId.get(id);
    if (s === undefined) {
      await this.serial(() => this.catchUp());
      s = this.byId.get(id);
    }
    if (s === undefined) throw new RlstreamError('SERDE_UNKNOWN_SCHEMA', `schema id ${id} is not registered in ${TOPICS.schemas}`);
    return s;
  }

  async versions(subject: string): Promise<number[]> {
    await this.serial(() => this.catchUp());
    return [...(this.subjects.get(subject) ?? [])];
  }

  async close(): Promise<void> {
    await this.queue;
    await this.consumer.close();
    await this.producer.close();
  }
}

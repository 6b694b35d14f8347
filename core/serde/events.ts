// Event serde in Confluent's wire format: magic byte 0, 4-byte big-endian schema id, Avro binary.
// Encoding is synchronous once init() has registered the current schemas (the hot path never awaits);
// decoding resolves older writer schemas to the current reader schema (BACKWARD evolution), then applies what
// resolution alone does not carry over (core/serde/upgrades.ts).
// Speed: records are encoded straight into a slab (a shared 256 KiB buffer, like Node's own Buffer pool) and
// returned as views of it, so an 8 KB trajectory costs neither a copy nor an ArrayBuffer of its own; the big
// numeric arrays go through core/serde/fast-arrays.ts. The bytes are avsc's, unchanged.
import avro from 'avsc';
import { EVENT_NAMES, resolvedSchema, schemaText, type EventName } from '../../schemas/index.ts';
import type { EventTypes } from '../../schemas/generated/types.ts';
import { RlstreamError } from '../errors.ts';
import { fastType, type FloatTypedArray } from './fast-arrays.ts';
import type { SchemaRegistry } from './registry.ts';
import { upgradesFor, type ReadUpgrade } from './upgrades.ts';

export type DecodedEvent = { [N in EventName]: { name: N; value: EventTypes[N]; schemaId: number } }[EventName];

/**
 * A value as encode() takes it: its event type, except that array<float> fields (number[]) may also be given
 * as a Float32Array or Float64Array, written exactly as the same numbers in a plain array would be. A number[]
 * field of another item type (int, long) takes no typed array: encode() refuses it (SERDE_SCHEMA_MISMATCH).
 */
export type Encodable<T> = T extends number[]
  ? number[] | FloatTypedArray
  : T extends Buffer
    ? T
    : T extends (infer U)[]
      ? Encodable<U>[]
      : T extends object
        ? { [K in keyof T]: Encodable<T[K]> }
        : T;

const MAGIC = 0;
/** Confluent framing before the Avro body: the magic byte and a 4-byte schema id. */
export const HEADER = 5;
/**
 * Size of the slabs encoded records are cut from. A record bigger than a slab gets a slab of its own. A record
 * kept alive keeps its slab alive, which bounds the waste at one slab per long-lived record.
 */
const SLAB_BYTES = 256 * 1024;

let fastTypes: Map<EventName, avro.Type> | undefined;

/** The current type of every event with the fast array codecs (same schemas as schemas/index.ts). */
function eventType(name: EventName): avro.Type {
  fastTypes ??= new Map(EVENT_NAMES.map((n) => [n, fastType(resolvedSchema(n) as avro.Schema)]));
  return fastTypes.get(name)!;
}

interface Reader {
  name: EventName;
  /** Resolver from the writer schema to the current reader type, or null when they are identical. */
  resolver: avro.Resolver | null;
  /** What an older writer schema's records need beyond resolution (upgrades.ts); none for the current schema. */
  upgrades: readonly ReadUpgrade[];
}

export function subjectOf(name: EventName): string {
  return `rlstream.events.${name}`;
}

export class EventSerde {
  private readonly idOf = new Map<EventName, number>();
  private readonly readers = new Map<number, Reader>();
  private readonly pending = new Map<number, Promise<Reader>>();
  private slab = Buffer.allocUnsafe(SLAB_BYTES);
  /** Bytes of the slab handed out already; later records go after them, never over them. */
  private used = 0;

  constructor(readonly registry: SchemaRegistry) {}

  /** Register the current version of every event schema. Call once before encode(). */
  async init(): Promise<this> {
    for (const name of EVENT_NAMES) {
      const id = await this.registry.register(subjectOf(name), schemaText(name));
      this.idOf.set(name, id);
      this.readers.set(id, { name, resolver: null, upgrades: [] });
    }
    return this;
  }

  schemaId(name: EventName): number {
    const id = this.idOf.get(name);
    if (id === undefined) throw new RlstreamError('INTERNAL', 'EventSerde.init() was not called');
    return id;
  }

  encode<N extends EventName>(name: N, value: EventTypes[N] | Encodable<EventTypes[N]>): Buffer {
    const type = eventType(name);
    const id = this.schemaId(name);
    let start = this.used;
    let end: number;
    try {
      // avsc's encode returns the end position, or minus the bytes missing when the slab was too small: then
      // the record goes at the start of a fresh slab big enough for it.
      while ((end = type.encode(value, this.slab, start + HEADER)) < 0) {
        this.slab = Buffer.allocUnsafe(Math.max(SLAB_BYTES, this.slab.length - end - start));
        start = 0;
      }
    } catch (cause) {
      const paths: string[] = [];
      type.isValid(value, { errorHook: (path) => paths.push(path.join('.') || '(root)') });
      throw new RlstreamError('SERDE_SCHEMA_MISMATCH', `${name} does not match its schema at ${paths.slice(0, 5).join(', ') || '?'}`, { cause });
    }
    this.used = end;
    const out = this.slab.subarray(start, end);
    out[0] = MAGIC;
    out.writeUInt32BE(id, 1);
    return out;
  }

  /**
   * The event whose current schema (the one this serde encodes with) wrote a framed record, without decoding it;
   * undefined for older writer schemas, ids not seen yet, and bytes that are not a framed record.
   */
  currentEventOf(buf: Buffer): EventName | undefined {
    if (buf.length < HEADER || buf[0] !== MAGIC) return undefined;
    return this.currentEventById(buf.readUInt32BE(1));
  }

  /** currentEventOf for the `length` bytes at `start` of a view, read in place (no Buffer for the record). */
  currentEventAt(view: DataView, start: number, length: number): EventName | undefined {
    if (length < HEADER || view.getUint8(start) !== MAGIC) return undefined;
    return this.currentEventById(view.getUint32(start + 1));
  }

  private currentEventById(id: number): EventName | undefined {
    const reader = this.readers.get(id);
    return reader && reader.resolver === null ? reader.name : undefined;
  }

  /** The schema id in a framed record, without decoding it. */
  static peekSchemaId(buf: Buffer): number {
    if (buf.length < HEADER) throw new RlstreamError('SERDE_TRUNCATED', `record of ${buf.length} bytes is shorter than the 5-byte header`);
    if (buf[0] !== MAGIC) throw new RlstreamError('SERDE_MAGIC_BYTE', `magic byte is ${buf[0]}, expected 0`);
    return buf.readUInt32BE(1);
  }

  async decode(buf: Buffer): Promise<DecodedEvent> {
    const id = EventSerde.peekSchemaId(buf);
    const reader = this.readers.get(id) ?? (await this.loadReader(id));
    return this.decodeWith(reader, id, buf);
  }

  /** Synchronous decode for ids already seen (current schemas always are); undefined if the id is new. */
  tryDecodeSync(buf: Buffer): DecodedEvent | undefined {
    const id = EventSerde.peekSchemaId(buf);
    const reader = this.readers.get(id);
    return reader ? this.decodeWith(reader, id, buf) : undefined;
  }

  private decodeWith(reader: Reader, id: number, buf: Buffer): DecodedEvent {
    const type = eventType(reader.name);
    let value: unknown;
    try {
      const res = reader.resolver ? type.decode(buf, HEADER, reader.resolver) : type.decode(buf, HEADER);
      if (res.offset < 0) throw new RlstreamError('SERDE_TRUNCATED', `${reader.name} record (schema ${id}) is truncated`);
      if (res.offset !== buf.length) throw new RlstreamError('SERDE_DECODE', `${reader.name} record (schema ${id}) has ${buf.length - res.offset} trailing bytes`);
      value = res.value;
      for (const u of reader.upgrades) u.apply(value as Record<string, unknown>);
    } catch (err) {
      if (err instanceof RlstreamError) throw err;
      throw new RlstreamError('SERDE_DECODE', `${reader.name} record (schema ${id}) is corrupt: ${(err as Error).message}`, { cause: err });
    }
    return { name: reader.name, value, schemaId: id } as DecodedEvent;
  }

  private loadReader(id: number): Promise<Reader> {
    let p = this.pending.get(id);
    if (!p) {
      p = (async () => {
        const text = await this.registry.getById(id);
        const writer = fastType(JSON.parse(text) as avro.Schema);
        const short = (writer as avro.types.RecordType).name?.split('.').pop() ?? '';
        if (!(EVENT_NAMES as readonly string[]).includes(short)) {
          throw new RlstreamError('SERDE_UNKNOWN_SCHEMA', `schema id ${id} is ${short || 'not a record'}, not an rlstream event`);
        }
        const name = short as EventName;
        const reader: Reader = { name, resolver: eventType(name).createResolver(writer), upgrades: upgradesFor(writer) };
        this.readers.set(id, reader);
        return reader;
      })();
      this.pending.set(id, p);
      p.catch(() => this.pending.delete(id));
    }
    return p;
  }
}

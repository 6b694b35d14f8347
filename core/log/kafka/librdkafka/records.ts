// LogRecords from the binding's two consume calls. consumeBatch (infra/kafka-native/binding-consume-batch.patch)
// copies up to n messages on its worker thread into one metadata block and one data block, where the stock consume
// builds a JavaScript object per message (eight property sets each) on the main thread. A packed record's key,
// value and header values are views into the data block, as a kafkajs record's are into its fetch response.
import type { Headers, LogRecord } from '../../types.ts';
import type { RdBatch, RdMessage } from './binding.ts';

/** Bytes of metadata per message (the patch's RLS_BATCH_META). */
const META = 40;
/** Headers of a record without any: one shared frozen object rather than an empty one per record. */
const NO_HEADERS: Headers = Object.freeze({}) as Headers;
const EMPTY: Buffer = Buffer.alloc(0);

/** The stock consume's message object, completed in place into a LogRecord (no second object per record). */
export function toRecord(m: RdMessage): LogRecord {
  const r = m as unknown as LogRecord & { headers: Headers | { [name: string]: Buffer }[] | undefined };
  const h = m.headers;
  if (h === undefined) r.headers = NO_HEADERS;
  else {
    const out: Headers = {};
    for (const entry of h) for (const name in entry) out[name] = entry[name]!;
    r.headers = out;
  }
  if (m.value === null) r.value = EMPTY;
  if (m.key === undefined) r.key = null;
  if (typeof m.timestamp !== 'number') r.timestamp = 0;
  return r;
}

/** consumeBatch's block, record by record. */

export function unpackBatch(batch: RdBatch): LogRecord[] {
  const { topics, meta, data } = batch;
  const n = meta.length / META;
  if (!Number.isInteger(n)) throw new Error(`librdkafka consume batch: ${meta.length} bytes of metadata is not a whole number of ${META}-byte entries`);
  const view = new DataView(meta.buffer, meta.byteOffset, meta.length);
  const out = new Array<LogRecord>(n);
  let at = 0;
  for (let i = 0; i < n; i++) {
    const o = i * META;
    const offset = view.getFloat64(o, true);
    const timestamp = view.getFloat64(o + 8, true);
    const partition = view.getInt32(o + 16, true);
    const topic = topics[view.getInt32(o + 20, true)]!;
    const keyLength = view.getInt32(o + 24, true);
    const valueLength = view.getInt32(o + 28, true);
    const headerBytes = view.getInt32(o + 32, true);
    let key: Buffer | null = null;
    if (keyLength >= 0) {
      key = data.subarray(at, at + keyLength);
      at += keyLength;
    }
    let value: Buffer = EMPTY;
    if (valueLength >= 0) {
      value = data.subarray(at, at + valueLength);
      at += valueLength;
    }
    const headers = headerBytes === 0 ? NO_HEADERS : readHeaders(data, at, at + headerBytes);
    at += headerBytes;
    out[i] = { topic, partition, offset, key, value, timestamp, headers };
  }
  if (at !== data.length) throw new Error(`librdkafka consume batch: ${data.length} bytes of data, ${at} accounted for by its ${n} messages`);
  return out;
}

function readHeaders(data: Buffer, from: number, to: number): Headers {
  const headers: Headers = {};
  let p = from;
  while (p < to) {
    const nameLength = data.readUInt16LE(p);
    const name = data.toString('utf8', p + 2, p + 2 + nameLength);
    const valueLength = data.readUInt32LE(p + 2 + nameLength);
    const v = p + 6 + nameLength;
    headers[name] = data.subarray(v, v + valueLength);
    p = v + valueLength;
  }
  return headers;
}

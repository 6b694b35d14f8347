// On-disk record format of the embedded log. Every record carries its own length and a CRC32 of its body,
// so recovery can find the exact end of the last whole record after a crash, and a read detects bit rot.
//
//   u32 bodyLength | u32 crc32(body) | body:
//     u32 offsetHigh, u32 offsetLow | f64 timestamp | i32 keyLength (-1 = null) | key
//     | u32 valueLength | value | u16 headerCount | { u16 nameLength | name | u32 length | bytes }*
import { crc32 } from 'node:zlib';
import { RlstreamError } from '../../errors.ts';
import type { Headers, LogRecord } from '../types.ts';
import { crc32Combine } from './crc32-combine.ts';
import { checkFrames, sealFrames } from '../../../native/codecs.ts';

export const FRAME = 8; // length + crc
const FIXED_BODY = 8 + 8 + 4 + 4 + 2;
const TWO32 = 0x1_0000_0000;

export interface PlainRecord {
  key: Buffer | null;
  value: Buffer;
  timestamp: number;
  headers: Headers;
}

/** Records encoded back to back, ready to append: one buffer plus where each record ends. */
export interface EncodedBatch {
  baseOffset: number;
  buf: Buffer;
  /** End position (exclusive) of each record in buf. */
  ends: number[];
  timestamps: number[];
  /** CRC-32 of the whole of buf (the journal's checksum reuses it). */
  crc: number;
}

export function encodedSize(r: PlainRecord): number {
  let n = FRAME + FIXED_BODY + (r.key?.length ?? 0) + r.value.length;
  for (const [name, v] of Object.entries(r.headers)) n += 2 + Buffer.byteLength(name) + 4 + v.length;
  return n;
}

/**
 * Encode records with consecutive offsets starting at baseOffset, into `into` when given (a buffer of exactly
 * batchSize(records) bytes that the caller may reuse once the batch is written) or a new buffer.
 */
export function encodeBatch(records: PlainRecord[], baseOffset: number, into?: Buffer): EncodedBatch {
  const sizes = records.map(encodedSize);
  const total = sizes.reduce((a, b) => a + b, 0);
  if (into && into.length !== total) throw new RlstreamError('INTERNAL', `batch buffer of ${into.length} bytes for ${total} bytes of records`);
  const buf = into ?? Buffer.allocUnsafe(total);
  const ends: number[] = [];
  const timestamps: number[] = [];
  let pos = 0;
  records.forEach((r, i) => {
    const start = pos;
    const offset = baseOffset + i;
    pos += FRAME;
    buf.writeUInt32BE(Math.floor(offset / TWO32), pos);
    buf.writeUInt32BE(offset % TWO32, pos + 4);
    buf.writeDoubleBE(r.timestamp, pos + 8);
    pos += 16;
    if (r.key === null) {
      buf.writeInt32BE(-1, pos);
      pos += 4;
    } else {
      buf.writeInt32BE(r.key.length, pos);
      pos += 4 + r.key.copy(buf, pos + 4);
    }
    buf.writeUInt32BE(r.value.length, pos);
    pos += 4 + r.value.copy(buf, pos + 4);
    const headers = Object.entries(r.headers);
    buf.writeUInt16BE(headers.length, pos);
    pos += 2;
    for (const [name, v] of headers) {
      const n = buf.write(name, pos + 2, 'utf8');
      buf.writeUInt16BE(n, pos);
      pos += 2 + n;
      buf.writeUInt32BE(v.length, pos);
      pos += 4 + v.copy(buf, pos + 4);
    }
    const end = start + sizes[i]!;
    buf.writeUInt32BE(end - start - FRAME, start);
    ends.push(end);
    timestamps.push(r.timestamp);
  });
  // The frames' CRCs, and the batch's CRC (the journal reuses it) over the result.
  const sealed = sealFrames(buf, 0, pos);
  if (sealed !== null) return { baseOffset, buf, ends, timestamps, crc: sealed };
  let batchCrc = 0;
  let start = 0;
  for (const end of ends) {
    const bodyCrc = crc32(buf.subarray(start + FRAME, end));
    buf.writeUInt32BE(bodyCrc, start + 4);
    // The batch's CRC continues over the 8 frame bytes, then takes the body's without reading it again.
    batchCrc = crc32Combine(crc32(buf.subarray(start, start + FRAME), batchCrc), bodyCrc, end - start - FRAME);
    start = end;
  }
  return { baseOffset, buf, ends, timestamps, crc: batchCrc };
}

/** Bytes encodeBatch needs for these records. */
export function batchSize(records: PlainRecord[]): number {
  let n = 0;
  for (const r of records) n += encodedSize(r);
  return n;
}

/** Why a frame at some position is not a whole valid record (null when it is). */
export function frameProblem(buf: Buffer, pos: number, limit: number, maxBody: number): string | null {
  if (limit - pos < FRAME) return 'truncated frame';
  const len = buf.readUInt32BE(pos);
  if (len < FIXED_BODY || len > maxBody) return `implausible record length ${len}`;
  if (limit - pos - FRAME < len) return 'truncated record';
  if (crc32(buf.subarray(pos + FRAME, pos + FRAME + len)) !== buf.readUInt32BE(pos + 4)) return 'CRC mismatch';
  return null;
}

/**
 * The end of the whole, valid frames from `pos` (at most maxRecords), and how many: where frameProblem first
 * finds a problem, or after maxRecords. In one native call when the addon is built (a CRC call per record from
 * JS cost several times the CRC itself), else frame by frame here.
 */
export function validFrames(buf: Buffer, pos: number, limit: number, maxRecords: number, maxBody: number): { end: number; records: number } {
  const fast = checkFrames(buf, pos, limit, maxRecords, FIXED_BODY, maxBody);
  if (fast) return fast;
  let records = 0;
  while (pos < limit && records < maxRecords && frameProblem(buf, pos, limit, maxBody) === null) {
    pos += recordSizeAt(buf, pos);
    records++;
  }
  return { end: pos, records };
}

export function peekOffset(buf: Buffer, pos: number): number {
  return buf.readUInt32BE(pos + FRAME) * TWO32 + buf.readUInt32BE(pos + FRAME + 4);
}

export function peekTimestamp(buf: Buffer, pos: number): number {
  return buf.readDoubleBE(pos + FRAME + 8);
}

export function recordSizeAt(buf: Buffer, pos: number): number {
  return FRAME + buf.readUInt32BE(pos);
}

/** The offset of the record framed at pos. */
export function offsetAt(view: DataView, pos: number): number {
  return view.getUint32(pos + FRAME) * TWO32 + view.getUint32(pos + FRAME + 4);
}

/** Where the value of the record framed at pos starts (its length is the u32 just before it). */
export function valueStartAt(view: DataView, pos: number): number {
  const keyLen = view.getInt32(pos + FRAME + 16);
  return pos + FRAME + 16 + 4 + Math.max(keyLen, 0) + 4;
}

/**
 * The LogRecord of topic/partition at pos of a chunk whose frames were checked (`view` spans `buf`); key, value
 * and header buffers are views into buf. Through a DataView, not Buffer's readers, which check their arguments
 * on every call, and without copying a partition record into a consumer record: both show on a poll's cost.
 */
export function readRecordAt(view: DataView, buf: Buffer, pos: number, topic: string, partition: number): LogRecord {
  const end = pos + FRAME + view.getUint32(pos);
  let p = pos + FRAME;
  const offset = offsetAt(view, pos);
  const timestamp = view.getFloat64(p + 8);
  p += 16;
  const keyLen = view.getInt32(p);
  p += 4;
  let key: Buffer | null = null;
  if (keyLen >= 0) {
    key = buf.subarray(p, p + keyLen);
    p += keyLen;
  }
  const valueLen = view.getUint32(p);
  p += 4;
  const value = buf.subarray(p, p + valueLen);
  p += valueLen;
  const count = view.getUint16(p);
  p += 2;
  const headers: Headers = {};
  for (let i = 0; i < count; i++) {
    const nameLen = view.getUint16(p);
    const name = buf.toString('utf8', p + 2, p + 2 + nameLen);
    p += 2 + nameLen;
    const len = view.getUint32(p);
    headers[name] = buf.subarray(p + 4, p + 4 + len);
    p += 4 + len;
  }
  if (p !== end) throw new RlstreamError('LOG_CORRUPT', `record at offset ${offset} has inconsistent field lengths`);
  return { topic, partition, offset, key, value, timestamp, headers };
}

/** The record with its key, value and headers copied out of the buffer it was read in (which may be reused). */
export function copiedRecord(r: LogRecord): LogRecord {
  const headers: Headers = {};
  for (const [name, v] of Object.entries(r.headers)) headers[name] = Buffer.from(v);
  return { ...r, key: r.key && Buffer.from(r.key), value: Buffer.from(r.value), headers };
}

/** Split a blob of back-to-back records (as stored in the transaction journal) into an EncodedBatch. */
export function batchFromBlob(buf: Buffer, maxBody: number): EncodedBatch {
  const ends: number[] = [];
  const timestamps: number[] = [];
  let pos = 0;
  while (pos < buf.length) {
    const problem = frameProblem(buf, pos, buf.length, maxBody);
    if (problem) throw new RlstreamError('LOG_CORRUPT', `journal record blob: ${problem} at byte ${pos}`);
    timestamps.push(peekTimestamp(buf, pos));
    pos += recordSizeAt(buf, pos);
    ends.push(pos);
  }
  return { baseOffset: buf.length > 0 ? peekOffset(buf, 0) : 0, buf, ends, timestamps, crc: crc32(buf) };
}

/**
 * The position of the first whole, CRC-valid frame at or after `from` whose offset could follow a damaged
 * region that starts at `damageStart` with `expected` as its first missing offset, or -1. The offset must be at
 * least `expected` and no more than the region could have held (every frame takes at least FRAME + FIXED_BODY
 * bytes): with the length check first, random bytes almost never reach the CRC.
 */
export function findNextFrame(buf: Buffer, from: number, damageStart: number, expected: number, maxBody: number): number {
  const limit = buf.length;
  for (let q = from; q + FRAME + FIXED_BODY <= limit; q++) {
    const len = buf.readUInt32BE(q);
    if (len < FIXED_BODY || len > maxBody || q + FRAME + len > limit) continue;
    const offset = peekOffset(buf, q);
    if (offset < expected || offset - expected > (q - damageStart) / (FRAME + FIXED_BODY) + 1) continue;
    if (frameProblem(buf, q, limit, maxBody) === null) return q;
  }
  return -1;
}

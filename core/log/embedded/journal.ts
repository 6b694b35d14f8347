// The embedded log's write-ahead journal: consumer-group offset commits and whole transactions (records of
// every partition plus the group offsets) as single CRC-framed entries. A transaction is durable once its one
// entry is; recovery replays the journal in order, re-applying any transaction whose records did not all
// reach their partitions. A checkpoint (offsets snapshot, written by rename) lets the journal start afresh.
//
//   entry: u32 length | u32 crc32(payload) | payload = u8 kind | ...
//     kind 1 (offsets):     JSON { g: group, o: [[topic, partition, offset], ...] }
//     kind 2 (transaction): u32 headerLength | JSON header { id, o: {group: [[t, p, o]]}, parts: [{ t, p, base, len }] } | blobs
import { closeSync, existsSync, fstatSync, fsyncSync, ftruncateSync, openSync, readFileSync, readdirSync, renameSync, unlink, unlinkSync, writeSync, writevSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import type { Logger } from '../../telemetry.ts';
import { crc32Combine } from './crc32-combine.ts';

export type OffsetTriple = [topic: string, partition: number, offset: number];

export interface TxnPart {
  topic: string;
  partition: number;
  /** Offset the first record was given when the transaction committed. */
  base: number;
  /** Encoded records, exactly as they go into the segment. */
  blob: Buffer;
  /** CRC-32 of blob when the caller has it (EncodedBatch.crc): the entry's checksum is then not a second pass over it. */
  blobCrc?: number;
}

export interface TxnEntry {
  transactionalId: string;
  offsets: Map<string, OffsetTriple[]>;
  parts: TxnPart[];
}

export type JournalEntry = { kind: 'offsets'; group: string; offsets: OffsetTriple[] } | ({ kind: 'txn' } & TxnEntry);

interface Checkpoint {
  generation: number;
  groups: Record<string, OffsetTriple[]>;
}

const KIND_OFFSETS = 1;
const KIND_TXN = 2;
/** Most buffers one writev takes (Linux's IOV_MAX). */
const IOV_MAX = 1024;

/**
 * An entry as the buffers to write back to back: frame, then the payload in pieces. A transaction's record
 * blobs (most of its bytes) are neither copied nor concatenated; the CRC runs over the pieces in order.
 */
function entryChunks(entry: JournalEntry): Buffer[] {
  let payload: Buffer[];
  if (entry.kind === 'offsets') {
    payload = [Buffer.from([KIND_OFFSETS]), Buffer.from(JSON.stringify({ g: entry.group, o: entry.offsets }))];
  } else {
    const header = Buffer.from(
      JSON.stringify({
        id: entry.transactionalId,
        o: Object.fromEntries(entry.offsets),
        parts: entry.parts.map((p) => ({ t: p.topic, p: p.partition, base: p.base, len: p.blob.length })),
      }),
    );
    const head = Buffer.allocUnsafe(5);
    head.writeUInt8(KIND_TXN, 0);
    head.writeUInt32BE(header.length, 1);
    payload = [head, header, ...entry.parts.map((p) => p.blob)];
  }
  let length = 0;
  let crc = 0;
  for (const b of payload) length += b.length;
  if (entry.kind === 'txn') {
    crc = crc32(payload[1]!, crc32(payload[0]!));
    for (const p of entry.parts) crc = p.blobCrc === undefined ? crc32(p.blob, crc) : crc32Combine(crc, p.blobCrc, p.blob.length);
  } else {
    for (const b of payload) crc = crc32(b, crc);
  }
  const frame = Buffer.allocUnsafe(8);
  frame.writeUInt32BE(length, 0);
  frame.writeUInt32BE(crc, 4);
  return [frame, ...payload];
}

export function encodeEntry(entry: JournalEntry): Buffer {
  return Buffer.concat(entryChunks(entry));
}

function decodePayload(payload: Buffer): JournalEntry {
  if (payload[0] === KIND_OFFSETS) {
    const j = JSON.parse(payload.toString('utf8', 1)) as { g: string; o: OffsetTriple[] };
    return { kind: 'offsets', group: j.g, offsets: j.o };
  }
  const headerLen = payload.readUInt32BE(1);
  const h = JSON.parse(payload.toString('utf8', 5, 5 + headerLen)) as {
    id: string;
    o: Record<string, OffsetTriple[]>;
    parts: { t: string; p: number; base: number; len: number }[];
  };
  let pos = 5 + headerLen;
  const parts = h.parts.map((p) => {
    const blob = payload.subarray(pos, pos + p.len);
    pos += p.len;
    return { topic: p.t, partition: p.p, base: p.base, blob };
  });
  return { kind: 'txn', transactionalId: h.id, offsets: new Map(Object.entries(h.o)), parts };
}

export class Journal {
  private fd = -1;
  private size = 0;
  private generation = 0;

  constructor(
    private readonly dir: string,
    private readonly logger: Logger,
  ) {}

  private path(gen: number): string {
    return join(this.dir, `journal-${String(gen).padStart(10, '0')}.log`);
  }

  private get checkpointPath(): string {
    return join(this.dir, 'checkpoint.json');
  }

  /**
   * Read the checkpoint and the current journal (cutting a torn tail), remove stale journals, and open the
   * journal for appends. Returns the checkpointed offsets and the entries to replay, in order.
   */
  recover(): { groups: Record<string, OffsetTriple[]>; entries: JournalEntry[] } {
    let cp: Checkpoint = { generation: 0, groups: {} };
    if (existsSync(this.checkpointPath)) cp = JSON.parse(readFileSync(this.checkpointPath, 'utf8')) as Checkpoint;
    this.generation = cp.generation;
    for (const f of readdirSync(this.dir)) {
      const m = /^journal-(\d+)\.log$/.exec(f);
      if (m && Number(m[1]) !== this.generation) unlinkSync(join(this.dir, f));
      if (f.endsWith('.tmp')) unlinkSync(join(this.dir, f));
    }
    const entries: JournalEntry[] = [];
    const path = this.path(this.generation);
    const buf = existsSync(path) ? readFileSync(path) : Buffer.alloc(0);
    let pos = 0;
    while (pos + 8 <= buf.length) {
      const len = buf.readUInt32BE(pos);
      if (pos + 8 + len > buf.length) break;
      const payload = buf.subarray(pos + 8, pos + 8 + len);
      if (crc32(payload) !== buf.readUInt32BE(pos + 4)) break;
      entries.push(decodePayload(payload));
      pos += 8 + len;
    }
    this.fd = openSync(path, existsSync(path) ? 'r+' : 'w+');
    if (pos < buf.length) {
      this.logger.warn('embedded log: truncating torn journal tail', { file: path, at: pos, dropped: buf.length - pos });
      ftruncateSync(this.fd, pos);
    }
    this.size = pos;
    return { groups: cp.groups, entries };
  }

  get bytes(): number {
    return this.size;
  }

  append(entry: JournalEntry, sync: boolean): void {
    const chunks = entryChunks(entry);
    let length = 0;
    for (const c of chunks) length += c.length;
    let written = 0;
    // writev may write less than asked (like write): continue from where it stopped.
    while (written < length) {
      let skip = written;
      const rest: Buffer[] = [];
      for (const c of chunks) {
        if (skip >= c.length) skip -= c.length;
        else {
          rest.push(skip > 0 ? c.subarray(skip) : c);
          skip = 0;
        }
      }
      written += writevSync(this.fd, rest.slice(0, IOV_MAX), this.size + written);
    }
    this.size += length;
    if (sync) fsyncSync(this.fd);
  }

  /**
   * Replace the journal by a checkpoint of the offsets. The caller has made every partition durable first
   * (the checkpoint forgets the transactions' records); the rename is the atomic switch.
   */
  checkpoint(groups: Record<string, OffsetTriple[]>): void {
    const next = this.generation + 1;
    const tmp = this.checkpointPath + '.tmp';
    const fd = openSync(tmp, 'w');
    writeSync(fd, JSON.stringify({ generation: next, groups } satisfies Checkpoint));
    fsyncSync(fd);
    closeSync(fd);
    const newFd = openSync(this.path(next), 'w+');
    renameSync(tmp, this.checkpointPath);
    const dirFd = openSync(this.dir, 'r');
    fsyncSync(dirFd);
    closeSync(dirFd);
    closeSync(this.fd);
    // The old journal is obsolete once the checkpoint is renamed in; deleting a journal of tens of megabytes
    // takes the file system tens of milliseconds, so it happens off the event loop. One left behind by a crash
    // is deleted by recover(), like any journal of another generation.
    unlink(this.path(this.generation), () => {});
    this.fd = newFd;
    this.generation = next;
    this.size = fstatSync(newFd).size;
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

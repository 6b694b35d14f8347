// The embedded log's write-ahead journal: consumer-group offset commits and whole transactions (records of
// every partition plus the group offsets) as single CRC-framed entries. A transaction is durable once its one
// entry is; recovery replays the journal in order, re-applying any transaction whose records did not all
// reach their partitions. A checkpoint (offsets snapshot, written by rename) lets the journal start afresh.
// Recovery refuses what it cannot account for (a missing journal, a checkpoint naming a journal that is not
// there, an entry that fails its CRC with valid entries after it) with LOG_CORRUPT and the repair command,
// rather than dropping committed offsets: only a torn tail (no valid entry after the damage) is cut.
//
//   entry: u32 length | u32 crc32(payload) | payload = u8 kind | ...
//     kind 1 (offsets):     JSON { g: group, o: [[topic, partition, offset], ...] }
//     kind 2 (transaction): u32 headerLength | JSON header { id, o: {group: [[t, p, o]]}, parts: [{ t, p, base, len }] } | blobs
import { closeSync, existsSync, fstatSync, fsyncSync, ftruncateSync, openSync, readFileSync, readdirSync, renameSync, statSync, unlink, unlinkSync, writeSync, writevSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import { crc32Combine } from './crc32-combine.ts';
import { corruptError, fsyncDir, readJsonFile, unlinkIfThere, writeFileDurably } from './damage.ts';

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

function isTriple(t: unknown): t is OffsetTriple {
  return Array.isArray(t) && t.length === 3 && typeof t[0] === 'string' && Number.isInteger(t[1]) && Number.isInteger(t[2]);
}

function isCheckpoint(x: unknown): x is Checkpoint {
  if (typeof x !== 'object' || x === null) return false;
  const c = x as Record<string, unknown>;
  const groups = c['groups'];
  return (
    Number.isInteger(c['generation']) &&
    (c['generation'] as number) >= 0 &&
    typeof groups === 'object' &&
    groups !== null &&
    Object.values(groups).every((g) => Array.isArray(g) && g.every(isTriple))
  );
}

/** Whether an entry starts at pos: length within the buffer, a known kind, JSON where it must be, and its CRC. */
function entryAt(buf: Buffer, pos: number): boolean {
  if (pos + 9 > buf.length) return false;
  const len = buf.readUInt32BE(pos);
  if (len < 2 || pos + 8 + len > buf.length) return false;
  const kind = buf[pos + 8];
  // Cheap checks before the CRC, so that a scan for the next entry rarely computes one.
  if (kind === KIND_OFFSETS ? buf[pos + 9] !== 0x7b : kind !== KIND_TXN || len < 6 || buf[pos + 13] !== 0x7b) return false;
  return crc32(buf.subarray(pos + 8, pos + 8 + len)) === buf.readUInt32BE(pos + 4);
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

export interface JournalOptions {
  /** Never write: no stale journal is deleted, no torn tail cut, and appends fail with LOG_READ_ONLY. */
  readOnly: boolean;
  /** Quarantine what recovery would refuse (`rlstream log repair`). */
  repair: boolean;
}

export class Journal {
  private fd = -1;
  private size = 0;
  private generation = 0;
  /** Whether recovery quarantined damage: the log then checkpoints at once, so the damaged journal is retired. */
  repaired = false;

  constructor(
    private readonly dir: string,
    private readonly logger: Logger,
    private readonly options: JournalOptions = { readOnly: false, repair: false },
  ) {}

  private path(gen: number): string {
    return join(this.dir, `journal-${String(gen).padStart(10, '0')}.log`);
  }

  private get checkpointPath(): string {
    return join(this.dir, 'checkpoint.json');
  }

  /**
   * Read the checkpoint and the current journal (cutting a torn tail), remove stale journals, and open the
   * journal for appends. Returns the checkpointed offsets and the entries to replay, in order. `hasState`: the
   * log already holds topics, so a missing journal is a loss, not a fresh directory.
   */
  recover(hasState: boolean): { groups: Record<string, OffsetTriple[]>; entries: JournalEntry[] } {
    const { readOnly, repair } = this.options;
    const journals = new Map<number, string>();
    for (const f of readdirSync(this.dir)) {
      const m = /^journal-(\d+)\.log$/.exec(f);
      if (m) journals.set(Number(m[1]), join(this.dir, f));
    }
    const newest = journals.size > 0 ? Math.max(...journals.keys()) : 0;
    const cp = this.readCheckpoint(newest);
    this.generation = cp.generation;
    if (!journals.has(this.generation) && (hasState || journals.size > 0 || existsSync(this.checkpointPath))) {
      const missing = this.path(this.generation);
      const others = [...journals.keys()].sort((a, b) => a - b);
      const what = others.length > 0 ? `is missing: checkpoint.json names generation ${this.generation}, the journals here are of generations ${others.join(', ')}` : 'is missing: the offsets consumer groups committed since the last checkpoint are lost';
      if (!repair) throw corruptError(this.dir, missing, what, others.length > 0 ? `continue from the newest journal (generation ${newest})` : 'start a new journal from the checkpoint (groups re-read what they committed since)');
      this.logger.warn('embedded log: journal missing; repair continues from the newest one there is', { file: missing, found: others });
      if (others.length > 0) this.generation = newest;
      this.repaired = true;
    }
    const path = this.path(this.generation);
    for (const [gen, file] of journals) {
      if (gen === this.generation) continue;
      if (gen > this.generation && statSync(file).size > 0) {
        if (!repair) throw corruptError(this.dir, file, `holds entries but is newer than the checkpoint's generation ${this.generation}`, 'quarantine it');
        if (!readOnly) renameSync(file, `${file}.quarantine`);
        continue;
      }
      // Older generations are obsolete once the checkpoint names a newer one; an empty newer one is a
      // checkpoint cut short before its rename. An older one may vanish meanwhile: a checkpoint deletes the
      // journal it replaces off the event loop, and a log of this directory closed just before may still be at it.
      if (!readOnly) unlinkIfThere(file);
    }
    if (!readOnly && existsSync(this.checkpointPath + '.tmp')) unlinkSync(this.checkpointPath + '.tmp');
    const entries: JournalEntry[] = [];
    const buf = existsSync(path) ? readFileSync(path) : Buffer.alloc(0);
    let pos = 0;
    while (pos + 8 <= buf.length) {
      if (!entryAt(buf, pos)) {
        let next = pos + 1;
        while (next + 8 <= buf.length && !entryAt(buf, next)) next++;
        if (next + 8 > buf.length) break; // nothing valid after it: a torn tail
        if (!repair) {
          throw corruptError(this.dir, path, `the entry at byte ${pos} fails its checks and valid entries follow at byte ${next}`, 'quarantine the damaged entry (the offsets it committed are lost; later commits of the same partitions still apply)');
        }
        const q = `${path}-${pos}.quarantine`;
        if (!readOnly) writeFileDurably(q, buf.subarray(pos, next));
        this.logger.warn('embedded log: damaged journal entry quarantined', { file: path, at: pos, bytes: next - pos, quarantine: q });
        this.repaired = true;
        pos = next;
        continue;
      }
      const len = buf.readUInt32BE(pos);
      try {
        entries.push(decodePayload(buf.subarray(pos + 8, pos + 8 + len)));
      } catch (err) {
        throw corruptError(this.dir, path, `the entry at byte ${pos} passes its CRC but cannot be decoded (${(err as Error).message})`, 'quarantine it', err);
      }
      pos += 8 + len;
    }
    if (readOnly) {
      if (pos < buf.length) this.logger.warn('embedded log: ignoring torn journal tail (read-only open)', { file: path, at: pos, bytes: buf.length - pos });
      this.size = pos;
      return { groups: cp.groups, entries };
    }
    const created = !existsSync(path);
    this.fd = openSync(path, created ? 'w+' : 'r+');
    // A journal whose name a machine crash could take back would read as a missing journal on the next open.
    if (created) fsyncDir(this.dir);
    if (pos < buf.length) {
      this.logger.warn('embedded log: truncating torn journal tail', { file: path, at: pos, dropped: buf.length - pos });
      ftruncateSync(this.fd, pos);
    }
    this.size = pos;
    return { groups: cp.groups, entries };
  }

  private readCheckpoint(newestJournal: number): Checkpoint {
    if (!existsSync(this.checkpointPath)) return { generation: 0, groups: {} };
    const repairDoes = `continue from the newest journal (generation ${newestJournal}) without the checkpoint's offsets`;
    try {
      const parsed = readJsonFile(this.dir, this.checkpointPath, repairDoes);
      if (!isCheckpoint(parsed)) throw corruptError(this.dir, this.checkpointPath, 'is not a checkpoint ({ generation: integer >= 0, groups: { group: [[topic, partition, offset]] } })', repairDoes);
      return parsed;
    } catch (err) {
      if (!this.options.repair) throw err;
      this.logger.warn('embedded log: damaged checkpoint set aside', { file: this.checkpointPath, error: (err as Error).message });
      if (!this.options.readOnly) renameSync(this.checkpointPath, `${this.checkpointPath}.quarantine`);
      this.repaired = true;
      return { generation: newestJournal, groups: {} };
    }
  }

  get bytes(): number {
    return this.size;
  }

  append(entry: JournalEntry, sync: boolean): void {
    if (this.options.readOnly) throw new RlstreamError('LOG_READ_ONLY', `${this.dir}: the log is open read-only`);
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
    // The new journal starts with the same offsets as the checkpoint, so that either file alone holds them: a
    // checkpoint found damaged later is set aside by repair without losing a group's position.
    let copied = 0;
    for (const [group, offsets] of Object.entries(groups)) {
      if (offsets.length === 0) continue;
      this.append({ kind: 'offsets', group, offsets }, false);
      copied++;
    }
    if (copied > 0) fsyncSync(this.fd);
  }

  /** Close, first forcing the journal to disk when `sync` (the offsets committed since the last fsync). */
  close(sync = false): void {
    if (this.fd >= 0 && sync && this.size > 0) fsyncSync(this.fd);
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

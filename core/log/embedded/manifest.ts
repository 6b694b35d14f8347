// What an embedded log should hold (manifest.json in the log directory): each topic with its partition count
// and retention, and for each partition its segments, each with its base offset, the offset after its last
// record, its length and its CRC-32. The high-water mark of a partition is the end of its last segment; the
// committed offsets are in checkpoint.json and the journal. A partition's entry is taken where its data is on
// disk (an open, a segment roll, a checkpoint, a close), never from records that only reached the page cache, so
// a machine crash does not make an entry claim records the disk never had. `clean` says the last writer closed
// the log: then every byte it wrote is listed, and any byte missing is damage, not a torn tail.
// An open compares the files with it (partition.ts, index.ts) to find what frame checks alone cannot: whole
// segments, partitions or topics deleted, segments cut at their end, segments replaced by other files.
// Logs written before the manifest existed have none: their first read-write open writes one (and marks each
// topic's meta.json, so that a manifest deleted later is missed rather than taken for an old log).
import { existsSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import type { RetentionOptions } from '../types.ts';
import { asideName, corruptError, readJsonFile, writeFileDurably } from './damage.ts';

export const MANIFEST_FILE = 'manifest.json';

export interface SegmentRecord {
  base: number;
  /** The offset after the segment's last record (base when it is empty). */
  next: number;
  bytes: number;
  /** CRC-32 of the segment's bytes; null when it was not known when the entry was taken. */
  crc: number | null;
}

export interface PartitionRecord {
  /** In offset order; the last one is the active segment, and its `next` is the partition's high-water mark. */
  segments: SegmentRecord[];
}

export interface TopicRecord {
  partitions: PartitionRecord[];
  retention?: RetentionOptions;
}

export interface LogManifest {
  version: 1;
  /** The writer closed the log after taking every entry: nothing it wrote is missing from them. */
  clean: boolean;
  topics: Record<string, TopicRecord>;
}

/** How an open found the manifest. */
export type ManifestState = 'present' | 'predates' | 'missing' | 'damaged';

function isNat(x: unknown): x is number {
  return Number.isSafeInteger(x) && (x as number) >= 0;
}

function isSegment(x: unknown): x is SegmentRecord {
  if (typeof x !== 'object' || x === null) return false;
  const s = x as Record<string, unknown>;
  return isNat(s['base']) && isNat(s['next']) && (s['next'] as number) >= (s['base'] as number) && isNat(s['bytes']) && (s['crc'] === null || (isNat(s['crc']) && (s['crc'] as number) <= 0xffffffff));
}

function isPartition(x: unknown): x is PartitionRecord {
  if (typeof x !== 'object' || x === null) return false;
  const segs = (x as Record<string, unknown>)['segments'];
  if (!Array.isArray(segs) || segs.length === 0 || !segs.every(isSegment)) return false;
  return segs.every((s, i) => i === 0 || s.base >= segs[i - 1]!.next);
}

function isManifest(x: unknown): x is LogManifest {
  if (typeof x !== 'object' || x === null) return false;
  const m = x as Record<string, unknown>;
  const topics = m['topics'];
  if (m['version'] !== 1 || typeof m['clean'] !== 'boolean' || typeof topics !== 'object' || topics === null || Array.isArray(topics)) return false;
  return Object.values(topics).every((t) => {
    if (typeof t !== 'object' || t === null) return false;
    const parts = (t as Record<string, unknown>)['partitions'];
    return Array.isArray(parts) && parts.length > 0 && parts.every(isPartition);
  });
}

export function highOf(p: PartitionRecord): number {
  return p.segments[p.segments.length - 1]!.next;
}

export function lowOf(p: PartitionRecord): number {
  return p.segments[0]!.base;
}

const REPAIR_DOES = 'set it aside and write it anew from the files (losses from before then can no longer be found)';

/**
 * The manifest, or how it is missing. `marked`: a topic's meta.json says a manifest was written, so its absence
 * is a deletion, not an old log. Repair sets a damaged one aside; anything else fails with LOG_CORRUPT.
 */
export function readManifest(logDir: string, marked: boolean, mode: { repair: boolean; readOnly: boolean }): { manifest: LogManifest | null; state: ManifestState } {
  const path = join(logDir, MANIFEST_FILE);
  if (!existsSync(path)) {
    if (!marked) return { manifest: null, state: 'predates' };
    if (mode.repair || mode.readOnly) return { manifest: null, state: 'missing' };
    throw corruptError(logDir, path, 'is missing, yet the topics were written with one: what the log should hold cannot be checked', REPAIR_DOES);
  }
  try {
    const parsed = readJsonFile(logDir, path, REPAIR_DOES);
    if (!isManifest(parsed)) throw corruptError(logDir, path, 'is not a manifest ({ version: 1, clean, topics: { name: { partitions: [{ segments: [{ base, next, bytes, crc }] }] } } })', REPAIR_DOES);
    return { manifest: parsed, state: 'present' };
  } catch (err) {
    if (mode.readOnly) return { manifest: null, state: 'damaged' };
    if (!mode.repair) throw err;
    renameSync(path, asideName(path));
    return { manifest: null, state: 'damaged' };
  }
}

export function writeManifest(logDir: string, manifest: LogManifest): void {
  writeFileDurably(join(logDir, MANIFEST_FILE), JSON.stringify(manifest));
}

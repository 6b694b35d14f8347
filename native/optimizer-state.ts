// A model's AdamW state on disk, in either of two layouts, and loaded into whatever the model holds (all of its
// moments, or one ZeRO-1 shard of them):
//   optimizer.safetensors                     one process: `exp_avg.<name>` and `exp_avg_sq.<name>` per trained
//                                             tensor, metadata { format: 'rlstream-adamw', step }
//   optimizer-shard-RRRRR-of-NNNNN.safetensors  rank R of a data-parallel run of N ranks: `exp_avg` and `exp_avg_sq`
//                                             over trained floats [begin, begin + count), metadata { format:
//                                             'rlstream-adamw-shard', begin, count, numel, step, rank, ranks }
// Either layout loads into any shard cut (another rank count, or one process), so a run resumes on another number
// of GPUs. Everything is checked before anything is written into the model: the shards must tile the trained floats
// exactly, once, at one step, with finite values; the file names the problem otherwise.
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../core/errors.ts';
import { openWeights, type WeightSource } from '../core/weights/hf-dir.ts';
import { writeSafetensors } from '../core/weights/safetensors.ts';
import type { Model } from './model.ts';

export const OPTIMIZER_FILE = 'optimizer.safetensors';
const SHARD_FORMAT = 'rlstream-adamw-shard';
const SHARD_FILE = /^optimizer-shard-(\d{5})-of-(\d{5})\.safetensors$/;
const MOMENTS = ['exp_avg', 'exp_avg_sq'] as const;

export function optimizerShardFile(rank: number, ranks: number): string {
  const pad = (n: number) => String(n).padStart(5, '0');
  return `optimizer-shard-${pad(rank)}-of-${pad(ranks)}.safetensors`;
}

const bad = (path: string, what: string) => new RlstreamError('WEIGHTS_FORMAT', `${path}: ${what}`);

/** Rank `rank` of `ranks` writes the moments it holds (its shard) into `dir`. */
export async function saveOptimizerShard(model: Model, dir: string, rank: number, ranks: number): Promise<void> {
  const m = model.optimizerMoments();
  const { numel } = model.trainRange();
  const metadata = { format: SHARD_FORMAT, begin: String(m.begin), count: String(m.count), numel: String(numel), step: String(m.step), rank: String(rank), ranks: String(ranks) };
  await writeSafetensors(join(dir, optimizerShardFile(rank, ranks)), [['exp_avg', { shape: [m.count], data: m.expAvg }], ['exp_avg_sq', { shape: [m.count], data: m.expAvgSq }]], metadata);
}

/** A non-negative integer from a metadata field, or the file is refused naming it. */
function int(meta: Record<string, string>, key: string, path: string): number {
  const v = Number(meta[key]);
  if (meta[key] === undefined || !Number.isSafeInteger(v) || v < 0) throw bad(path, `metadata ${key} must be a non-negative integer, got ${String(meta[key])}`);
  return v;
}

/** Where to put what was read: the model's flat moments cover trained floats [begin, begin + count). */
interface Target {
  begin: number;
  count: number;
  expAvg: Float32Array;
  expAvgSq: Float32Array;
}

/** Values checked and waiting to be written into the model: all of them or none. */
type Staged = { into: Float32Array; from: number; values: Float32Array }[];

/** Copies src (trained floats [at, at + src.length)) where it overlaps the target, checking every value is finite. */
function copyOverlap(path: string, name: string, src: Float32Array, at: number, t: Target, into: Float32Array, staged: Staged): void {
  const lo = Math.max(at, t.begin);
  const hi = Math.min(at + src.length, t.begin + t.count);
  if (lo >= hi) return;
  const values = src.subarray(lo - at, hi - at);
  for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i])) throw new RlstreamError('NATIVE_NON_FINITE', `${path}: ${name}[${lo - at + i}] is not finite`);
  staged.push({ into, from: lo - t.begin, values });
}

/** Reads the shards of one data-parallel checkpoint; returns the step. */
function fromShards(dir: string, files: string[], numel: number, t: Target, staged: Staged): number {
  const ranks = Number(SHARD_FILE.exec(files[0]!)![2]);
  for (const f of files) if (Number(SHARD_FILE.exec(f)![2]) !== ranks) throw bad(dir, `optimizer shards of different runs: ${files[0]} and ${f}`);
  for (let r = 0; r < ranks; r++) if (!files.includes(optimizerShardFile(r, ranks))) throw bad(dir, `${optimizerShardFile(r, ranks)} is missing: the optimizer state is cut over ${ranks} ranks`);
  const shards = files.map((f) => {
    const path = join(dir, f);
    const w = openWeights(path);
    try {
      const meta = w.metadata;
      if (meta['format'] !== SHARD_FORMAT) throw bad(path, `metadata format must be '${SHARD_FORMAT}', got ${String(meta['format'])}`);
      const s = { path, begin: int(meta, 'begin', path), count: int(meta, 'count', path), numel: int(meta, 'numel', path), step: int(meta, 'step', path), rank: int(meta, 'rank', path) };
      if (s.numel !== numel) throw bad(path, `holds the moments of ${s.numel} trained floats; this model trains ${numel}`);
      if (s.rank !== Number(SHARD_FILE.exec(f)![1])) throw bad(path, `metadata rank ${s.rank} differs from its file name`);
      for (const name of MOMENTS) {
        const e = w.tensors.get(name)?.entry;
        if (!e || e.shape.length !== 1 || e.shape[0] !== s.count) throw bad(path, `tensor ${name} must have shape [${s.count}], got ${e ? `[${e.shape.join(', ')}]` : 'none'}`);
      }
      if (w.tensors.size !== MOMENTS.length) throw bad(path, `holds tensors other than ${MOMENTS.join(' and ')}`);
      return s;
    } finally {
      w.close();
    }
  });
  shards.sort((a, b) => a.begin - b.begin);
  let at = 0;
  for (const s of shards) {
    if (s.begin !== at) throw bad(s.path, `starts at trained float ${s.begin}, but the shards before it end at ${at} (${s.begin > at ? 'a gap' : 'an overlap'})`);
    if (s.step !== shards[0]!.step) throw bad(s.path, `is at step ${s.step}, ${shards[0]!.path} at step ${shards[0]!.step}`);
    at += s.count;
  }
  if (at !== numel) throw bad(dir, `the optimizer shards cover ${at} of ${numel} trained floats`);
  for (const s of shards) {
    if (s.begin + s.count <= t.begin || s.begin >= t.begin + t.count) continue;
    const w = openWeights(s.path);
    try {
      for (const [k, name] of MOMENTS.entries()) {
        const buf = new Float32Array(s.count);
        w.read(name, buf);
        copyOverlap(s.path, name, buf, s.begin, t, k === 0 ? t.expAvg : t.expAvgSq, staged);
      }
    } finally {
      w.close();
    }
  }
  return shards[0]!.step;
}

/** Reads a one-process optimizer.safetensors; `trained` is where each trained tensor sits among the trained floats. */
function fromNamed(path: string, trained: { name: string; offset: number; length: number }[], t: Target, staged: Staged): number {
  const w: WeightSource = openWeights(path);
  try {
    const want = new Set(trained.flatMap(({ name }) => MOMENTS.map((m) => `${m}.${name}`)));
    for (const name of want) if (!w.tensors.has(name)) throw bad(path, `optimizer state tensor ${name} is missing`);
    for (const name of w.tensors.keys()) if (!want.has(name)) throw bad(path, `unexpected tensor ${name} for this config`);
    for (const { name, offset, length } of trained) {
      for (const [k, m] of MOMENTS.entries()) {
        const e = w.tensors.get(`${m}.${name}`)!.entry;
        const size = e.shape.reduce((a, b) => a * b, 1);
        if (size !== length) throw bad(path, `tensor ${m}.${name} has ${size} elements, the config gives ${length}`);
        if (offset + length <= t.begin || offset >= t.begin + t.count) continue;
        const buf = new Float32Array(length);
        w.read(`${m}.${name}`, buf);
        copyOverlap(path, `${m}.${name}`, buf, offset, t, k === 0 ? t.expAvg : t.expAvgSq, staged);
      }
    }
    const step = Number(w.metadata['step'] ?? '0');
    if (!Number.isSafeInteger(step) || step < 0) throw bad(path, `bad step ${String(w.metadata['step'])}`);
    return step;
  } finally {
    w.close();
  }
}

/**
 * Fills the moments `model` holds (all, or its shard) and its step from `dir`: optimizer.safetensors, else the
 * optimizer shards of a data-parallel checkpoint of any rank count. Nothing is written into the model unless all
 * of it checks out.
 */
export function loadOptimizerState(model: Model, dir: string): void {
  const m = model.optimizerMoments();
  const { numel } = model.trainRange();
  const staged: Staged = [];
  let step: number;
  const shardFiles = existsSync(dir) ? readdirSync(dir).filter((f) => SHARD_FILE.test(f)).sort() : [];
  if (existsSync(join(dir, OPTIMIZER_FILE))) {
    if (shardFiles.length > 0) throw bad(dir, `holds both ${OPTIMIZER_FILE} and optimizer shards; which one is the state is not clear`);
    step = fromNamed(join(dir, OPTIMIZER_FILE), model.trainedLayout(), m, staged);
  } else if (shardFiles.length > 0) {
    step = fromShards(dir, shardFiles, numel, m, staged);
  } else {
    throw bad(dir, `no optimizer state: neither ${OPTIMIZER_FILE} nor optimizer-shard-RRRRR-of-NNNNN.safetensors files`);
  }
  // Every float of the target came from somewhere: the tiling was checked, and a named file holds every tensor.
  for (const { into, from, values } of staged) into.set(values, from);
  model.setOptimizerMoments(step);
}

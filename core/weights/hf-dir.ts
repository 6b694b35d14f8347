// Weights as Hugging Face lays them out: one .safetensors file, or a model directory holding model.safetensors or
// shards named by model.safetensors.index.json ({ metadata: { total_size }, weight_map: { tensor: shard file } }).
// The one reader of both (openWeights: every tensor's file and header entry, read tensor by tensor) and the one
// writer of a directory (writeHfDir: shards, index, config.json, generation_config.json and the tokenizer files),
// used by `rlstream export` and the inference servers' weight-sync directories alike.
import { closeSync, existsSync, readFileSync, statSync } from 'node:fs';
import { copyFile, link, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { RlstreamError } from '../errors.ts';
import { hfConfigOf } from './model-config.ts';
import { openForRead, readHeader, readTensorInto, writeSafetensors, type Tensor, type TensorEntry, type TensorMap, type WriteDtype } from './safetensors.ts';

export const INDEX_FILE = 'model.safetensors.index.json';
export const SINGLE_FILE = 'model.safetensors';
/** Files of a model directory that belong to its tokenizer and chat template (copied by export as they are). */
export const TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja', 'chat_template.json', 'tokenizer.model', 'vocab.json', 'merges.txt', 'added_tokens.json'];
/** A shard's name: what transformers writes, and all a weight_map may name (no paths: nothing outside the directory). */
const SHARD_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors$/;

function bad(source: string, message: string): RlstreamError {
  return new RlstreamError('WEIGHTS_FORMAT', `${source}: ${message}`);
}

/** One tensor of an opened weight source: the file it is in (an fd of the source) and its header entry. */
export interface WeightEntry {
  fd: number;
  path: string;
  entry: TensorEntry;
}

export interface WeightSource {
  /** What was opened (the file, or the directory). */
  source: string;
  tensors: Map<string, WeightEntry>;
  /** The __metadata__ of the file (the first shard's, for a directory). */
  metadata: Record<string, string>;
  /** Reads one tensor into the caller's float32 memory (BF16 / F16 converted). */
  read(name: string, out: Float32Array): void;
  close(): void;
}

/** Whether `path` is a model directory with weights (an index, or model.safetensors). */
export function isModelDir(path: string): boolean {
  try {
    return statSync(path).isDirectory() && (existsSync(join(path, INDEX_FILE)) || existsSync(join(path, SINGLE_FILE)));
  } catch {
    return false;
  }
}

/** The shard files an index names, checked: tensor → file, every file a plain name inside the directory. */
export function readIndex(dir: string): { weightMap: Map<string, string>; totalSize: number | null } {
  const path = join(dir, INDEX_FILE);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `${path}: ${(err as Error).message}`, { cause: err });
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw bad(path, 'is not a JSON object');
  const wm = (raw as Record<string, unknown>)['weight_map'];
  if (wm === null || typeof wm !== 'object' || Array.isArray(wm)) throw bad(path, 'weight_map must be an object { tensor name: shard file }');
  const weightMap = new Map<string, string>();
  for (const [name, file] of Object.entries(wm as Record<string, unknown>)) {
    if (typeof file !== 'string' || !SHARD_NAME.test(file) || file.includes('..'))
      throw bad(path, `weight_map["${name}"] = ${JSON.stringify(file)} is not a shard file name in the directory (letters, digits, . _ -, ending .safetensors)`);
    weightMap.set(name, file);
  }
  if (weightMap.size === 0) throw bad(path, 'weight_map is empty');
  const meta = (raw as Record<string, unknown>)['metadata'];
  const ts = meta && typeof meta === 'object' ? (meta as Record<string, unknown>)['total_size'] : undefined;
  return { weightMap, totalSize: typeof ts === 'number' ? ts : null };
}

function single(path: string, source: string): WeightSource {
  const fd = openForRead(path);
  try {
    const { tensors, metadata } = readHeader(fd, path);
    const m = new Map<string, WeightEntry>();
    for (const [n, e] of tensors) m.set(n, { fd, path, entry: e });
    return sourceOf(source, m, metadata, [fd]);
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

function sourceOf(source: string, tensors: Map<string, WeightEntry>, metadata: Record<string, string>, fds: number[]): WeightSource {
  return {
    source,
    tensors,
    metadata,
    read(name, out) {
      const w = tensors.get(name);
      if (!w) throw bad(source, `tensor ${name} is missing`);
      readTensorInto(w.fd, w.path, name, w.entry, out);
    },
    close() {
      for (const fd of fds) closeSync(fd);
    },
  };
}

/**
 * Opens weights for reading tensor by tensor: a .safetensors file, or a model directory (the index's shards, else
 * model.safetensors). A directory's index must match its shards exactly: every tensor it names is in the shard it
 * names, no shard holds a tensor the index puts elsewhere or omits, and total_size (where given) is the tensors'
 * bytes. Throws WEIGHTS_FORMAT naming the file and the tensor.
 */
export function openWeights(path: string): WeightSource {
  let isDir = false;
  try {
    isDir = statSync(path).isDirectory();
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `cannot open weights ${path}: ${(err as Error).message}`, { cause: err });
  }
  if (!isDir) return single(path, path);
  if (!existsSync(join(path, INDEX_FILE))) {
    if (existsSync(join(path, SINGLE_FILE))) return single(join(path, SINGLE_FILE), path);
    throw bad(path, `a model directory needs ${SINGLE_FILE} or ${INDEX_FILE}`);
  }
  const { weightMap, totalSize } = readIndex(path);
  const shards = [...new Set(weightMap.values())].sort();
  const fds: number[] = [];
  const tensors = new Map<string, WeightEntry>();
  let metadata: Record<string, string> = {};
  try {
    let bytes = 0;
    for (const shard of shards) {
      const file = join(path, shard);
      const fd = openForRead(file);
      fds.push(fd);
      const h = readHeader(fd, file);
      if (shard === shards[0]) metadata = h.metadata;
      for (const [name, e] of h.tensors) {
        const want = weightMap.get(name);
        if (want === undefined) throw bad(file, `holds tensor ${name}, which ${INDEX_FILE} does not name`);
        if (want !== shard) throw bad(file, `holds tensor ${name}, which ${INDEX_FILE} puts in ${want}`);
        tensors.set(name, { fd, path: file, entry: e });
        bytes += e.end - e.begin;
      }
    }
    for (const [name, shard] of weightMap) if (!tensors.has(name)) throw bad(join(path, shard), `lacks tensor ${name}, which ${INDEX_FILE} puts there`);
    if (totalSize !== null && totalSize !== bytes) throw bad(join(path, INDEX_FILE), `metadata.total_size ${totalSize} is not the ${bytes} bytes of the shards' tensors`);
  } catch (err) {
    for (const fd of fds) closeSync(fd);
    throw err;
  }
  return sourceOf(path, tensors, metadata, fds);
}

/** Every tensor of a weight source as float32 (for callers that hold a whole model, as the ONNX policy does). */
export function readWeights(path: string): TensorMap {
  const w = openWeights(path);
  try {
    const out: TensorMap = new Map();
    for (const [name, { entry }] of w.tensors) {
      const data = new Float32Array(entry.shape.reduce((a, b) => a * b, 1));
      w.read(name, data);
      out.set(name, { shape: entry.shape, data });
    }
    return out;
  } finally {
    w.close();
  }
}

export interface HfDirOptions {
  /** config.json's text (written with torch_dtype / dtype set to what the weights hold; see hfConfigOf). */
  configJson: string;
  /** What the weights hold (for a linked file: what it was written in). */
  dtype: WriteDtype;
  /** Largest shard in bytes (transformers' max_shard_size; default 5 GB, as save_pretrained's default). */
  maxShardBytes?: number;
  /** A directory whose tokenizer files (TOKENIZER_FILES that exist there) are copied. */
  tokenizerDir?: string | null;
  /** generation_config.json's object (absent: none written). */
  generationConfig?: Record<string, unknown> | null;
  /** Replace `dir` if it exists (default: refuse). */
  force?: boolean;
  /** safetensors __metadata__ of every shard (default { format: 'pt' }, what transformers expects). */
  metadata?: Record<string, string>;
}

/** Shards in transformers' order and names: tensors in name order, a new shard whenever the next would overflow. */
export function planShards(tensors: [string, Tensor][], dtype: WriteDtype, maxShardBytes: number): { file: string; names: string[]; bytes: number }[] {
  const width = dtype === 'BF16' ? 2 : 4;
  const sorted = [...tensors].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const groups: { names: string[]; bytes: number }[] = [];
  let cur: { names: string[]; bytes: number } | null = null;
  for (const [name, t] of sorted) {
    const b = t.data.length * width;
    if (!cur || (cur.bytes + b > maxShardBytes && cur.names.length > 0)) {
      cur = { names: [], bytes: 0 };
      groups.push(cur);
    }
    cur.names.push(name);
    cur.bytes += b;
  }
  const n = groups.length;
  const pad = (i: number) => String(i).padStart(5, '0');
  return groups.map((g, i) => ({ ...g, file: n === 1 ? SINGLE_FILE : `model-${pad(i + 1)}-of-${pad(n)}.safetensors` }));
}

/**
 * Writes a Hugging Face model directory: config.json, the weights (one model.safetensors, or shards and the index),
 * generation_config.json and the tokenizer files. Written into a temporary directory beside `dir` and renamed into
 * place, so `dir` is never half written; an existing `dir` is refused unless `force`.
 */
export async function writeHfDir(dir: string, weights: { tensors: Iterable<[string, Tensor]> } | { file: string }, o: HfDirOptions): Promise<void> {
  if (existsSync(dir) && !o.force) throw new RlstreamError('CONFIG_INVALID', `${dir} exists; choose another directory or pass --force to replace it`);
  await mkdir(dirname(dir), { recursive: true });
  const tmp = join(dirname(dir), `.${basename(dir)}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`);
  await mkdir(tmp);
  try {
    if ('file' in weights) {
      // one safetensors file as model.safetensors, hard-linked (copied across file systems): a weight-sync
      // directory per version costs no disk
      await link(weights.file, join(tmp, SINGLE_FILE)).catch(async (err: NodeJS.ErrnoException) => {
        if (err.code === 'EXDEV' || err.code === 'EPERM') await copyFile(weights.file, join(tmp, SINGLE_FILE));
        else throw err;
      });
    } else {
      const list = [...weights.tensors];
      const plan = planShards(list, o.dtype, o.maxShardBytes ?? 5e9);
      const byName = new Map(list);
      const meta = o.metadata ?? { format: 'pt' };
      for (const s of plan) await writeSafetensors(join(tmp, s.file), s.names.map((n) => [n, byName.get(n)!] as [string, Tensor]), meta, o.dtype);
      if (plan.length > 1) {
        const weight_map: Record<string, string> = {};
        for (const s of plan) for (const n of s.names) weight_map[n] = s.file;
        const total_size = plan.reduce((a, s) => a + s.bytes, 0);
        await writeFile(join(tmp, INDEX_FILE), JSON.stringify({ metadata: { total_size }, weight_map }, null, 2) + '\n');
      }
    }
    // config.json as the model came (every key kept), its family named as rlstream runs it, its dtype the files'
    const cfg = hfConfigOf(o.configJson);
    const dt = o.dtype === 'BF16' ? 'bfloat16' : 'float32';
    if ('dtype' in cfg) cfg['dtype'] = dt;
    cfg['torch_dtype'] = dt;
    await writeFile(join(tmp, 'config.json'), JSON.stringify(cfg, null, 2) + '\n');
    if (o.generationConfig) await writeFile(join(tmp, 'generation_config.json'), JSON.stringify(o.generationConfig, null, 2) + '\n');
    if (o.tokenizerDir) for (const f of TOKENIZER_FILES) if (existsSync(join(o.tokenizerDir, f))) await copyFile(join(o.tokenizerDir, f), join(tmp, f));
    if (existsSync(dir)) await rm(dir, { recursive: true, force: true });
    await rename(tmp, dir);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}


/** What a model directory's generation_config.json says about sampling: its stop ids and sampling defaults. */
export interface GenerationDefaults {
  /** eos_token_id (a number or a list): every id ends a generation. */
  eosTokenIds: number[];
  temperature: number | null;
  topP: number | null;
  topK: number | null;
  /** The file read, or null where the directory has none. */
  source: string | null;
}

/**
 * Reads `<dir>/generation_config.json` where it exists (a missing file gives no defaults). A value of the wrong
 * type is an error naming the file and the key, not a silent default.
 */
export function readGenerationDefaults(dir: string): GenerationDefaults {
  const path = join(dir, 'generation_config.json');
  const none: GenerationDefaults = { eosTokenIds: [], temperature: null, topP: null, topK: null, source: null };
  if (!existsSync(path)) return none;
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new RlstreamError('CONFIG_INVALID', `${path}: ${(err as Error).message}`, { cause: err });
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new RlstreamError('CONFIG_INVALID', `${path}: not a JSON object`);
  const o = raw as Record<string, unknown>;
  const fail = (k: string, what: string): never => {
    throw new RlstreamError('CONFIG_INVALID', `${path}: ${k} ${what}, got ${JSON.stringify(o[k])}`);
  };
  const eos = o['eos_token_id'];
  const ids = eos === undefined || eos === null ? [] : Array.isArray(eos) ? eos : [eos];
  for (const id of ids) if (typeof id !== 'number' || !Number.isInteger(id) || id < 0) fail('eos_token_id', 'must be a token id or a list of them');
  const optNum = (k: string, ok: (x: number) => boolean, what: string): number | null => {
    const v = o[k];
    if (v === undefined || v === null) return null;
    if (typeof v !== 'number' || !ok(v)) fail(k, what);
    return v as number;
  };
  // do_sample false means greedy decoding whatever temperature says (transformers' rule)
  const greedy = o['do_sample'] === false;
  return {
    eosTokenIds: ids as number[],
    temperature: greedy ? 0 : optNum('temperature', (x) => x >= 0, 'must be a number >= 0'),
    topP: greedy ? null : optNum('top_p', (x) => x > 0 && x <= 1, 'must be in (0, 1]'),
    topK: greedy ? null : optNum('top_k', (x) => Number.isInteger(x) && x >= 0, 'must be an integer >= 0'),
    source: path,
  };
}

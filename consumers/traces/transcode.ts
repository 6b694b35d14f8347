// Avro record bytes → RowBinary rows in native code, without building event objects: the trace sink's fast
// path for the high-volume events. Decoding with avsc, mapping to a row object (rows.ts) and encoding it (the
// table codec) dominate a drain in JS, and the cost is per array item whatever JS does, so the loop over the
// items runs natively (measurements in docs/benchmarks.md).
//
// Here a transcoder is compiled from an event's writer schema, the table's columns (DESCRIBE TABLE, as the
// codec has them) and a plan naming each column's source in the event (below, beside rows.ts's mapping, which
// it must match: test/traces/transcode.test.ts checks byte for byte that both paths give the same rows). The
// result is a program of int32 words for the native interpreter (layout in native/src/transcode.h). It
// handles the common case exactly and declines anything else (a value the column's rules would convert, a
// damaged record); the caller then takes the general path (decode, rowsOf, codec), which applies those rules
// or reports the record, so both paths always store the same thing.
import { nativeAvailable } from '../../native/addon.ts';
import { transcodeRecords } from '../../native/codecs.ts';
import { HEADER } from '../../core/serde/events.ts';
import type { EventName } from '../../schemas/index.ts';
import { bare, inner, withoutTimeZone, type ColumnSpec, type RowBinaryBuffer } from '../../core/traces/rowbinary.ts';
import type { TraceTable } from '../../core/traces/store.ts';

/**
 * Where a column's value comes from: a field (by path), an array's length, one field of each record of an
 * array, or a field as JSON (JSON.stringify of the decoded value, as rowsOf writes tools_json).
 */
export type Source = { path: string[] } | { lengthOf: string[] } | { each: string[]; field: string } | { json: string[] };

export interface Plan {
  table: TraceTable;
  columns: Record<string, Source>;
}

const f = (...path: string[]): Source => ({ path });
const len = (...path: string[]): Source => ({ lengthOf: path });
const each = (field: string, ...path: string[]): Source => ({ each: path, field });
const json = (...path: string[]): Source => ({ json: path });
const meta = { event_id: f('event_id'), time: f('time_ms'), _version: f('time_ms') };

/**
 * The events that go through transcoders, and their rows: the same mapping as rowsOf (rows.ts). Booleans,
 * nulls in strings and arrays, and null|boolean unions need no plan of their own: the column rules turn them
 * into 1/0, '' and [] exactly as rowsOf's `? 1 : 0`, `?? ''` and `?? []` do.
 */
export const PLANS: Partial<Record<EventName, Plan>> = {
  TrajectoryStarted: {
    table: 'trajectory_starts',
    columns: {
      ...Object.fromEntries(
        ['run_id', 'trajectory_id', 'group_id', 'sample_index', 'group_size', 'agent_name', 'data_source', 'prompt_token_ids', 'policy_version', 'ground_truth', 'extra_info_json'].map((c) => [c, f(c)]),
      ),
      dataset_name: f('dataset', 'name'),
      split: f('dataset', 'split'),
      dataset_index: f('dataset', 'index'),
      prompt_roles: each('role', 'prompt_messages'),
      prompt_contents: each('content', 'prompt_messages'),
      tool_names: each('name', 'tools'),
      tools_json: json('tools'),
      sampling_json: json('sampling'),
      ...meta,
    },
  },
  TurnCompleted: {
    table: 'turns',
    columns: {
      run_id: f('run_id'),
      trajectory_id: f('trajectory_id'),
      group_id: f('group_id'),
      turn_index: f('turn_index'),
      role: f('role'),
      token_ids: f('token_ids'),
      logprobs: f('logprobs'),
      loss_mask: f('response_mask'),
      num_tokens: len('token_ids'),
      text: f('text'),
      tool_call_ids: each('id', 'tool_calls'),
      tool_call_names: each('name', 'tool_calls'),
      tool_call_arguments: each('arguments_json', 'tool_calls'),
      tool_call_parse_error: f('tool_call_parse_error'),
      finish_reason: f('finish_reason'),
      policy_version: f('policy_version'),
      latency_ms: f('latency_ms'),
      server: f('server'),
      tokenization_mismatch: f('tokenization_mismatch'),
      ...meta,
    },
  },
  ToolCallCompleted: {
    table: 'tool_calls',
    columns: {
      run_id: f('run_id'),
      trajectory_id: f('trajectory_id'),
      group_id: f('group_id'),
      turn_index: f('turn_index'),
      call_id: f('call_id'),
      tool_name: f('tool_name'),
      arguments_json: f('arguments_json'),
      status: f('status'),
      result_text: f('result_text'),
      latency_ms: f('latency_ms'),
      reward: f('reward'),
      metric_names: each('name', 'metrics'),
      metric_values: each('value', 'metrics'),
      ...meta,
    },
  },
  TrajectoryCompleted: {
    table: 'trajectories',
    columns: {
      ...Object.fromEntries(
        [
          ...['run_id', 'trajectory_id', 'group_id', 'sample_index', 'group_size', 'agent_name', 'data_source', 'ground_truth'],
          ...['prompt_ids', 'response_ids', 'response_mask', 'response_logprobs', 'response_policy_versions', 'turn_offsets'],
          ...['turn_roles', 'response_text', 'num_turns', 'num_tool_calls', 'num_tool_errors', 'num_invalid_tool_calls'],
          ...['termination', 'min_policy_version', 'max_policy_version', 'generation_ms', 'tool_ms'],
        ].map((c) => [c, f('trajectory', c)]),
      ),
      dataset_name: f('trajectory', 'dataset', 'name'),
      split: f('trajectory', 'dataset', 'split'),
      dataset_index: f('trajectory', 'dataset', 'index'),
      started: f('trajectory', 'started_ms'),
      completed: f('trajectory', 'completed_ms'),
      ...meta,
    },
  },
  RewardedTrajectory: {
    table: 'rewards',
    columns: {
      run_id: f('trajectory', 'run_id'),
      trajectory_id: f('trajectory', 'trajectory_id'),
      group_id: f('trajectory', 'group_id'),
      reward_fn: f('reward', 'reward_fn'),
      score: f('reward', 'score'),
      correct: f('reward', 'correct'),
      component_names: each('name', 'reward', 'components'),
      component_values: each('value', 'reward', 'components'),
      token_rewards: f('reward', 'token_rewards'),
      agent_name: f('trajectory', 'agent_name'),
      data_source: f('trajectory', 'data_source'),
      split: f('trajectory', 'dataset', 'split'),
      num_turns: f('trajectory', 'num_turns'),
      response_tokens: len('trajectory', 'response_ids'),
      min_policy_version: f('trajectory', 'min_policy_version'),
      max_policy_version: f('trajectory', 'max_policy_version'),
      ...meta,
    },
  },
  AdvantagedTrajectory: {
    table: 'advantages',
    columns: {
      run_id: f('trajectory', 'run_id'),
      trajectory_id: f('trajectory', 'trajectory_id'),
      group_id: f('trajectory', 'group_id'),
      estimator: f('estimator'),
      reward_fn: f('reward', 'reward_fn'),
      score: f('reward', 'score'),
      advantages: f('advantages'),
      returns: f('returns'),
      group_members: f('group', 'group_members'),
      expected_size: f('group', 'expected_size'),
      reward_mean: f('group', 'reward_mean'),
      reward_std: f('group', 'reward_std'),
      partial: f('group', 'partial'),
      split: f('trajectory', 'dataset', 'split'),
      min_policy_version: f('trajectory', 'min_policy_version'),
      max_policy_version: f('trajectory', 'max_policy_version'),
      ...meta,
    },
  },
};

// ---- The program (word layout: native/src/transcode.h) ----------------------------------------------------------

const MAGIC = 0x52425431;
const HEADER_WORDS = 11;
const KIND = { null: 0, boolean: 1, int: 2, long: 3, float: 4, double: 5, string: 6, bytes: 7, enum: 8, fixed: 9, array: 10, map: 11, union: 12, record: 13 } as const;
type Kind = keyof typeof KIND;
const MODE = { value: 0, length: 1, each: 2, json: 3 } as const;
const TARGET: Record<string, number> = { UInt8: 1, Int8: 2, UInt16: 3, Int16: 4, UInt32: 5, Int32: 6, Int64: 7, 'DateTime64(3)': 7, UInt64: 8, Float32: 9, Float64: 10, DateTime: 11, String: 12 };
const STRING_TARGET = 12;
const DATETIME_TARGET = 11;
const NULLABLE = 1;
const ARRAY = 2;

/** A schema node as the program stores it (children are node indices). */
interface Node {
  kind: Kind;
  a: number;
  b: number;
  /** Records: the symbol index of the first field name (names are symbols, in field order); else 0. */
  c?: number;
  /** Record fields by name (records only). */
  fields?: { name: string; node: number }[];
  /** Union branches / array items (for the compile-time checks). */
  children?: number[];
}

class Unsupported extends Error {}

/** The writer schema as flat nodes; named types are defined at first use and referenced by (full) name later. */
class SchemaNodes {
  readonly nodes: Node[] = [];
  readonly refs: number[] = [];
  readonly symbols: Buffer[] = [];
  private readonly named = new Map<string, number>();

  parse(s: unknown, ns: string | undefined): number {
    const fullName = (name: string, space: string | undefined) => (name.includes('.') || !space ? name : `${space}.${name}`);
    if (typeof s === 'string') {
      if (s in KIND && !['enum', 'fixed', 'array', 'map', 'union', 'record'].includes(s)) return this.add({ kind: s as Kind, a: 0, b: 0 });
      const n = this.named.get(fullName(s, ns)) ?? this.named.get(s);
      if (n === undefined) throw new Unsupported(`unknown type ${s}`);
      return n;
    }
    if (Array.isArray(s)) {
      const branches = s.map((b) => this.parse(b, ns));
      const at = this.refs.length;
      this.refs.push(...branches);
      return this.add({ kind: 'union', a: at, b: branches.length, children: branches });
    }
    if (typeof s !== 'object' || s === null) throw new Unsupported('not a schema');
    const o = s as Record<string, unknown>;
    const t = o['type'];
    if (typeof t === 'object') return this.parse(t, ns);
    if (t === 'array' || t === 'map') {
      const item = this.parse(o[t === 'array' ? 'items' : 'values'], ns);
      return this.add({ kind: t, a: item, b: 0, children: [item] });
    }
    if (typeof t !== 'string') throw new Unsupported('a type without a name');
    if (!['enum', 'fixed', 'record', 'error'].includes(t)) return this.parse(t, ns);
    const name = fullName(String(o['name']), typeof o['namespace'] === 'string' ? o['namespace'] : ns);
    const inner = name.includes('.') ? name.slice(0, name.lastIndexOf('.')) : ns;
    if (t === 'enum') {
      const at = this.symbols.length;
      const symbols = o['symbols'] as string[];
      this.symbols.push(...symbols.map((x) => Buffer.from(x, 'utf8')));
      return this.define(name, { kind: 'enum', a: at, b: symbols.length });
    }
    if (t === 'fixed') return this.define(name, { kind: 'fixed', a: Number(o['size']), b: 0 });
    // A record: defined before its fields are parsed (they may refer to it).
    const n = this.define(name, { kind: 'record', a: 0, b: 0, fields: [] });
    const fields = (o['fields'] as { name: string; type: unknown }[]).map((fld) => ({ name: fld.name, node: this.parse(fld.type, inner) }));
    const rec = this.nodes[n]!;
    rec.a = this.refs.length;
    rec.b = fields.length;
    rec.c = this.symbols.length;
    rec.fields = fields;
    this.refs.push(...fields.map((x) => x.node));
    this.symbols.push(...fields.map((x) => Buffer.from(x.name, 'utf8')));
    return n;
  }

  private add(node: Node): number {
    this.nodes.push(node);
    return this.nodes.length - 1;
  }

  private define(name: string, node: Node): number {
    const n = this.add(node);
    this.named.set(name, n);
    return n;
  }
}

/** A value's node once a union (if any) is resolved: the one non-null branch, or null when there are several. */
function valueNode(s: SchemaNodes, n: number): number | null {
  const node = s.nodes[n]!;
  if (node.kind !== 'union') return n;
  const branches = node.children!.filter((b) => s.nodes[b]!.kind !== 'null');
  return branches.length === 1 && s.nodes[branches[0]!]!.kind !== 'union' ? branches[0]! : null;
}

/** Whether JSON.stringify of a value of node n is written by the native JSON writer (no bytes, fixed or maps). */
function jsonable(s: SchemaNodes, n: number, seen = new Set<number>()): boolean {
  if (seen.has(n)) return true;
  seen.add(n);
  const node = s.nodes[n]!;
  if (node.kind === 'bytes' || node.kind === 'fixed' || node.kind === 'map') return false;
  if (node.kind === 'record') return node.fields!.every((x) => jsonable(s, x.node, seen));
  return (node.children ?? []).every((x) => jsonable(s, x, seen));
}

/** Whether a value of node kind `k` goes into a column of `target` without the general path's conversions. */
function compatible(k: Kind, target: number): boolean {
  if (target === STRING_TARGET) return k === 'string' || k === 'enum';
  if (target === DATETIME_TARGET) return k === 'int' || k === 'long';
  if (target === TARGET['Float32'] || target === TARGET['Float64']) return ['int', 'long', 'float', 'double', 'boolean'].includes(k);
  return k === 'int' || k === 'long' || k === 'boolean';
}

/** A column type as (target, flags), or null when the transcoder has no writer for it. */
function columnTarget(type: string): { target: number; flags: number } | null {
  type = bare(withoutTimeZone(type));
  const nullable = inner(type, 'Nullable');
  const arr = inner(type, 'Array');
  const scalar = bare(nullable ?? arr ?? type);
  const target = TARGET[scalar];
  if (target === undefined) return null;
  return { target, flags: (nullable !== null ? NULLABLE : 0) | (arr !== null ? ARRAY : 0) };
}

export interface Transcoder {
  table: TraceTable;
  /**
   * Appends the rows of the records whose status is set to 1 (`status` has one byte per record; 0 where the
   * record declined and must take the general path). Returns the rows written.
   */
  append(records: readonly Buffer[], out: RowBinaryBuffer, status: Uint8Array): number;
  /**
   * The same for `count` records lying in one buffer, record i at byte starts[i] of `base` with lengths[i]
   * bytes (a log chunk's records, read in place).
   */
  appendSpans(base: Uint8Array, starts: Float64Array, lengths: Int32Array, count: number, out: RowBinaryBuffer, status: Uint8Array): number;
}

/**
 * A transcoder for records of this writer schema into the table with these columns, following `plan`; null
 * when some column has no source in the plan, a source/column pair this fast path does not handle, or the
 * native addon is not built.
 */
export function compileTranscoder(writerSchema: unknown, plan: Plan, columns: readonly ColumnSpec[]): Transcoder | null {
  if (!nativeAvailable()) return null; // the addon is not built: the general path does it all
  const s = new SchemaNodes();
  let root: number;
  try {
    root = s.parse(writerSchema, undefined);
  } catch (err) {
    if (err instanceof Unsupported) return null;
    throw err;
  }
  if (s.nodes[root]!.kind !== 'record') return null;
  // Leaves: the record's fields in encoding order, nested records flattened (Avro writes their fields inline),
  // except records that a column takes whole (as JSON).
  const whole = new Set(Object.values(plan.columns).flatMap((src) => ('json' in src ? [src.json.join('.')] : [])));
  const leaves: number[] = [];
  const leafOf = new Map<string, number>();
  const flatten = (rec: number, prefix: string, depth: number): void => {
    for (const fld of s.nodes[rec]!.fields!) {
      const path = prefix + fld.name;
      if (s.nodes[fld.node]!.kind === 'record' && depth < 8 && !whole.has(path)) flatten(fld.node, path + '.', depth + 1);
      else {
        leafOf.set(path, leaves.length);
        leaves.push(fld.node);
      }
    }
  };
  flatten(root, '', 0);

  const ops: number[] = [];
  for (const col of columns) {
    const src = plan.columns[col.name];
    const ct = columnTarget(col.type);
    if (!src || !ct) return null;
    const path = ('path' in src ? src.path : 'lengthOf' in src ? src.lengthOf : 'each' in src ? src.each : src.json).join('.');
    const leaf = leafOf.get(path);
    if (leaf === undefined) return null;
    const v = 'json' in src ? leaves[leaf]! : valueNode(s, leaves[leaf]!);
    if (v === null) return null;
    const node = s.nodes[v]!;
    let mode: number = MODE.value;
    let field = 0;
    if ('json' in src) {
      if (ct.target !== STRING_TARGET || ct.flags !== 0 || !jsonable(s, leaves[leaf]!)) return null;
      mode = MODE.json;
    } else if ('lengthOf' in src) {
      if (node.kind !== 'array' || ct.flags !== 0 || ct.target === STRING_TARGET) return null;
      mode = MODE.length;
    } else if ('each' in src) {
      const rec = node.kind === 'array' ? s.nodes[node.a]! : null;
      field = rec?.kind === 'record' ? rec.fields!.findIndex((x) => x.name === src.field) : -1;
      if (field < 0 || ct.flags !== ARRAY) return null;
      const item = s.nodes[rec!.fields![field]!.node]!;
      if (!compatible(item.kind, ct.target)) return null;
      mode = MODE.each;
    } else if (ct.flags & ARRAY) {
      if (node.kind !== 'array' || !compatible(s.nodes[node.a]!.kind, ct.target)) return null;
    } else if (!compatible(node.kind, ct.target)) return null;
    ops.push(mode, leaf, ct.target, ct.flags, field);
  }

  const symbolBytes = Buffer.concat(s.symbols);
  const symbolWords: number[] = [];
  let at = 0;
  for (const b of s.symbols) {
    symbolWords.push(at, b.length);
    at += b.length;
  }
  const sections = [s.nodes.flatMap((n) => [KIND[n.kind], n.a, n.b, n.c ?? 0]), s.refs, leaves, ops, symbolWords];
  const program = new Int32Array(HEADER_WORDS + sections.reduce((n, x) => n + x.length, 0));
  program[0] = MAGIC;
  let offset = HEADER_WORDS;
  sections.forEach((words, i) => {
    program[1 + 2 * i] = offset;
    program[2 + 2 * i] = i === 0 ? s.nodes.length : i === 3 ? columns.length : i === 4 ? s.symbols.length : words.length;
    program.set(words, offset);
    offset += words.length;
  });

  const state = new Float64Array(2);
  let starts = new Float64Array(256);
  let lengths = new Int32Array(256);
  const bases = new WeakMap<ArrayBufferLike, Uint8Array>();
  // Records [from, to) of base: one native call, again from where out ran out of room after growing it.
  const run = (base: Uint8Array, at: Float64Array, len: Int32Array, from: number, to: number, out: RowBinaryBuffer, status: Uint8Array): void => {
    for (let i = from; i < to; ) {
      i = transcodeRecords(program, symbolBytes, base, at, len, i, to, HEADER, out.buf, state, status);
      out.pos = state[0]!;
      if (i < to) out.ensure(out.buf.length - out.pos + 1);
    }
  };
  return {
    table: plan.table,
    append(records, out, status) {
      const n = records.length;
      if (starts.length < n) {
        starts = new Float64Array(Math.max(n, 2 * starts.length));
        lengths = new Int32Array(starts.length);
      }
      state[0] = out.pos;
      state[1] = 0;
      // One native call per run of records that share an ArrayBuffer (a log read's chunk holds thousands).
      for (let i = 0; i < n; ) {
        const ab = records[i]!.buffer;
        let to = i;
        for (; to < n && records[to]!.buffer === ab; to++) {
          starts[to] = records[to]!.byteOffset;
          lengths[to] = records[to]!.length;
        }
        let base = bases.get(ab);
        if (!base) bases.set(ab, (base = new Uint8Array(ab)));
        run(base, starts, lengths, i, to, out, status);
        i = to;
      }
      out.rows += state[1]!;
      return state[1]!;
    },
    appendSpans(base, at, len, count, out, status) {
      state[0] = out.pos;
      state[1] = 0;
      run(base, at, len, 0, count, out, status);
      out.rows += state[1]!;
      return state[1]!;
    },
  };
}

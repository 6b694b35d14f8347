// Renders query results for people: a plain text table, and one trajectory turn by turn (prompt, each turn's
// text, loss mask as runs, tool calls and their results). Token ids become text only through an optional
// decode function (a tokenizer is the caller's business); the stored text is shown otherwise.
import { runNamed, type NamedQueries } from './queries.ts';
import type { QueryResult, Row, TraceStore } from './store.ts';
import { RlstreamError } from '../errors.ts';

function cell(v: unknown, max = 60): string {
  const s = v === null || v === undefined ? '' : typeof v === 'string' ? v : JSON.stringify(v);
  const flat = s.replace(/\s+/g, ' ');
  return flat.length > max ? flat.slice(0, max - 1) + '…' : flat;
}

/** A fixed-width text table of a result (cells cut at `max` characters). */
export function renderTable(result: QueryResult, max = 60): string {
  const names = result.columns.length > 0 ? result.columns.map((c) => c.name) : Object.keys(result.rows[0] ?? {});
  const cells = result.rows.map((r) => names.map((n) => cell(r[n], max)));
  const widths = names.map((n, i) => Math.max(n.length, ...cells.map((c) => c[i]!.length)));
  const line = (vals: string[]) => vals.map((v, i) => v.padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(names), line(widths.map((w) => '-'.repeat(w))), ...cells.map(line), `(${result.rows.length} rows)`].join('\n');
}

/** A mask as runs: [1,1,1,0,0] → "1×3 0×2". */
function maskRuns(mask: number[]): string {
  const out: string[] = [];
  let i = 0;
  while (i < mask.length) {
    let j = i;
    while (j < mask.length && mask[j] === mask[i]) j++;
    out.push(`${mask[i]}×${j - i}`);
    i = j;
  }
  return out.join(' ') || '(empty)';
}

export type Decode = (tokenIds: number[]) => string;

export interface RenderOptions {
  run?: string;
  decode?: Decode;
}

function arr<T>(v: unknown): T[] {
  return Array.isArray(v) ? (v as T[]) : [];
}

/** ", policy v3"; nothing for a turn no policy generated (a tool's or a user's turn records -1). */
function version(v: unknown): string {
  const n = Number(v);
  return Number.isFinite(n) && n >= 0 ? `, policy v${n}` : '';
}

/** ", 1702.7 ms": a latency to a tenth of a millisecond (the store keeps a float's every digit). */
function ms(v: unknown): string {
  const n = Number(v);
  return v === null || v === undefined || !Number.isFinite(n) ? '' : `, ${n.toFixed(1)} ms`;
}

/** One trajectory as text, turn by turn. */
export async function renderTrajectory(store: TraceStore | NamedQueries, trajectoryId: string, options: RenderOptions = {}): Promise<string> {
  const params = { id: trajectoryId, run: options.run ?? '' };
  const named = (name: string) => ('runNamed' in store ? store.runNamed(name, params) : runNamed(store, name, params));
  const [head, turns] = await Promise.all([named('trajectory_prompt'), named('trajectory')]);
  const p: Row | undefined = head.rows[0];
  if (!p && turns.rows.length === 0) throw new RlstreamError('INPUT_INVALID', `no trajectory ${trajectoryId} in ${store.target}`);
  const lines: string[] = [];
  if (p) {
    lines.push(
      `trajectory ${trajectoryId}  run ${String(p['run_id'])}  group ${String(p['group_id'])}#${String(p['sample_index'])}  ${String(p['data_source'])}/${String(p['split'])}  policy v${String(p['policy_version'])}`,
    );
    // The loss mask says what a step would train on; a trajectory of another split is never trained at all.
    if (p['split'] !== undefined && p['split'] !== null && p['split'] !== '' && p['split'] !== 'train') lines.push(`${String(p['split'])} split: evaluation only, never trained`);
    lines.push(`outcome: ${String(p['termination'] || '(not completed)')}  reward ${String(p['score'] ?? '-')}  correct ${String(p['correct'] ?? '-')}  ground truth ${JSON.stringify(p['ground_truth'])}`);
    const roles = arr<string>(p['prompt_roles']);
    const contents = arr<string>(p['prompt_contents']);
    roles.forEach((r, i) => lines.push(`[prompt ${r}] ${contents[i] ?? ''}`));
    if (arr<string>(p['tool_names']).length > 0) lines.push(`tools offered: ${arr<string>(p['tool_names']).join(', ')}`);
  }
  for (const t of turns.rows) {
    const ids = arr<number>(t['token_ids']);
    const mask = arr<number>(t['response_mask']);
    lines.push(
      `--- turn ${String(t['turn_index'])} ${String(t['role'])}: ${ids.length} tokens, ${String(t['trained_tokens'])} in the loss mask${version(t['policy_version'])}${ms(t['latency_ms'])}${t['finish_reason'] ? `, finish ${String(t['finish_reason'])}` : ''}${t['tokenization_mismatch'] ? ', TOKEN/TEXT MISMATCH' : ''}`,
    );
    lines.push(String(t['text']));
    if (options.decode) {
      const decoded = options.decode(ids);
      if (decoded !== t['text']) lines.push(`  decoded tokens differ from text: ${JSON.stringify(decoded)}`);
    }
    lines.push(`  mask: ${maskRuns(mask)}`);
    if (t['tool_call_parse_error']) lines.push(`  tool call parse error: ${String(t['tool_call_parse_error'])}`);
    const names = arr<string>(t['tool_call_names']);
    const args = arr<string>(t['tool_call_arguments']);
    const status = arr<string>(t['tool_status']);
    const results = arr<string>(t['tool_results']);
    const lat = arr<number>(t['tool_latency_ms']);
    names.forEach((n, i) => lines.push(`  call ${n}(${args[i] ?? ''}) → ${status[i] ?? 'no result'}${lat[i] !== undefined ? ` in${ms(lat[i]).slice(1)}` : ''}: ${cell(results[i] ?? '', 200)}`));
  }
  return lines.join('\n');
}

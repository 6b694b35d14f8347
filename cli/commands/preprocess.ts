// `rlstream preprocess gsm8k --input train.jsonl|train.parquet --output rows.parquet|rows.jsonl [--split train]
// [--limit N] [--agent-name tool_agent]`: raw GSM8K records ({question, answer}, as JSONL or as the dataset's
// own Parquet) → the rows verl's GSM8K tool examples write (producers/dataset/verl-gsm8k.ts), as Parquet when
// the output ends in .parquet, else JSONL. The output appears whole or not at all (a temporary file renamed);
// an existing output is replaced only with --force, and the input never.
import { existsSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import { extname } from 'node:path';
import type { Command } from 'commander';
import { RlstreamError } from '../../core/errors.ts';
import { checkOutputPath } from '../output-path.ts';
import { readJsonlFile } from '../../core/jsonl.ts';
import { writeParquetRows } from '../../producers/dataset/parquet-writer.ts';
import { verlGsm8kColumns, verlGsm8kRow, type VerlGsm8kRow } from '../../producers/dataset/verl-gsm8k.ts';

interface RawRecord {
  question: unknown;
  answer: unknown;
}

async function* readRawJsonl(path: string): AsyncGenerator<{ raw: RawRecord; where: string }> {
  for await (const { value, where } of readJsonlFile(path)) yield { raw: value as unknown as RawRecord, where };
}

/** GSM8K's own Parquet files (openai/gsm8k main/*.parquet): columns question and answer. */
async function* readRawParquet(path: string): AsyncGenerator<{ raw: RawRecord; where: string }> {
  if (!existsSync(path)) throw new RlstreamError('INPUT_INVALID', `cannot read ${path}: no such file`);
  const { asyncBufferFromFile, parquetReadObjects } = await import('hyparquet');
  let rows: Record<string, unknown>[];
  try {
    rows = await parquetReadObjects({ file: await asyncBufferFromFile(path), columns: ['question', 'answer'] });
  } catch (cause) {
    throw new RlstreamError('INPUT_INVALID', `cannot read ${path} as GSM8K Parquet (columns question, answer): ${(cause as Error).message}`, { cause });
  }
  for (let i = 0; i < rows.length; i++) yield { raw: rows[i] as unknown as RawRecord, where: `${path} row ${i}` };
}

/** Write to a temporary name beside `path`, then rename: a failure never leaves a partial output. */
async function writeJsonlRows(path: string, rows: readonly VerlGsm8kRow[]): Promise<void> {
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    await writeFile(tmp, rows.map((r) => JSON.stringify(r) + '\n').join(''));
    await rename(tmp, path);
  } catch (cause) {
    await rm(tmp, { force: true });
    throw new RlstreamError('INPUT_INVALID', `cannot write ${path}: ${(cause as Error).message}`, { cause });
  }
}

export interface PreprocessOptions {
  input: string;
  output: string;
  split: string;
  limit?: string;
  agentName?: string;
  /** Replace an existing output. */
  force?: boolean;
}

/** The command's work; returns the number of rows written. */
export async function preprocessGsm8k(opts: PreprocessOptions): Promise<number> {
  const limit = opts.limit === undefined ? Infinity : Number(opts.limit);
  if (!(limit > 0)) throw new RlstreamError('INPUT_INVALID', '--limit must be a positive number');
  checkOutputPath(opts.output, { option: '--output', forceFlag: '--force', force: opts.force === true, inputs: { '--input': opts.input } });
  const options = opts.agentName === undefined ? {} : { agentName: opts.agentName };
  const source = extname(opts.input).toLowerCase() === '.parquet' ? readRawParquet(opts.input) : readRawJsonl(opts.input);
  const rows: VerlGsm8kRow[] = [];
  for await (const { raw, where } of source) {
    if (rows.length >= limit) break;
    try {
      rows.push(verlGsm8kRow(raw, rows.length, opts.split, options));
    } catch (err) {
      throw new RlstreamError('INPUT_INVALID', `${where}: ${(err as Error).message}`);
    }
  }
  if (extname(opts.output).toLowerCase() === '.parquet') {
    await writeParquetRows(opts.output, verlGsm8kColumns(options), rows as unknown as Record<string, unknown>[]);
  } else {
    await writeJsonlRows(opts.output, rows);
  }
  return rows.length;
}

export function register(program: Command): void {
  program
    .command('preprocess')
    .description("convert a raw dataset into rollout rows (datasets: gsm8k, as verl's GSM8K tool examples write them)")
    .argument('<dataset>', 'dataset kind: gsm8k')
    .requiredOption('--input <path>', 'raw GSM8K: JSONL ({question, answer} per line) or the dataset\'s Parquet')
    .requiredOption('--output <path>', 'rows to write: Parquet when it ends in .parquet, else JSONL')
    .option('--split <name>', 'split recorded in extra_info.split', 'train')
    .option('--limit <n>', 'convert only the first n records')
    .option('--agent-name <name>', "add the agent_name column (verl's gsm8k_tool_agent_loop.py writes tool_agent)")
    .option('--force', 'replace --output when it exists (it is never the --input)')
    .action(async (dataset: string, opts: PreprocessOptions) => {
      if (dataset !== 'gsm8k') throw new RlstreamError('INPUT_INVALID', `unknown dataset "${dataset}" (known: gsm8k)`);
      const n = await preprocessGsm8k(opts);
      process.stderr.write(`rlstream preprocess: wrote ${n} rows to ${opts.output}\n`);
    });
}

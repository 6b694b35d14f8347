// `rlstream preprocess gsm8k --input train.jsonl --output rows.jsonl [--split train] [--limit N]`: turns
// raw GSM8K records into tool-agent dataset rows (verl's shape; see producers/dataset/gsm8k.ts).
import { createReadStream, createWriteStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { finished } from 'node:stream/promises';
import type { Command } from 'commander';
import { RlstreamError } from '../../core/errors.ts';
import { gsm8kRow } from '../../producers/dataset/gsm8k.ts';

export function register(program: Command): void {
  program
    .command('preprocess')
    .description('convert a raw dataset into rollout rows (datasets: gsm8k)')
    .argument('<dataset>', 'dataset kind: gsm8k')
    .requiredOption('--input <path>', 'raw JSONL ({question, answer} per line for gsm8k)')
    .requiredOption('--output <path>', 'rows JSONL to write')
    .option('--split <name>', 'split recorded in extra_info.split', 'train')
    .option('--limit <n>', 'convert only the first n records')
    .action(async (dataset: string, opts: { input: string; output: string; split: string; limit?: string }) => {
      if (dataset !== 'gsm8k') throw new RlstreamError('INPUT_INVALID', `unknown dataset "${dataset}" (known: gsm8k)`);
      const limit = opts.limit === undefined ? Infinity : Number(opts.limit);
      if (!(limit > 0)) throw new RlstreamError('INPUT_INVALID', '--limit must be a positive number');
      const out = createWriteStream(opts.output);
      const input = createReadStream(opts.input, 'utf8');
      const opened = new Promise<void>((resolve, reject) => {
        input.once('open', () => resolve());
        input.once('error', (e) => reject(new RlstreamError('INPUT_INVALID', `cannot read ${opts.input}: ${e.message}`)));
      });
      await opened;
      let n = 0;
      let rows = 0;
      for await (const line of createInterface({ input, crlfDelay: Infinity })) {
        n++;
        if (line.trim() === '') continue;
        if (rows >= limit) break;
        let raw: { question: string; answer: string };
        try {
          raw = JSON.parse(line) as { question: string; answer: string };
        } catch {
          throw new RlstreamError('INPUT_INVALID', `${opts.input} line ${n}: not valid JSON`);
        }
        try {
          out.write(JSON.stringify(gsm8kRow(raw, rows, opts.split)) + '\n');
        } catch (err) {
          throw new RlstreamError('INPUT_INVALID', `${opts.input} line ${n}: ${(err as Error).message}`);
        }
        rows++;
      }
      out.end();
      await finished(out);
      process.stderr.write(`rlstream preprocess: wrote ${rows} rows to ${opts.output}\n`);
    });
}

// `rlstream import gguf <file> --out <dir> [--dtype f32|bf16]`: a llama.cpp GGUF model as a Hugging Face model
// directory (dequantized safetensors, config.json, tokenizer.json, tokenizer_config.json with the chat template)
// that the native trainer, the tokenizer and Hugging Face transformers load.
import type { Command } from 'commander';
import { RlstreamError } from '../../core/errors.ts';
import { importGguf, type ImportDtype } from '../../core/weights/gguf-import.ts';

const DTYPES: Record<string, ImportDtype> = { f32: 'F32', bf16: 'BF16' };

export function register(program: Command): void {
  const imp = program.command('import').description('convert a model from another format into a Hugging Face model directory');
  imp
    .command('gguf <file>')
    .description('dequantize a llama-architecture GGUF (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) into safetensors + config + tokenizer')
    .requiredOption('--out <dir>', 'directory to write (created if missing; files of the same names are replaced)')
    .option('--dtype <dtype>', 'safetensors dtype: f32 (what the trainer keeps; exact for every GGUF type read) or bf16 (half the size, rounded)', 'f32')
    .action(async (file: string, opts: { out: string; dtype: string }) => {
      const dtype = DTYPES[opts.dtype.toLowerCase()];
      if (!dtype) throw new RlstreamError('INPUT_INVALID', `--dtype must be f32 or bf16, got ${JSON.stringify(opts.dtype)}`);
      const started = Date.now();
      const summary = await importGguf(file, opts.out, { dtype });
      process.stdout.write(JSON.stringify({ out: opts.out, ...summary, seconds: (Date.now() - started) / 1000 }) + '\n');
    });
}

// `rlstream export <run> --version N --out <dir>`: a policy version of a run as a Hugging Face model directory that
// transformers, vLLM and SGLang load: config.json (the model's own, every key kept), the weights sharded with
// model.safetensors.index.json, generation_config.json and the tokenizer files. The version's weights are found
// through its PolicyVersion event in the run's log and verified against the event's sha256 before anything is
// written; the directory is written aside and renamed into place, and an existing --out is refused unless --force.
// A version of a run trained with trainer.lora is its adapters: export writes them as a PEFT adapter directory
// (adapter_config.json, adapter_model.safetensors) over the run's base model.
import type { Command } from 'commander';
import { existsSync, statSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import { newId } from '../../core/ids.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { writeVersion } from '../run/version-export.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';
import { openSource } from '../log-source.ts';
import { numberOption } from '../options.ts';
import { readRunFile } from '../run/resume.ts';

const DTYPES = { f32: 'F32', bf16: 'BF16' } as const;

/** Every PolicyVersion of the log (of `runId` where given), by version. */
async function policyVersions(spec: string, runId: string | null): Promise<Map<number, PolicyVersion>> {
  const source = await openSource(spec, true, true, 'export');
  const out = new Map<number, PolicyVersion>();
  try {
    const serde = await new EventSerde(source.registry).init();
    const ends = await source.log.offsets(TOPICS.policyVersions).catch(() => []);
    const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
    if (target.size === 0) return out;
    const consumer = await source.log.consumer({ groupId: `export-${newId()}`, topics: [TOPICS.policyVersions], readCommitted: true, fromBeginning: true });
    try {
      await readToEnd(consumer, TOPICS.policyVersions, target, async (records) => {
        for (const r of records) {
          const ev = await serde.decode(r.value);
          if (ev.name === 'PolicyVersion' && (runId === null || ev.value.run_id === runId)) out.set(ev.value.policy_version, ev.value);
        }
      }, { what: 'export: policy versions', timeoutMs: 60_000 });
    } finally {
      await consumer.close().catch(() => {});
    }
  } finally {
    await source.close();
  }
  return out;
}

/** The version's weights file: where the event says, else in the run directory's store (a moved run). */
function weightsFile(v: PolicyVersion, runDir: string | null): string {
  if (existsSync(v.weights_uri)) return v.weights_uri;
  const moved = runDir ? join(runDir, 'weights', `${v.checksum}.safetensors`) : null;
  if (moved && existsSync(moved)) return moved;
  throw new RlstreamError('WEIGHTS_FORMAT', `version ${v.policy_version}: its weights ${v.weights_uri} are gone${moved ? ` (nor at ${moved})` : ''}; the trainer keeps trainer.keep_versions versions, and older ones are pruned`);
}

export function register(program: Command): void {
  program
    .command('export')
    .description('write a policy version of a run as a Hugging Face model directory (config, sharded safetensors + index, tokenizer, generation_config)')
    .argument('<run>', 'the run: its directory (<data_dir>/<run id>), its log/ directory, or kafka://brokers (with --run-id)')
    .requiredOption('--out <dir>', 'directory to write; refused if it exists, unless --force')
    .option('--version <n>', 'policy version (default: the newest)', numberOption('--version', { integer: true, min: 0 }))
    .option('--dtype <dtype>', 'f32 (the trainer\'s weights exactly) or bf16 (half the size, rounded to nearest even)', 'f32')
    .option('--max-shard-size <bytes>', 'largest shard in bytes (transformers\' max_shard_size; default 5e9)', numberOption('--max-shard-size', { min: 1 }))
    .option('--tokenizer <dir>', "tokenizer files to copy (default: the run's model.tokenizer, recorded in run.json)")
    .option('--run-id <id>', 'the run in a shared log (default: the run directory\'s run.json)')
    .option('--force', 'replace --out if it exists')
    .action(async (run: string, opts: { out: string; version?: number; dtype: string; maxShardSize?: number; tokenizer?: string; runId?: string; force?: boolean }) => {
      const dtype = DTYPES[opts.dtype.toLowerCase() as keyof typeof DTYPES];
      if (!dtype) throw new RlstreamError('INPUT_INVALID', `--dtype must be f32 or bf16, got ${JSON.stringify(opts.dtype)}`);
      const out = resolve(opts.out);
      if (existsSync(out) && !opts.force) throw new RlstreamError('INPUT_INVALID', `--out ${opts.out} exists; choose another directory or pass --force to replace it`);
      const runDir = !run.startsWith('kafka://') && existsSync(run) && statSync(run).isDirectory() && basename(run) !== 'log' ? resolve(run) : null;
      const runFile = runDir ? readRunFile(runDir) : null;
      const runId = opts.runId ?? runFile?.run_id ?? null;
      const versions = await policyVersions(run, runId);
      if (versions.size === 0) throw new RlstreamError('INPUT_INVALID', `${run}: no policy versions${runId ? ` of run ${runId}` : ''} in its log`);
      const n = opts.version ?? Math.max(...versions.keys());
      const v = versions.get(n);
      if (!v) throw new RlstreamError('INPUT_INVALID', `--version ${n}: the run published versions ${[...versions.keys()].sort((a, b) => a - b).join(', ')}`);
      const tokenizerDir = opts.tokenizer ? resolve(opts.tokenizer) : (runFile?.model?.tokenizer ?? null);
      const started = Date.now();
      const written = await writeVersion({ version: n, checksum: v.checksum, configJson: v.config_json, weightsFile: weightsFile(v, runDir), format: v.format }, out, {
        dtype,
        ...(opts.maxShardSize !== undefined ? { maxShardBytes: opts.maxShardSize } : {}),
        tokenizerDir,
        base: runFile?.model?.base ?? null,
        force: opts.force ?? false,
      });
      const seconds = (Date.now() - started) / 1000;
      const what =
        written.kind === 'model'
          ? { dtype: opts.dtype.toLowerCase(), tokenizer: tokenizerDir }
          : { format: 'peft-lora', rank: written.rank, alpha: written.alpha, target_modules: written.targetModules, base_model: written.baseModel };
      process.stdout.write(JSON.stringify({ out, run_id: v.run_id, version: n, step: v.step, checksum: v.checksum, ...what, seconds }) + '\n');
    });
}

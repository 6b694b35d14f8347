// `rlstream config check <file>` and `rlstream config print <file>`: the run config compiled exactly as a run
// compiles it at start-up (with the same --set overrides), its plug-ins resolved and what start-up opens checked
// (cli/run/preflight.ts). check lists every problem, each with its path and fix, and exits 1; print writes the
// effective config, every default filled in, secrets masked.
import { existsSync, readFileSync, statSync } from 'node:fs';
import type { Command } from 'commander';
import { stringify } from 'yaml';
import { ConfigError, loadRunConfig, maskSecrets, type RunConfig } from '../config/run-config.ts';
import { describeError, isRlstreamError } from '../../core/errors.ts';
import { isModelDir, openWeights, readGenerationDefaults } from '../../core/weights/hf-dir.ts';
import { expectedTensors, policyConfig } from '../../producers/policy/config.ts';
import { initFiles } from '../run/roles.ts';
import { resolvePlugins } from '../run/plugins.ts';
import { pathProblems, startupProblems } from '../run/preflight.ts';
import { collectSet, nprocOption } from '../set-option.ts';
import { devicesProblems } from '../../consumers/trainer/parallel/devices.ts';

/** Compile the config and resolve its plug-ins (user modules included); the problems, or none. */
export async function checkConfig(path: string, overrides: Record<string, unknown>): Promise<{ config: RunConfig | null; problems: string[] }> {
  let config: RunConfig;
  try {
    config = loadRunConfig(path, overrides);
  } catch (err) {
    if (err instanceof ConfigError) return { config: null, problems: err.issues.map((i) => `${i.path}: ${i.message}`) };
    return { config: null, problems: [isRlstreamError(err) ? err.message : describeError(err)] };
  }
  const problems = pathProblems(config);
  let plugins;
  try {
    plugins = await resolvePlugins(config);
  } catch (err) {
    problems.push(isRlstreamError(err) ? err.message : describeError(err));
  }
  if (plugins) problems.push(...(await startupProblems(config, plugins)));
  problems.push(...checkModel(config));
  problems.push(...devicesProblems(config.trainer.dataParallel));
  return { config, problems };
}

/**
 * The model as the roles will load it: config.json through the one parser (a key it does not support is named), the
 * weights' headers (model.init where it exists, model.base) against the tensors that config needs (names, shapes, a
 * sharded directory's index against its shards), and generation_config.json. Only headers are read.
 */
function checkModel(config: RunConfig): string[] {
  const m = config.model;
  if (m.config === null || !existsSync(m.config)) return [];
  let json: string;
  let expected: Map<string, number[]>;
  let tied: boolean;
  try {
    json = readFileSync(m.config, 'utf8');
    const pc = policyConfig(json);
    expected = expectedTensors(pc);
    tied = pc.tieWordEmbeddings;
  } catch {
    // startupProblems (cli/run/preflight.ts) already names a model.config that does not parse.
    return [];
  }
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const [field, p] of [['model.init', m.init], ['model.base', m.base]] as const) {
    if (p === null) continue;
    const weights = initFiles(p).initWeights;
    if (!existsSync(weights) || seen.has(weights)) continue;
    seen.add(weights);
    try {
      const w = openWeights(weights);
      try {
        for (const [name, shape] of expected) {
          const e = w.tensors.get(name)?.entry;
          if (!e) problems.push(`${field}: ${weights} lacks tensor ${name}, which model.config needs`);
          else if (e.shape.join(',') !== shape.join(',')) problems.push(`${field}: ${weights}: tensor ${name} has shape [${e.shape.join(', ')}], model.config gives [${shape.join(', ')}]`);
        }
        for (const name of w.tensors.keys())
          if (!expected.has(name) && !(tied && name === 'lm_head.weight') && !/(^|\.)rotary_emb\.inv_freq$/.test(name)) problems.push(`${field}: ${weights} holds tensor ${name}, which no model of model.config has`);
      } finally {
        w.close();
      }
    } catch (err) {
      // A single file whose header does not read is already named by startupProblems (cli/run/preflight.ts).
      if (!statSync(weights).isFile()) problems.push(`${field}: ${isRlstreamError(err) ? err.message : describeError(err)}`);
    }
  }
  if (m.base !== null && isModelDir(m.base)) {
    try {
      readGenerationDefaults(m.base);
    } catch (err) {
      problems.push(`model.base: ${isRlstreamError(err) ? err.message : describeError(err)}`);
    }
  }
  return problems;
}

export function register(program: Command): void {
  const config = program.command('config').description('check or print a run configuration');
  config
    .command('check')
    .description('compile a run configuration as a run would; list every problem (exit 1) or print "ok"')
    .argument('<file>', 'run configuration (YAML)')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .option('--nproc <n>', 'trainer GPUs (data-parallel ranks), as --set trainer.devices=<n>')
    .action(async (file: string, opts: { set: Record<string, unknown>; nproc?: string }) => {
      const { problems } = await checkConfig(file, nprocOption(opts.nproc, opts.set));
      if (problems.length > 0) {
        process.stderr.write(`${file}: ${problems.length} problem(s)\n${problems.map((p) => `  ${p}`).join('\n')}\n`);
        process.exitCode = 1;
        return;
      }
      console.log(`${file}: ok`);
    });
  config
    .command('print')
    .description('print the effective run configuration (defaults filled in, secrets masked)')
    .argument('<file>', 'run configuration (YAML)')
    .option('--set <key=value>', 'override a config field (repeatable)', collectSet, {})
    .action(async (file: string, opts: { set: Record<string, unknown> }) => {
      const { config: compiled, problems } = await checkConfig(file, opts.set);
      if (problems.length > 0 || compiled === null) {
        process.stderr.write(`${file}: ${problems.length} problem(s)\n${problems.map((p) => `  ${p}`).join('\n')}\n`);
        process.exitCode = 1;
        return;
      }
      process.stdout.write(stringify(maskSecrets(compiled.effective)));
    });
}

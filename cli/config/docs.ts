// Generates docs/configuration.md from the config schemas: every section, every key with its type, default
// and meaning, and the plug-in sections per kind. `npm run docs:config` writes it; `--check` (and a test)
// fails when the file is stale.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { TObject, TSchema } from '@sinclair/typebox';
import { AdminSection, AdvantageSection, DatasetSection, EvalSection, ExportSection, LOG_KINDS, ModelSection, REGISTRY_KINDS, RewardSection, RunSection, ServeSection, SftStageCommon, TaskCommon, ToolsSection, InteractionSection, TRACE_KINDS } from './sections.ts';
import { RolloutSection } from '../../producers/options.ts';
import { TrainerSection } from '../../consumers/trainer/options.ts';
import { backends } from '../../producers/backends/registry.ts';
import { tasks } from '../../producers/tasks.ts';
import '../../examples/index.ts';

export const DOC_PATH = join(import.meta.dirname, '..', '..', 'docs', 'configuration.md');

const ROOT = join(import.meta.dirname, '..', '..');

/** A default as shown: paths inside the checkout relative to it, so the page is the same in every clone. */
function shownDefault(v: unknown): string {
  return JSON.stringify(v).replaceAll(`${ROOT}/`, '');
}

function typeOf(s: TSchema): string {
  const t = s as { type?: unknown; enum?: unknown[]; items?: TSchema; anyOf?: { const?: unknown }[] };
  if (t.enum) return t.enum.map((v) => `\`${String(v)}\``).join(' \\| ');
  if (t.anyOf && t.anyOf.every((b) => b.const !== undefined)) return t.anyOf.map((b) => `\`${String(b.const)}\``).join(' \\| ');
  if (Array.isArray(t.type)) return t.type.join(' \\| ');
  if (t.type === 'array' && t.items) return `list of ${typeOf(t.items)}`;
  if (t.type === 'object') return 'mapping';
  return String(t.type ?? 'any');
}

function rows(properties: Record<string, TSchema>, prefix = ''): string[] {
  const out: string[] = [];
  for (const [key, s] of Object.entries(properties)) {
    const d = s as { default?: unknown; description?: string; properties?: Record<string, TSchema>; minimum?: number; maximum?: number; exclusiveMinimum?: number };
    const range = [d.minimum !== undefined ? `≥ ${d.minimum}` : '', d.exclusiveMinimum !== undefined ? `> ${d.exclusiveMinimum}` : '', d.maximum !== undefined ? `≤ ${d.maximum}` : ''].filter(Boolean).join(', ');
    const dflt = d.default === undefined ? '(required or unset)' : `\`${shownDefault(d.default)}\``;
    out.push(`| \`${prefix}${key}\` | ${typeOf(s)}${range ? ` (${range})` : ''} | ${dflt} | ${(d.description ?? '').replace(/\|/g, '\\|')} |`);
    if (d.properties) out.push(...rows(d.properties, `${prefix}${key}.`));
  }
  return out;
}

function table(properties: Record<string, TSchema>): string {
  return ['| key | type | default | meaning |', '| --- | --- | --- | --- |', ...rows(properties)].join('\n');
}

function section(name: string, schema: TObject): string {
  return `## \`${name}\`\n\n${schema.description ?? ''}\n\n${table(schema.properties)}\n`;
}

function kinds(name: string, selector: string, byKind: Record<string, TObject>): string {
  const parts = [`## \`${name}\`\n\n\`${selector}\` picks one of: ${Object.keys(byKind).map((k) => `\`${k}\``).join(', ')}; the other keys are its options.\n`];
  for (const [k, s] of Object.entries(byKind)) parts.push(`### \`${name}.${selector}: ${k}\`\n\n${s.description ?? ''}\n\n${Object.keys(s.properties).length ? table(s.properties) : '(no options)'}\n`);
  return parts.join('\n');
}

export function renderConfigDocs(): string {
  const backendKinds = Object.fromEntries(backends.names().map((n) => [n, backends.get(n).options]));
  const taskParts = tasks.names().map((n) => {
    const p = tasks.get(n);
    const own = Object.keys(p.options.properties).length ? table(p.options.properties) : '(no options of its own)';
    const sft = p.sftOptions ? `\n\nIts keys in an \`sft\` stage:\n\n${table(p.sftOptions.properties)}` : '';
    return `### \`task.name: ${n}\`\n\n${own}${sft}\n`;
  });
  return [
    '# Configuration reference',
    '',
    '<!-- Generated from the config schemas by `npm run docs:config` (cli/config/docs.ts); a test fails when it is stale. Do not edit by hand. -->',
    '',
    'One YAML file configures a run, for the main job (`rlstream run`) and the distributed shape (`rlstream worker <role>`) alike. It is compiled once at start-up: an unknown key, a wrong type, an out-of-range value or an unknown plug-in name fails before any role starts, each problem naming its path and the fix. `rlstream config check <file> [--set key=value ...]` lists every problem; `rlstream config print <file>` prints the effective config with every default (secrets masked). Relative paths resolve from the config file\'s directory; `${VAR}` in a string is replaced by the environment variable.',
    '',
    section('run', RunSection),
    kinds('log', 'kind', LOG_KINDS),
    kinds('registry', 'kind', REGISTRY_KINDS),
    kinds('traces', 'kind', TRACE_KINDS),
    section('admin', AdminSection),
    section('serve', ServeSection),
    section('model', ModelSection),
    `## \`task\`\n\nThe task: its rows, reward functions, default tools, held-out correctness and SFT demonstrations. Common keys:\n\n${table(TaskCommon)}\n\nEach registered task adds its own keys:\n`,
    ...taskParts,
    section('dataset', DatasetSection),
    `## \`sft\`\n\nSupervised warm-up when model.init does not exist. The section's keys are the defaults of every stage; \`stages:\` (a list) overrides them per stage. Stage keys (plus the task's own, above):\n\n${table(SftStageCommon)}\n`,
    section('rollout', RolloutSection),
    kinds('backend', 'name', backendKinds),
    section('tools', ToolsSection),
    section('interaction', InteractionSection),
    section('reward', RewardSection),
    section('advantage', AdvantageSection),
    section('trainer', TrainerSection),
    section('eval', EvalSection),
    section('export', ExportSection),
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const text = renderConfigDocs();
  if (process.argv.includes('--check')) {
    let current = '';
    try {
      current = readFileSync(DOC_PATH, 'utf8');
    } catch {
      current = '';
    }
    if (current !== text) {
      process.stderr.write(`${DOC_PATH} is stale: run npm run docs:config\n`);
      process.exit(1);
    }
  } else writeFileSync(DOC_PATH, text);
}

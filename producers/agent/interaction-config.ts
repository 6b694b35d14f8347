// Interaction configuration in YAML, verl's shape (`interaction.config` in a run config; verl's
// gsm8k_interaction_config.yaml is read as it is):
//
//   interaction:
//     - name: gsm8k                                                   # optional: derived from class_name as verl does
//       class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction   # verl class, built-in name, or ./module.ts[:Export]
//       config: {}                                                    # handed to the constructor, with `name`
//
// verl's class names map to the rlstream interaction that behaves the same (VERL_INTERACTION_CLASSES); any other
// Python-style class name is refused naming the ones that map, since rlstream cannot run verl's Python. Rows pick
// an interaction by extra_info.interaction_kwargs.name, as in verl.
import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import YAML from 'yaml';
import { functionShape, Registry } from '../../core/config/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import { Gsm8kInteraction, type Interaction } from './interaction.ts';

/** An interaction by class_name, built from its entry's config (with `name`). */
export type InteractionFactory = (config: Record<string, unknown> & { name: string }) => Interaction;

export const interactionClasses = new Registry<InteractionFactory>('interaction class', functionShape('a function (config) => Interaction'));
interactionClasses.register('gsm8k', (config) => new Gsm8kInteraction(config.name));

/** verl's interaction classes → the built-in that behaves as they do. */
const VERL_INTERACTION_CLASSES: Record<string, string> = {
  'verl.interactions.gsm8k_interaction.Gsm8kInteraction': 'gsm8k',
};

/** A module interaction: a class constructed as new C(config). */
type InteractionClass = new (config: Record<string, unknown>) => Interaction;
const moduleClasses = new Registry<InteractionClass>('interaction class', { description: 'a class constructed as new C(config)', accept: (v) => (typeof v === 'function' ? (v as InteractionClass) : null) });

function invalid(message: string): never {
  throw new RlstreamError('CONFIG_INVALID', `interaction.config: ${message}`);
}

function asObject(v: unknown, field: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) invalid(`${field} must be a mapping`);
  return v as Record<string, unknown>;
}

/** verl's default name: the class's simple name, less an `Interaction` suffix, lower-cased. */
export function defaultInteractionName(className: string): string {
  const simple = className.split(/[.:/\\]/).at(-1)!.replace(/\.(m?[jt]s|cjs|cts)$/, '');
  return (simple.endsWith('Interaction') ? simple.slice(0, -'Interaction'.length) : simple).toLowerCase();
}

function isModulePath(className: string): boolean {
  return /[\\/]/.test(className) || /\.(m?[jt]s|cjs|cts)(:|$)/.test(className);
}

/** The interactions of a YAML text by name; `baseDir` resolves module paths. */
export async function interactionsFromYaml(text: string, baseDir: string): Promise<Map<string, Interaction>> {
  let doc: unknown;
  try {
    doc = YAML.parse(text);
  } catch (cause) {
    throw new RlstreamError('CONFIG_INVALID', `interaction.config is not valid YAML: ${(cause as Error).message}`, { cause });
  }
  const list = asObject(doc, 'the file')['interaction'];
  if (!Array.isArray(list)) invalid('the file must have an `interaction:` list (verl: - name, class_name, config)');
  const out = new Map<string, Interaction>();
  for (const [i, item] of list.entries()) {
    const field = `interaction[${i}]`;
    const entry = asObject(item, field);
    for (const key of Object.keys(entry)) if (!['name', 'class_name', 'config'].includes(key)) invalid(`${field}.${key}: not a key of an interaction (name, class_name, config)`);
    const className = entry['class_name'];
    if (typeof className !== 'string' || className === '') invalid(`${field}.class_name must be a non-empty string`);
    const nameValue = entry['name'];
    if (nameValue !== undefined && nameValue !== null && (typeof nameValue !== 'string' || nameValue === '')) invalid(`${field}.name must be a non-empty string`);
    const name = (nameValue as string | undefined | null) ?? defaultInteractionName(className);
    if (out.has(name)) invalid(`${field}.name: "${name}" is named twice (each interaction needs its own name)`);
    const config = { ...asObject(entry['config'], `${field}.config`), name };
    const builtinName = Object.hasOwn(VERL_INTERACTION_CLASSES, className) ? VERL_INTERACTION_CLASSES[className]! : className;
    let interaction: Interaction;
    if (interactionClasses.has(builtinName)) interaction = interactionClasses.get(builtinName)(config);
    else if (isModulePath(className)) {
      const [path, exportName] = className.split(':') as [string, string | undefined];
      const C = await moduleClasses.load({ module: path, ...(exportName ? { export: exportName } : {}) }, baseDir, `interaction.config ${field}.class_name`);
      interaction = new C(config);
    } else {
      invalid(
        `${field}.class_name: no rlstream interaction for "${className}" (verl classes that map: ${Object.keys(VERL_INTERACTION_CLASSES).join(', ')}; built-ins: ${interactionClasses.names().join(', ')}). ` +
          'Port it to TypeScript and name its module: class_name: ./my_interaction.ts[:ExportName]',
      );
    }
    out.set(name, interaction);
  }
  return out;
}

/** interactionsFromYaml of a file (module paths relative to it). */
export async function loadInteractionConfig(path: string): Promise<Map<string, Interaction>> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new RlstreamError('CONFIG_INVALID', `interaction.config: ${path} cannot be read: ${(err as Error).message}`);
  }
  return interactionsFromYaml(text, dirname(path));
}

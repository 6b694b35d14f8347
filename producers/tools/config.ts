// Tool configuration in YAML (verl's tool_config shape), compiled into a ToolSet:
//
//   tools:
//     - class_name: calculator             # built-in name, verl class name, or a module path: ./my-tool.ts[:ExportName]
//       config: { timeout_ms: 5000 }       # handed to the tool's constructor; timeout_ms is the call timeout
//       tool_schema:                       # optional: overrides the tool's own schema (OpenAI function shape)
//         type: function
//         function: { name: calculator, description: ..., parameters: { type: object, ... } }
//     - class_name: mcp                    # every tool an MCP server lists (or `include` of them)
//       config: { transport: stdio, command: node, args: [server.js], include: [add], timeout_ms: 10000 }
//
// Any entry's config may add `simulated_latency` (simulated-latency.ts): a seeded, heavy-tailed delay before
// each call, to study how a slow service's tail affects the pipeline.
//
// A module tool exports a class (default export, or the named export) constructed as new C(config).
//
// verl's tool YAML is read as it is: its class names map to the rlstream tool that behaves the same
// (VERL_TOOL_CLASSES); verl's `config: {type: native}` is accepted and ignored. Any other Python-style class
// name is refused naming the ones that map, since rlstream cannot run verl's Python.
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import YAML from 'yaml';
import { functionShape, Registry } from '../../core/config/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import type { ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { CalculatorTool } from './calculator.ts';
import { Gsm8kTool } from './gsm8k.ts';
import type { McpServerConfig } from './mcp.ts';
import { compileSimulatedLatency, withSimulatedLatency } from './simulated-latency.ts';
import { ToolSet } from './tool-set.ts';
import type { Tool } from './types.ts';

/** A tool by class_name: built from the entry's `config`. */
export type ToolFactory = (config: Record<string, unknown>) => Tool;

/** Tools by class_name; another registers itself with `registerTool(name, factory)`. `mcp` is handled apart (it yields many tools). */
export const tools = new Registry<ToolFactory>('tool', functionShape('a function (config) => Tool'));

export function registerTool(name: string, factory: ToolFactory): void {
  tools.register(name, factory);
}

registerTool('calculator', (config) => new CalculatorTool(typeof config['name'] === 'string' ? config['name'] : 'calculator'));
registerTool('calc_gsm8k_reward', () => new Gsm8kTool());

/** A module tool: a class constructed as new C(config). */
type ToolClass = new (config: Record<string, unknown>) => Tool;
const toolClasses = new Registry<ToolClass>('tool class', { description: 'a class constructed as new C(config)', accept: (v) => (typeof v === 'function' ? (v as ToolClass) : null) });

/** verl's tool classes (their import paths, old and current) → the built-in that behaves as they do. */
const VERL_TOOL_CLASSES: Record<string, string> = {
  'verl.tools.gsm8k_tool.Gsm8kTool': 'calc_gsm8k_reward',
  'verl.workers.tool.gsm8k_tool.Gsm8kTool': 'calc_gsm8k_reward',
};

/** A module path names a file (a slash, or a .ts/.js file); anything else is a class name. */
function isModulePath(className: string): boolean {
  return /[\\/]/.test(className) || /\.(m?[jt]s|cjs|cts)(:|$)/.test(className);
}

function invalid(message: string): never {
  throw new RlstreamError('CONFIG_INVALID', message);
}

function asObject(v: unknown, field: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) invalid(`${field} must be a mapping`);
  return v as Record<string, unknown>;
}

function withSchema(tool: Tool, schema: ChatTool): Tool {
  // Keep the instance's methods and state; only the schema the model sees and arguments are checked against changes.
  return Object.create(tool, { schema: { value: schema, enumerable: true } }) as Tool;
}

async function loadModuleTool(spec: string, baseDir: string, config: Record<string, unknown>, field: string): Promise<Tool> {
  const [path, exportName] = spec.split(':') as [string, string | undefined];
  const C = await toolClasses.load({ module: path, ...(exportName ? { export: exportName } : {}) }, baseDir, field);
  return new C(config);
}

/** Build a ToolSet from YAML text; `baseDir` resolves relative module paths and MCP commands' cwd. */
export async function toolSetFromYaml(text: string, options: { baseDir?: string; defaultTimeoutMs?: number } = {}): Promise<ToolSet> {
  let doc: unknown;
  try {
    doc = YAML.parse(text);
  } catch (cause) {
    throw new RlstreamError('CONFIG_INVALID', `tool config is not valid YAML: ${(cause as Error).message}`, { cause });
  }
  const root = asObject(doc, 'tool config');
  const list = root['tools'] ?? [];
  if (!Array.isArray(list)) invalid('tools must be a list');
  const baseDir = options.baseDir ?? process.cwd();
  const set = new ToolSet({ defaultTimeoutMs: options.defaultTimeoutMs });
  try {
    for (let i = 0; i < list.length; i++) {
      const field = `tools[${i}]`;
      const entry = asObject(list[i], field);
      const className = entry['class_name'];
      if (typeof className !== 'string' || className === '') invalid(`${field}.class_name must be a non-empty string`);
      const config = asObject(entry['config'], `${field}.config`);
      const timeout = config['timeout_ms'];
      if (timeout !== undefined && (typeof timeout !== 'number' || !(timeout > 0))) invalid(`${field}.config.timeout_ms must be a positive number`);
      const timeoutMs = timeout as number | undefined;
      const latency = config['simulated_latency'] === undefined ? null : compileSimulatedLatency(config['simulated_latency'], `${field}.config.simulated_latency`);
      const delayed = (t: Tool) => (latency ? withSimulatedLatency(t, latency) : t);
      if (className === 'mcp') {
        const transport = config['transport'];
        let server: McpServerConfig;
        if (transport === 'stdio') {
          if (typeof config['command'] !== 'string') invalid(`${field}.config.command must be a string for the stdio transport`);
          server = { transport, command: config['command'] as string, args: (config['args'] as string[] | undefined) ?? [], cwd: (config['cwd'] as string | undefined) ?? baseDir };
        } else if (transport === 'http') {
          if (typeof config['url'] !== 'string') invalid(`${field}.config.url must be a string for the http transport`);
          server = { transport, url: config['url'] as string };
        } else invalid(`${field}.config.transport must be stdio or http`);
        // The MCP SDK loads only for a config that names an MCP server: a third of a second of every role's start.
        const { McpConnection } = await import('./mcp.ts');
        const conn = await McpConnection.connect(server!, { include: config['include'] as string[] | undefined });
        for (const t of conn.tools) set.add(delayed(t), { timeoutMs });
        continue;
      }
      const builtinName = Object.hasOwn(VERL_TOOL_CLASSES, className) ? VERL_TOOL_CLASSES[className]! : (className as string);
      const builtin = tools.has(builtinName) ? tools.get(builtinName) : undefined;
      if (!builtin && !isModulePath(className as string)) {
        invalid(
          `${field}.class_name: no rlstream tool for "${className}" (verl classes that map: ${Object.keys(VERL_TOOL_CLASSES).join(', ')}; ` +
            `built-ins: ${[...tools.names(), 'mcp'].join(', ')}). Port the tool to TypeScript and name its module: class_name: ./my_tool.ts[:ExportName]`,
        );
      }
      let tool = builtin ? builtin(config) : await loadModuleTool(className, baseDir, config, `${field}.class_name`);
      if (entry['tool_schema'] !== undefined) {
        const schema = asObject(entry['tool_schema'], `${field}.tool_schema`) as unknown as ChatTool;
        if (typeof schema.function?.name !== 'string') invalid(`${field}.tool_schema.function.name must be a string`);
        tool = withSchema(tool, schema);
      }
      set.add(delayed(tool), { timeoutMs });
    }
  } catch (err) {
    await set.close();
    throw err;
  }
  return set;
}

export async function loadToolConfig(path: string, options: { defaultTimeoutMs?: number } = {}): Promise<ToolSet> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    throw new RlstreamError('CONFIG_INVALID', `tool config not readable: ${path}`, { cause });
  }
  return toolSetFromYaml(text, { baseDir: dirname(resolve(path)), ...options });
}

// Agent loops by name. Built-ins are single_turn and tool_agent; user loops are added in code
// (register) or loaded from a module path (its default export, or the named export after ':', is an
// AgentLoop object or a class constructed without arguments).
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { RlstreamError } from '../../core/errors.ts';
import { singleTurnLoop, toolAgentLoop } from './loops.ts';
import type { AgentLoop } from './types.ts';

export class AgentRegistry {
  private readonly loops = new Map<string, AgentLoop>();

  /** A registry holding the built-in loops. */
  static withBuiltins(): AgentRegistry {
    return new AgentRegistry().register(singleTurnLoop).register(toolAgentLoop);
  }

  register(loop: AgentLoop, name = loop.name): this {
    if (typeof loop.run !== 'function') throw new RlstreamError('CONFIG_INVALID', `agent loop ${name} has no run() method`);
    this.loops.set(name, loop);
    return this;
  }

  get(name: string): AgentLoop {
    const loop = this.loops.get(name);
    if (!loop) throw new RlstreamError('CONFIG_INVALID', `unknown agent loop "${name}"; registered: ${this.names().join(', ')}`);
    return loop;
  }

  has(name: string): boolean {
    return this.loops.has(name);
  }

  names(): string[] {
    return [...this.loops.keys()];
  }

  /** Import a loop from `path[:export]` (relative to baseDir) and register it under `name`. */
  async load(name: string, spec: string, baseDir = process.cwd()): Promise<this> {
    const [path, exportName] = spec.split(':') as [string, string | undefined];
    const abs = isAbsolute(path) ? path : resolve(baseDir, path);
    let mod: Record<string, unknown>;
    try {
      mod = (await import(pathToFileURL(abs).href)) as Record<string, unknown>;
    } catch (cause) {
      throw new RlstreamError('CONFIG_INVALID', `agent loop ${name}: cannot import ${abs}: ${(cause as Error).message}`, { cause });
    }
    const exp = mod[exportName ?? 'default'];
    const loop = typeof exp === 'function' ? (new (exp as new () => AgentLoop)() as AgentLoop) : (exp as AgentLoop | undefined);
    if (!loop || typeof loop.run !== 'function') throw new RlstreamError('CONFIG_INVALID', `agent loop ${name}: ${abs} export ${exportName ?? 'default'} is not an AgentLoop`);
    return this.register(loop, name);
  }
}

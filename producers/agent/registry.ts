// Agent loops by name. Built-ins are single_turn and tool_agent (registered in `agentLoops`); a run's
// AgentRegistry holds those plus its own: added in code (register) or loaded from user code
// (`rollout.agent_loops: {name: {module, export}}`: an AgentLoop object or a class constructed without
// arguments), with the errors of the generic plug-in registry.
import { objectShape, Registry, type UserCodeRef } from '../../core/config/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import { singleTurnLoop, toolAgentLoop } from './loops.ts';
import type { AgentLoop } from './types.ts';

export const agentLoops = new Registry<AgentLoop>('agent loop', objectShape('an AgentLoop (an object with run(), or a class of one)', ['run'], { construct: true }));
agentLoops.register(singleTurnLoop.name, singleTurnLoop).register(toolAgentLoop.name, toolAgentLoop);

export class AgentRegistry {
  private readonly loops = new Map<string, AgentLoop>();

  /** A registry holding the registered loops (the built-ins and any registered on `agentLoops`). */
  static withBuiltins(): AgentRegistry {
    const r = new AgentRegistry();
    for (const name of agentLoops.names()) r.register(agentLoops.get(name), name);
    return r;
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

  /** Import a loop from `path[:export]` or {module, export} (relative to baseDir) and register it under `name`. */
  async load(name: string, spec: string | UserCodeRef, baseDir = process.cwd()): Promise<this> {
    const ref: UserCodeRef = typeof spec === 'string' ? (([module, exp]) => ({ module: module ?? '', ...(exp ? { export: exp } : {}) }))(spec.split(':')) : spec;
    return this.register(await agentLoops.load(ref, baseDir, `rollout.agent_loops.${name}`), name);
  }
}

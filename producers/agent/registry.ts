// Agent loops by name. Built-ins are single_turn and tool_agent (registered in `agentLoops`); a run's
// agentLoops.copy() holds those plus its own: registered in code or loaded from user code
// (`rollout.agent_loops: {name: {module, export}}`: an AgentLoop object or a class constructed without
// arguments), with the errors of the generic plug-in registry.
import { objectShape, Registry } from '../../core/config/registry.ts';
import { singleTurnLoop, toolAgentLoop } from './loops.ts';
import type { AgentLoop } from './types.ts';

export const agentLoops = new Registry<AgentLoop>('agent loop', objectShape('an AgentLoop (an object with run(), or a class of one)', ['run'], { construct: true }));
agentLoops.register(singleTurnLoop.name, singleTurnLoop).register(toolAgentLoop.name, toolAgentLoop);

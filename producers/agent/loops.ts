// The built-in agent loops. single_turn: one generation. tool_agent (verl's ToolAgentLoop): generate;
// if the turn calls tools, run them concurrently and append their responses (mask 0), else hand the
// turn to the interaction if there is one, else stop. Stops on max turns (assistant or user), the
// response budget, or the tool-error limit.
import type { Message, Termination } from '../../schemas/generated/types.ts';
import type { ChatMessage } from '../tokenizer/chat-tokenizer.ts';
import { appendObservation, generateTurn } from './steps.ts';
import type { AgentContext, AgentLoop } from './types.ts';

export const singleTurnLoop: AgentLoop = {
  name: 'single_turn',
  async run(ctx: AgentContext): Promise<Termination> {
    const turn = await generateTurn(ctx, false);
    if (!turn) return 'max_tokens';
    return turn.gen.finishReason === 'length' || ctx.recorder.responseLength >= ctx.limits.responseLength ? 'max_tokens' : turn.gen.finishReason === 'abort' ? 'aborted' : 'stop';
  },
};

export const toolAgentLoop: AgentLoop = {
  name: 'tool_agent',
  usesTools: true,
  async run(ctx: AgentContext): Promise<Termination> {
    const { limits, recorder: rec } = ctx;
    let assistantTurns = 0;
    let userTurns = 0;
    for (;;) {
      const turn = await generateTurn(ctx, ctx.toolSession !== null);
      if (!turn) return 'max_tokens';
      assistantTurns++;
      if (turn.gen.finishReason === 'abort') return 'aborted';
      if (turn.gen.finishReason === 'length' || rec.responseLength >= limits.responseLength) return 'max_tokens';
      if (assistantTurns >= limits.maxAssistantTurns || userTurns >= limits.maxUserTurns) return 'max_turns';

      if (turn.calls.length > 0 || turn.parsed.errors.length > 0) {
        const t0 = performance.now();
        const session = ctx.toolSession!;
        const results = await Promise.all(
          turn.calls.map(async (call) => {
            const outcome = await session.call(call.name, call.arguments_json, ctx.signal);
            rec.addToolCall(turn.turnIndex, call, outcome);
            ctx.count(`tool_status_${outcome.status}`);
            return outcome;
          }),
        );
        const toolMs = performance.now() - t0;
        rec.toolMs += toolMs;
        const messages: ChatMessage[] = turn.calls.map((call, i) => ({ role: 'tool', content: results[i]!.text, tool_call_id: call.id, name: call.name }));
        for (const err of turn.parsed.errors) {
          rec.addParseFailure();
          messages.push({ role: 'tool', content: `Error: ${err}. Write each call as <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.` });
        }
        if (!appendObservation(ctx, 'tool', messages, toolMs)) return 'max_tokens';
        userTurns++;
        if (rec.numToolErrors >= limits.maxToolErrors) return 'tool_error_limit';
        continue;
      }

      if (ctx.interaction) {
        const { interaction, instanceId, kwargs } = ctx.interaction;
        const t0 = performance.now();
        const reply = await interaction.respond(instanceId, ctx.messages, kwargs);
        rec.interactionRewards.push(Number.isFinite(reply.reward) ? reply.reward : 0);
        if (reply.terminate) return 'stop';
        if (!appendObservation(ctx, 'user', [{ role: 'user', content: reply.content }], performance.now() - t0)) return 'max_tokens';
        userTurns++;
        continue;
      }
      return 'stop';
    }
  },
};

/** Messages in the event contract's shape (for TrajectoryStarted). */
export function toEventMessages(messages: readonly ChatMessage[]): Message[] {
  return messages.map((m) => ({
    role: m.role,
    content: m.content,
    tool_calls: (m.tool_calls ?? []).map((c, i) => ({
      id: c.id ?? `call_${i}`,
      name: c.function.name,
      arguments_json: typeof c.function.arguments === 'string' ? c.function.arguments : JSON.stringify(c.function.arguments),
    })),
    tool_call_id: m.tool_call_id ?? null,
    name: m.name ?? null,
  }));
}

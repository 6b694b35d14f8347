// Interactions: the user side of a multi-turn dialogue (verl's BaseInteraction). After an assistant
// turn without a tool call, the interaction reads the conversation and either ends it or answers as the
// user (the answer becomes a user turn with loss mask 0); each answer carries a turn reward.
import { objectShape, Registry } from '../../core/config/registry.ts';
import { gsm8kScore } from '../../core/tasks/gsm8k.ts';
import type { ChatMessage } from '../tokenizer/chat-tokenizer.ts';

export interface InteractionReply {
  terminate: boolean;
  /** The user's next message (ignored when terminate is true). */
  content: string;
  reward: number;
  metrics?: Record<string, number>;
}

export interface Interaction {
  readonly name: string;
  start?(instanceId: string, kwargs: Record<string, unknown>): Promise<void> | void;
  respond(instanceId: string, messages: readonly ChatMessage[], kwargs: Record<string, unknown>): Promise<InteractionReply> | InteractionReply;
  finish?(instanceId: string): Promise<void> | void;
}

/**
 * GSM8K / arithmetic user simulator, scoring as verl's current Gsm8kInteraction does: the last assistant message,
 * prefixed with `#### ` unless it starts with it, is scored by the GSM8K reward's flexible rule (the last
 * number in it; format score 0, score 1). A correct answer ends the dialogue with reward 1 ("Your response is
 * correct!"); otherwise the user asks for a reflection and another try, reward 0, until the turn limits stop
 * the loop.
 */
export class Gsm8kInteraction implements Interaction {
  readonly name: string;

  constructor(name = 'gsm8k') {
    this.name = name;
  }

  respond(_instanceId: string, messages: readonly ChatMessage[], kwargs: Record<string, unknown>): InteractionReply {
    const truth = String(kwargs['ground_truth'] ?? '');
    let lastAssistant = '';
    for (let i = messages.length - 1; i >= 0; i--) {
      if (messages[i]?.role === 'assistant') {
        lastAssistant = messages[i]!.content ?? '';
        break;
      }
    }
    const response = lastAssistant.startsWith('#### ') ? lastAssistant : `#### ${lastAssistant}`;
    const reward = gsm8kScore(response, truth, { method: 'flexible', formatScore: 0, score: 1 });
    if (reward === 1) return { terminate: true, content: 'Your response is correct!', reward };
    return { terminate: false, content: 'Your response is incorrect! You need to reflect on your answer and try again.', reward };
  }
}

/**
 * Interactions (user simulators) by name, as rows name them in extra_info.interaction_kwargs.name: the
 * built-in gsm8k, and a run's own (`rollout.interactions: {name: {module, export}}`, registered on the run's
 * interactions.copy()).
 */
export function interactionRegistry(): Registry<Interaction> {
  return new Registry<Interaction>('interaction', objectShape('an Interaction (an object with respond(), or a class of one)', ['respond'], { construct: true }));
}

export const interactions = interactionRegistry();

interactions.register('gsm8k', new Gsm8kInteraction());

// Interactions: the user side of a multi-turn dialogue (verl's BaseInteraction). After an assistant
// turn without a tool call, the interaction reads the conversation and either ends it or answers as the
// user (the answer becomes a user turn with loss mask 0); each answer carries a turn reward.
import { objectShape, Registry } from '../../core/config/registry.ts';
import { extractGsm8kAnswer } from '../../consumers/reward/gsm8k.ts';
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
 * GSM8K / arithmetic user simulator (verl's Gsm8kInteraction): the last assistant message, prefixed with
 * `#### ` unless it starts with it, is scored by the GSM8K reward's strict rule; a correct answer ends the
 * dialogue with reward 1, a wrong or missing one is met with "try again" and reward 0, until the turn limits
 * stop the loop.
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
        lastAssistant = messages[i]!.content;
        break;
      }
    }
    const response = lastAssistant.startsWith('#### ') ? lastAssistant : `#### ${lastAssistant}`;
    const answer = extractGsm8kAnswer(response, 'strict');
    if (answer !== null && answer === truth) return { terminate: true, content: 'Your answer is correct.', reward: 1 };
    const content =
      answer === null
        ? 'I could not find your final answer. Please end with a line of the form `#### <answer>`.'
        : 'Your answer is wrong. Check each step (use the calculator) and try again, ending with `#### <answer>`.';
    return { terminate: false, content, reward: 0 };
  }
}

/**
 * Interactions (user simulators) by name, as rows name them in extra_info.interaction_kwargs.name: the
 * built-in gsm8k, and a run's own (`rollout.interactions: {name: {module, export}}`, registered on the run's
 * interactions.copy()).
 */
export const interactions = new Registry<Interaction>('interaction', objectShape('an Interaction (an object with respond(), or a class of one)', ['respond'], { construct: true }));

interactions.register('gsm8k', new Gsm8kInteraction());

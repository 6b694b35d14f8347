// A synthetic but schema-valid training run: trajectories of alternating assistant/tool turns with tool calls
// (some failing, some unparseable), token/text mismatches, rewards (held-out split included), advantages,
// train steps and policy versions. Deterministic for a seed (ids derived, times computed), streamed as a
// generator so the benchmark can make a million turns without holding them. Used by tests and bench/traces.ts.
// Values are plain object literals without spreads, so each event type has one shape, as records decoded by
// the serde have: a spread gives large objects dictionary-mode properties, and reading those made the sink's
// row mapping several times slower in the benchmark than on decoded events.
import { deriveId } from '../core/ids.ts';
import { rng } from '../core/random.ts';
import { TOPICS } from '../core/topics.ts';
import type { EventName } from '../schemas/index.ts';
import type { EventTypes, ToolCallStatus, Trajectory } from '../schemas/generated/types.ts';

export interface SyntheticEvent<N extends EventName = EventName> {
  topic: string;
  key: string | null;
  name: N;
  value: EventTypes[N];
}

export interface SyntheticRunOptions {
  runId?: string;
  seed?: number;
  /** Prompt groups; each has groupSize trajectories. */
  groups: number;
  groupSize?: number;
  /** Assistant turns per trajectory (tool turns sit between them): turns = 2·n − 1. */
  assistantTurns?: number;
  tokensPerTurn?: number;
  /** A train step (and a new policy version) after this many trajectories. */
  trajectoriesPerStep?: number;
  startMs?: number;
}

const TOOLS = ['calculator', 'search', 'python'];
const STATUSES: [ToolCallStatus, number][] = [
  ['ok', 0.85],
  ['error', 0.05],
  ['timeout', 0.03],
  ['invalid_args', 0.05],
  ['unknown_tool', 0.02],
];

function pick(r: number): ToolCallStatus {
  let acc = 0;
  for (const [s, p] of STATUSES) if (r < (acc += p)) return s;
  return 'ok';
}

/** Turns a synthetic run of these options contains. */
export function syntheticTurnCount(o: SyntheticRunOptions): number {
  return o.groups * (o.groupSize ?? 4) * (2 * (o.assistantTurns ?? 3) - 1);
}

export function* syntheticRun(o: SyntheticRunOptions): Generator<SyntheticEvent> {
  const run = o.runId ?? 'run-synthetic';
  const random = rng(o.seed ?? 1);
  const groupSize = o.groupSize ?? 4;
  const assistantTurns = o.assistantTurns ?? 3;
  const tokens = o.tokensPerTurn ?? 16;
  const perStep = o.trajectoriesPerStep ?? 32;
  let now = o.startMs ?? Date.UTC(2026, 10, 1);
  const tick = () => (now += 1 + Math.floor(random() * 5));
  let version = 0;
  let step = 0;
  let batch: string[] = [];
  let batchTokens = 0;

  for (let g = 0; g < o.groups; g++) {
    const groupId = deriveId(run, 'group', g);
    const heldout = g % 10 === 9;
    const answer = String(g % 97);
    for (let s = 0; s < groupSize; s++) {
      const tid = deriveId(run, 'trajectory', g, s);
      const lag = Math.floor(random() * 3);
      const pv = Math.max(0, version - lag);
      const dataset = { name: 'calculator', split: heldout ? 'heldout' : 'train', index: g };
      const prompt = `What is ${g} mod 97? Use the calculator.`;
      const promptIds = Array.from({ length: 8 }, (_, i) => (g * 31 + i) % 50_000);
      const started = tick();
      // What TrajectoryStarted and the completed Trajectory both carry about the sample.
      const sample = {
        run_id: run,
        trajectory_id: tid,
        group_id: groupId,
        sample_index: s,
        group_size: groupSize,
        agent_name: 'tool_agent',
        data_source: 'calculator',
        dataset,
        ground_truth: answer,
        extra_info_json: '{}',
      };
      yield {
        topic: TOPICS.rolloutEvents,
        key: groupId,
        name: 'TrajectoryStarted',
        value: {
          event_id: deriveId(tid, 'started'),
          time_ms: started,
          ...sample,
          prompt_messages: [
            { role: 'system', content: 'You are a careful assistant.', tool_calls: [], tool_call_id: null, name: null },
            { role: 'user', content: prompt, tool_calls: [], tool_call_id: null, name: null },
          ],
          prompt_token_ids: promptIds,
          tools: TOOLS.map((name) => ({ name, description: `the ${name} tool`, parameters_json: '{"type":"object"}' })),
          sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 256, seed: null, stop_token_ids: [2] },
          policy_version: pv,
        },
      };

      const responseIds: number[] = [];
      const mask: number[] = [];
      const logprobs: number[] = [];
      const versions: number[] = [];
      const offsets: number[] = [];
      const roles: string[] = [];
      let text = '';
      let toolCalls = 0;
      let toolErrors = 0;
      let invalid = 0;
      let genMs = 0;
      let toolMs = 0;
      const correct = random() < 0.6;
      const turnsTotal = 2 * assistantTurns - 1;
      let pendingCall: { id: string; name: string; status: ToolCallStatus } | null = null;
      for (let t = 0; t < turnsTotal; t++) {
        const assistant = t % 2 === 0;
        const ids = Array.from({ length: tokens }, (_, i) => (t * 977 + i * 13 + g) % 50_000);
        const lp = assistant ? ids.map((_, i) => -((i % 50) + 1) / 100) : [];
        const m = ids.map(() => (assistant ? 1 : 0));
        const latency = assistant ? 20 + Math.floor(random() * 200) : 1 + Math.floor(random() * 50);
        const last = t === turnsTotal - 1;
        const parseError = assistant && !last && random() < 0.03;
        const turnText = assistant ? (last ? `The answer is ${correct ? answer : '0'}.` : `<tool_call>{"name":"calculator","arguments":{"expr":"${g} % 97"}}</tool_call>`) : pendingCall ? `result: ${answer}` : 'error: no call';
        const calls = assistant && !last && !parseError ? [{ id: deriveId(tid, 'call', t), name: TOOLS[(g + t) % TOOLS.length]!, arguments_json: `{"expr":"${g} % 97"}` }] : [];
        offsets.push(responseIds.length);
        roles.push(assistant ? 'assistant' : 'tool');
        responseIds.push(...ids);
        mask.push(...m);
        logprobs.push(...(assistant ? lp : ids.map(() => 0)));
        versions.push(...ids.map(() => (assistant ? pv : -1)));
        text += turnText;
        if (assistant) genMs += latency;
        yield {
          topic: TOPICS.rolloutEvents,
          key: groupId,
          name: 'TurnCompleted',
          value: {
            event_id: deriveId(tid, 'turn', t),
            time_ms: tick(),
            run_id: run,
            trajectory_id: tid,
            group_id: groupId,
            turn_index: t,
            role: assistant ? 'assistant' : 'tool',
            token_ids: ids,
            logprobs: lp,
            response_mask: m,
            text: turnText,
            tool_calls: calls,
            tool_call_parse_error: parseError ? 'expected , or } after arguments' : null,
            finish_reason: assistant ? (last ? 'stop' : 'tool_calls') : null,
            policy_version: assistant ? pv : -1,
            latency_ms: latency,
            server: assistant ? `sglang-${g % 2}` : null,
            tokenization_mismatch: random() < 0.01,
          },
        };
        if (calls[0]) {
          const status = pick(random());
          const latencyMs = 1 + Math.floor(random() * 80);
          toolCalls++;
          toolMs += latencyMs;
          if (status !== 'ok') toolErrors++;
          if (status === 'invalid_args') invalid++;
          pendingCall = { id: calls[0].id, name: calls[0].name, status };
          yield {
            topic: TOPICS.rolloutEvents,
            key: groupId,
            name: 'ToolCallCompleted',
            value: {
              event_id: deriveId(tid, 'tool', t),
              time_ms: tick(),
              run_id: run,
              trajectory_id: tid,
              group_id: groupId,
              turn_index: t,
              call_id: calls[0].id,
              tool_name: calls[0].name,
              arguments_json: calls[0].arguments_json,
              status,
              result_text: status === 'ok' ? answer : `${status}: failed`,
              latency_ms: latencyMs,
              reward: status === 'ok' ? 0.1 : 0,
              metrics: [],
            },
          };
        } else if (assistant) pendingCall = null;
      }

      const trajectory: Trajectory = {
        ...sample,
        prompt_ids: promptIds,
        response_ids: responseIds,
        response_mask: mask,
        response_logprobs: logprobs,
        response_policy_versions: versions,
        turn_offsets: offsets,
        turn_roles: roles,
        response_text: text,
        num_turns: turnsTotal,
        num_tool_calls: toolCalls,
        num_tool_errors: toolErrors,
        num_invalid_tool_calls: invalid,
        tool_rewards: [],
        interaction_rewards: [],
        termination: 'stop',
        min_policy_version: pv,
        max_policy_version: pv,
        started_ms: started,
        completed_ms: now,
        generation_ms: genMs,
        tool_ms: toolMs,
        external_reward: null,
      };
      yield { topic: TOPICS.rolloutEvents, key: groupId, name: 'TrajectoryCompleted', value: { event_id: deriveId(tid, 'completed'), time_ms: tick(), trajectory } };
      const reward = { score: correct ? 1 : 0, components: [{ name: 'outcome', value: correct ? 1 : 0 }], reward_fn: 'calculator', correct, token_rewards: null, exclude_from_loss: false };
      yield { topic: TOPICS.rewarded, key: groupId, name: 'RewardedTrajectory', value: { event_id: deriveId(tid, 'rewarded', 'calculator'), time_ms: tick(), trajectory, reward } };
      if (!heldout) {
        const adv = correct ? 0.5 : -0.5;
        yield {
          topic: TOPICS.advantaged,
          key: groupId,
          name: 'AdvantagedTrajectory',
          value: {
            event_id: deriveId(tid, 'advantaged', 'grpo'),
            time_ms: tick(),
            trajectory,
            reward,
            estimator: 'grpo',
            advantages: mask.map((x) => x * adv),
            returns: mask.map((x) => x * adv),
            group: { group_members: groupSize, expected_size: groupSize, reward_mean: 0.6, reward_std: 0.49, partial: false },
          },
        };
        batch.push(tid);
        batchTokens += responseIds.length;
      }
      if (batch.length >= perStep) {
        step++;
        const staleness = Math.round(random() * 200) / 100;
        yield {
          topic: TOPICS.trainSteps,
          key: run,
          name: 'TrainStep',
          value: {
            event_id: deriveId(run, 'step', step),
            time_ms: tick(),
            run_id: run,
            step,
            policy_version: version,
            produced_version: version + 1,
            trajectories: batch.length,
            tokens: batchTokens,
            trajectory_ids: batch,
            loss: 1 / step,
            pg_loss: 0.5 / step,
            kl: 0.01,
            entropy: 1.2,
            clip_fraction: 0.1,
            approx_kl: 0.005,
            grad_norm: 0.7,
            learning_rate: 1e-6,
            reward_mean: 0.6,
            staleness_mean: staleness,
            staleness_max: 2,
            iw_mean: 1,
            iw_max: 1.5,
            iw_truncated_fraction: 0.01,
            dropped_stale: 0,
            dropped_trajectory_ids: [],
            wait_ms: 5,
            compute_ms: 100,
            metrics: [{ name: 'tokens_per_s', value: 1000 }],
          },
        };
        version++;
        yield {
          topic: TOPICS.policyVersions,
          key: run,
          name: 'PolicyVersion',
          value: {
            event_id: deriveId(run, 'version', version),
            time_ms: tick(),
            run_id: run,
            policy_version: version,
            parent: version - 1,
            step,
            weights_uri: `file:///weights/${version}.safetensors`,
            checksum: deriveId('weights', version),
            format: 'safetensors',
            config_json: '{}',
            metrics: [],
          },
        };
        batch = [];
        batchTokens = 0;
      }
    }
  }
  yield {
    topic: TOPICS.control,
    key: run,
    name: 'Control',
    value: { event_id: deriveId(run, 'control', 'stop'), time_ms: tick(), run_id: run, command: 'stop', staleness_bound: null, reason: 'synthetic run finished', issued_by: 'test' },
  };
}

// A stand-in for a running job, for the admin tests: writes a synthetic but schema-valid stream of a run's
// events (rollout events keyed by group, train steps, evaluations, policy versions) into an event log over time, and the
// matching rows into a trace store (as the trace sink would). The interface is what the tests need from a
// "running run" — runId, step(), start()/stop(), trajectoryIds — so the real main job can replace it.
import { newId, deriveId } from '../../core/ids.ts';
import type { EventLog, Producer } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { TOPICS } from '../../core/topics.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import type { Evaluation, ToolCallCompleted, TrainStep, TrajectoryStarted, TurnCompleted } from '../../schemas/generated/types.ts';

export interface RunningRun {
  readonly runId: string;
  readonly trajectoryIds: string[];
  /** The Evaluation events written so far (on train.steps, with the steps). */
  readonly evaluations: Evaluation[];
  readonly stepsWritten: number;
  /** Write one training step's worth of events now. */
  step(): Promise<void>;
  /** Keep writing a step every intervalMs until stop(). */
  start(intervalMs: number): void;
  stop(): Promise<void>;
}

export interface SyntheticRunOptions {
  log: EventLog;
  serde: EventSerde;
  /** Where the trace rows go; omit when a real trace sink follows the log. */
  traces?: TraceStore;
  runId?: string;
  rolloutPartitions?: number;
  groupSize?: number;
}

const TOK = (s: string) => [...s].map((c) => c.charCodeAt(0));

export async function syntheticRun(o: SyntheticRunOptions): Promise<RunningRun> {
  const runId = o.runId ?? `run-${newId().slice(0, 8)}`;
  const groupSize = o.groupSize ?? 2;
  const topics = new Map((await o.log.listTopics()).map((t) => [t.name, t.partitions]));
  const ensure = async (name: string, partitions: number) => {
    if (!topics.has(name)) await o.log.createTopic({ name, partitions });
  };
  await ensure(TOPICS.rolloutEvents, o.rolloutPartitions ?? 4);
  await ensure(TOPICS.trainSteps, 1);
  await ensure(TOPICS.policyVersions, 1);
  await ensure(TOPICS.control, 1);
  const producer: Producer = await o.log.producer();
  const trajectoryIds: string[] = [];
  let stepNo = 0;
  const evaluations: Evaluation[] = [];
  let version = 0;
  let timer: NodeJS.Timeout | null = null;
  let inFlight: Promise<void> = Promise.resolve();

  async function trajectory(groupId: string, sample: number, now: number) {
    const id = deriveId(runId, groupId, sample);
    trajectoryIds.push(id);
    const a = 3 + stepNo;
    const b = 4 + sample;
    const started: TrajectoryStarted = {
      event_id: deriveId(id, 'start'), time_ms: now, run_id: runId, trajectory_id: id, group_id: groupId, sample_index: sample, group_size: groupSize,
      agent_name: 'tool_agent', data_source: 'calculator', dataset: { name: 'synthetic', split: 'train', index: stepNo },
      prompt_messages: [{ role: 'user', content: `What is ${a} * ${b}?`, tool_calls: [], tool_call_id: null, name: null }],
      prompt_token_ids: TOK(`What is ${a} * ${b}?`), tools: [{ name: 'calculator', description: 'evaluates arithmetic', parameters_json: '{"type":"object"}' }],
      sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 64, seed: null, stop_token_ids: [] }, policy_version: version,
      ground_truth: String(a * b), extra_info_json: '{}',
    };
    const callId = deriveId(id, 'call', 0).slice(0, 12);
    const args = JSON.stringify({ expression: `${a}*${b}` });
    const texts = [`<tool_call>${args}</tool_call>`, String(a * b), `The answer is ${a * b}.`];
    const roles = ['assistant', 'tool', 'assistant'] as const;
    const turns: TurnCompleted[] = texts.map((text, i) => {
      const ids = TOK(text);
      const gen = roles[i] === 'assistant';
      return {
        event_id: deriveId(id, 'turn', i), time_ms: now + i, run_id: runId, trajectory_id: id, group_id: groupId, turn_index: i, role: roles[i]!,
        token_ids: ids, logprobs: gen ? ids.map((_, k) => -0.1 - (k % 5) / 10) : [], response_mask: ids.map(() => (gen ? 1 : 0)), text,
        tool_calls: i === 0 ? [{ id: callId, name: 'calculator', arguments_json: args }] : [], tool_call_parse_error: null,
        finish_reason: gen ? 'stop' : null, policy_version: gen ? version : -1, latency_ms: 12.5, server: gen ? 'builtin' : null, tokenization_mismatch: false,
      };
    });
    const call: ToolCallCompleted = {
      event_id: deriveId(id, 'tool', callId), time_ms: now + 1, run_id: runId, trajectory_id: id, group_id: groupId, turn_index: 0, call_id: callId,
      tool_name: 'calculator', arguments_json: args, status: sample % 3 === 2 ? 'error' : 'ok', result_text: String(a * b), latency_ms: 3.25, reward: 0, metrics: [],
    };
    const key = groupId;
    const records = [
      { key, value: o.serde.encode('TrajectoryStarted', started) },
      ...turns.map((t) => ({ key, value: o.serde.encode('TurnCompleted', t) })),
      { key, value: o.serde.encode('ToolCallCompleted', call) },
    ];
    await producer.send(TOPICS.rolloutEvents, records);
    if (o.traces) {
      const t = now;
      await o.traces.insert('trajectory_starts', [{
        run_id: runId, trajectory_id: id, group_id: groupId, sample_index: sample, group_size: groupSize, agent_name: 'tool_agent', data_source: 'calculator',
        dataset_name: 'synthetic', split: 'train', dataset_index: stepNo, prompt_roles: ['user'], prompt_contents: [started.prompt_messages[0]!.content],
        prompt_token_ids: started.prompt_token_ids, tool_names: ['calculator'], tools_json: '[]', sampling_json: '{}', policy_version: version,
        ground_truth: started.ground_truth, extra_info_json: '{}', event_id: started.event_id, time: t, _version: t,
      }]);
      await o.traces.insert('turns', turns.map((u) => ({
        run_id: runId, trajectory_id: id, group_id: groupId, turn_index: u.turn_index, role: u.role, token_ids: u.token_ids, logprobs: u.logprobs,
        loss_mask: u.response_mask, num_tokens: u.token_ids.length, text: u.text, tool_call_ids: u.tool_calls.map((c) => c.id),
        tool_call_names: u.tool_calls.map((c) => c.name), tool_call_arguments: u.tool_calls.map((c) => c.arguments_json), tool_call_parse_error: null,
        finish_reason: u.finish_reason ?? '', policy_version: u.policy_version, latency_ms: u.latency_ms, server: u.server ?? '', tokenization_mismatch: 0,
        event_id: u.event_id, time: u.time_ms, _version: u.time_ms,
      })));
      await o.traces.insert('tool_calls', [{
        run_id: runId, trajectory_id: id, group_id: groupId, turn_index: 0, call_id: callId, tool_name: 'calculator', arguments_json: args, status: call.status,
        result_text: call.result_text, latency_ms: call.latency_ms, reward: 0, metric_names: [], metric_values: [], event_id: call.event_id, time: call.time_ms, _version: call.time_ms,
      }]);
      // Only the columns the admin reads; ClickHouse fills the others with defaults.
      await o.traces.insert('trajectories', [{
        run_id: runId, trajectory_id: id, group_id: groupId, sample_index: sample, group_size: groupSize, agent_name: 'tool_agent', data_source: 'calculator',
        num_turns: 3, num_tool_calls: 1, termination: 'stop', min_policy_version: version, max_policy_version: version, started: t, completed: t + 3,
        event_id: deriveId(id, 'done'), time: t + 3, _version: t + 3,
      }]);
      await o.traces.insert('rewards', [{
        run_id: runId, trajectory_id: id, group_id: groupId, reward_fn: 'calculator', score: sample % 2 ? 1 : 0, correct: sample % 2 ? 1 : 0, component_names: ['outcome'],
        component_values: [sample % 2 ? 1 : 0], token_rewards: [], agent_name: 'tool_agent', data_source: 'calculator', split: 'train', num_turns: 3,
        response_tokens: turns.reduce((n, u) => n + u.token_ids.length, 0), min_policy_version: version, max_policy_version: version, event_id: deriveId(id, 'reward'), time: t, _version: t,
      }]);
    }
  }

  /**
   * An Evaluation of `v` on 20 problems: solved 2 + 4v; a partial-credit reward (0.1 for a wrong answer) makes the
   * mean reward differ from the share solved, as it does for such a task.
   */
  async function evaluation(v: number, step: number | null, phase: string): Promise<void> {
    const solved = Math.min(20, 2 + 4 * v);
    const e: Evaluation = {
      event_id: newId(), time_ms: Date.now(), run_id: runId, policy_version: v, step, phase, problem_set: 'synthetic/heldout[0:20]', n: 20, solved,
      solved_rule: "the task's check", mean_reward: (solved + 0.1 * (20 - solved)) / 20, per_difficulty: [{ difficulty: 'medium', n: 20, solved, mean_reward: (solved + 0.1 * (20 - solved)) / 20 }], trajectory_ids: [],
    };
    evaluations.push(e);
    await producer.send(TOPICS.trainSteps, [{ key: runId, value: o.serde.encode('Evaluation', e) }]);
  }

  async function step(): Promise<void> {
    const now = Date.now();
    const groupId = deriveId(runId, 'group', stepNo);
    for (let s = 0; s < groupSize; s++) await trajectory(groupId, s, now);
    // Curves that move: reward and accuracy rise, KL and entropy drift, with a little deterministic wobble.
    const x = stepNo;
    const wobble = Math.sin(x * 1.7) * 0.03;
    const ts: TrainStep = {
      event_id: newId(), time_ms: now, run_id: runId, step: x, policy_version: version, produced_version: x % 2 === 1 ? version + 1 : null,
      trajectories: groupSize, tokens: 96 * groupSize, trajectory_ids: trajectoryIds.slice(-groupSize), loss: 0.9 / (1 + x / 5) + wobble,
      pg_loss: 0.5 / (1 + x / 5), kl: 0.002 * x + Math.abs(wobble) / 10, entropy: 2.1 - 0.03 * x + wobble, clip_fraction: 0.05, approx_kl: 0.001 * x,
      grad_norm: 1.2 + wobble, learning_rate: 1e-5, reward_mean: Math.min(1, 0.2 + 0.04 * x + wobble), staleness_mean: (x % 3) / 2, staleness_max: x % 3,
      iw_mean: 1, iw_max: 1.4, iw_truncated_fraction: 0.01, dropped_stale: 0, dropped_trajectory_ids: [], wait_ms: 5, compute_ms: 40,
      metrics: [],
    };
    // The warm start is evaluated before the first step, and each new version after the step that produced it.
    if (x === 0) await evaluation(0, 0, 'initial');
    await producer.send(TOPICS.trainSteps, [{ key: runId, value: o.serde.encode('TrainStep', ts) }]);
    // Its row as the trace sink writes it: the trajectories it trained on are named there.
    for (const r of rowsOf({ name: 'TrainStep', value: ts, schemaId: 0 })) await o.traces?.insert(r.table, [r.row]);
    if (ts.produced_version !== null) {
      version = ts.produced_version;
      await producer.send(TOPICS.policyVersions, [{
        key: runId,
        value: o.serde.encode('PolicyVersion', {
          event_id: newId(), time_ms: now, run_id: runId, policy_version: version, parent: version - 1, step: x, weights_uri: `file:///weights/${version}.safetensors`,
          checksum: deriveId('w', version).padEnd(64, '0'), format: 'safetensors', config_json: '{}', metrics: [],
        }),
      }]);
      // Odd versions leave the step out: a reader takes it from the version's PolicyVersion.
      await evaluation(version, version % 2 === 1 ? null : x, 'periodic');
    }
    stepNo++;
  }

  return {
    runId,
    trajectoryIds,
    evaluations,
    get stepsWritten() {
      return stepNo;
    },
    step: () => (inFlight = inFlight.then(step)),
    start(intervalMs) {
      timer = setInterval(() => void (inFlight = inFlight.then(step).catch(() => {})), intervalMs);
    },
    async stop() {
      if (timer) clearInterval(timer);
      timer = null;
      await inFlight.catch(() => {});
      await producer.close();
    },
  };
}

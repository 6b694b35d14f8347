// The rollout worker: termination rules (max turns, max tokens, tool-error limit), the staleness gate
// opened by verified PolicyVersion events, Control events, evaluation mode, aborting shutdown, and
// option errors. Uses the embedded log, the Qwen3 tokenizer and a ScriptedBackend (a test double).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, test } from 'node:test';
import { TOPICS } from '../../core/topics.ts';
import type { PolicyVersion, Trajectory } from '../../schemas/generated/types.ts';
import { ScriptedBackend, type ScriptAnswer, type ScriptTurn } from '../../producers/backends/scripted.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import { verifyPolicyVersion } from '../../producers/policy-sync.ts';
import { CalculatorTool } from '../../producers/tools/calculator.ts';
import { ToolSet } from '../../producers/tools/tool-set.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import { embeddedLog, qwen3, readTopic, rolloutOptionsFor, type RolloutSectionForTest, type TestLog } from './helpers.ts';
import { tempDir } from '../../testkit/events.ts';

function row(i: number, agent = 'tool_agent'): DatasetRow {
  return {
    data_source: 'arith',
    agent_name: agent,
    prompt: [{ role: 'user', content: `What is ${i} + ${i}?` }],
    reward_model: { ground_truth: String(2 * i), style: 'rule' },
    extra_info: { split: 'train', index: i },
  };
}

function worker(t: TestLog, script: (s: ScriptTurn) => ScriptAnswer, options: RolloutSectionForTest, extra: { latencyMs?: number; followPolicy?: boolean; runId?: string } = {}) {
  const tok = qwen3();
  const backend = new ScriptedBackend({ tokenizer: tok, script, latencyMs: extra.latencyMs });
  const w = new RolloutWorker(
    { runId: extra.runId ?? 'run-w', log: t.log, serde: t.serde, backend, tokenizer: tok, tools: new ToolSet({ defaultTimeoutMs: 2000 }).add(new CalculatorTool()), followPolicy: extra.followPolicy ?? false },
    rolloutOptionsFor({ tokenization_check: 'off', ...options }),
  );
  return { w, backend };
}

const callCalc = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>';
const until = async (cond: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not reached in time');
    await new Promise((r) => setTimeout(r, 10));
  }
};

describe('termination', () => {
  test('max assistant turns (verl counts both sides)', async () => {
    const t = await embeddedLog();
    try {
      const { w } = worker(t, () => callCalc, { max_assistant_turns: 3, staleness_bound: null });
      const [traj] = await w.evaluate([row(1)]);
      await w.stop();
      assert.equal(traj!.termination, 'max_turns');
      assert.deepEqual(traj!.turn_roles, ['assistant', 'tool', 'assistant', 'tool', 'assistant']);
      const { w: w2 } = worker(t, () => callCalc, { max_user_turns: 1, staleness_bound: null });
      const [t2] = await w2.evaluate([row(1)]);
      await w2.stop();
      assert.equal(t2!.termination, 'max_turns');
      assert.deepEqual(t2!.turn_roles, ['assistant', 'tool', 'assistant']);
    } finally {
      await t.cleanup();
    }
  });

  test('max response tokens: generation capped, response cut to the budget', async () => {
    const t = await embeddedLog();
    try {
      const { w, backend } = worker(t, () => `${callCalc} and some more words to spend tokens`, { response_length: 60, staleness_bound: null });
      const [traj] = await w.evaluate([row(2)]);
      await w.stop();
      assert.equal(traj!.termination, 'max_tokens');
      assert.ok(traj!.response_ids.length <= 60);
      assert.equal(traj!.response_mask.length, traj!.response_ids.length);
      for (const r of backend.requests) assert.ok(r.sampling.max_new_tokens <= 60);
      // The last request asked for no more than what was left.
      const last = backend.requests[backend.requests.length - 1]!;
      assert.ok(last.sampling.max_new_tokens <= 60 - (last.promptIds.length - traj!.prompt_ids.length));
    } finally {
      await t.cleanup();
    }
  });

  test('tool-error limit; unknown tools are answered, not fatal', async () => {
    const t = await embeddedLog();
    try {
      const { w } = worker(t, () => '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>', { max_tool_errors: 2, staleness_bound: null });
      const [traj] = await w.evaluate([row(3)]);
      const snap = w.snapshot();
      await w.stop();
      assert.equal(traj!.termination, 'tool_error_limit');
      assert.equal(traj!.num_tool_errors, 2);
      assert.equal(traj!.num_invalid_tool_calls, 2);
      assert.equal(snap.counters['tool_status_unknown_tool'], 2);
      assert.equal(snap.toolSuccessRate, 0);
    } finally {
      await t.cleanup();
    }
  });

  test('a backend failure ends the trajectory with termination error, the worker goes on', async () => {
    const t = await embeddedLog();
    try {
      const { w } = worker(t, ({ promptText }) => {
        if (promptText().includes('What is 5 ')) throw new Error('server exploded');
        return 'fine';
      }, { staleness_bound: null });
      const trajs = await w.evaluate([row(4), row(5), row(6)]);
      await w.stop();
      assert.deepEqual(trajs.map((x) => x.termination), ['stop', 'error', 'stop']);
    } finally {
      await t.cleanup();
    }
  });
});

async function policyVersion(dir: string, version: number, tamper = false): Promise<PolicyVersion> {
  const path = join(dir, `weights-${version}.safetensors`);
  writeFileSync(path, `weights of version ${version}`);
  const checksum = createHash('sha256').update(tamper ? 'something else' : `weights of version ${version}`).digest('hex');
  return { event_id: `pv-${version}`, time_ms: Date.now(), run_id: 'run-w', policy_version: version, parent: version - 1, step: version, weights_uri: pathToFileURL(path).href, checksum, format: 'safetensors', config_json: '{}', metrics: [] };
}

describe('staleness gate, policy versions, control', () => {
  test('groups wait for new policy versions (published to the log), checksums verified', async () => {
    const t = await embeddedLog();
    const dir = tempDir('weights');
    try {
      // bound 0, 2 groups per step: only 2 groups may start under version 0.
      const { w, backend } = worker(t, () => 'ok', { staleness_bound: 0, groups_per_step: 2, n: 2, poll_interval_ms: 20 }, { followPolicy: true });
      const running = w.run(Array.from({ length: 6 }, (_, i) => row(i, 'single_turn')));
      await until(() => w.snapshot().trajectoriesCompleted === 4 && w.snapshot().blockedBy === 'staleness');
      assert.equal(w.snapshot().groupsStarted, 2);
      const producer = await t.log.producer();
      // A tampered version is rejected: the gate stays shut.
      await producer.send(TOPICS.policyVersions, [{ key: 'run-w', value: t.serde.encode('PolicyVersion', await policyVersion(dir, 1, true)) }]);
      await until(() => (w.snapshot().counters['policy_update_failures'] ?? 0) === 1);
      assert.equal(w.snapshot().groupsStarted, 2);
      assert.equal(backend.currentPolicyVersion(), 0);
      // A good version opens it for two more groups.
      await producer.send(TOPICS.policyVersions, [{ key: 'run-w', value: t.serde.encode('PolicyVersion', await policyVersion(dir, 1)) }]);
      await until(() => w.snapshot().groupsStarted === 4 && w.snapshot().inflight === 0);
      assert.equal(backend.currentPolicyVersion(), 1);
      assert.equal(w.snapshot().blockedBy, 'staleness');
      // set_staleness through the control topic opens it for the rest.
      await producer.send(TOPICS.control, [{ key: 'run-w', value: t.serde.encode('Control', { event_id: 'c1', time_ms: Date.now(), run_id: 'run-w', command: 'set_staleness', staleness_bound: 5, reason: 'test', issued_by: null }) }]);
      await running;
      assert.equal(w.snapshot().groupsStarted, 6);
      await producer.close();
      await w.stop();
      const events = await readTopic(t, TOPICS.rolloutEvents, 6 * 2 * 3);
      const done = events.filter((e) => e.event.name === 'TrajectoryCompleted').map((e) => (e.event.value as { trajectory: Trajectory }).trajectory);
      assert.equal(done.length, 12);
      // The last groups were generated by version 1.
      assert.ok(done.some((x) => x.max_policy_version === 1));
    } finally {
      await t.cleanup();
    }
  });

  test('pause / resume / stop, and the in-flight budget', async () => {
    const t = await embeddedLog();
    try {
      const { w } = worker(t, () => 'ok', { staleness_bound: null, max_inflight_trajectories: 2, concurrency: 2 }, { latencyMs: 30 });
      w.pause();
      const rows = Array.from({ length: 50 }, (_, i) => row(i, 'single_turn'));
      const running = w.run(rows);
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(w.snapshot().groupsStarted, 0);
      assert.equal(w.snapshot().blockedBy, 'paused');
      w.resume();
      await until(() => w.snapshot().trajectoriesCompleted >= 3);
      assert.ok(w.snapshot().inflight <= 2);
      w.onControl({ event_id: 'c', time_ms: Date.now(), run_id: 'run-w', command: 'stop', staleness_bound: null, reason: null, issued_by: null });
      await running;
      const snap = w.snapshot();
      assert.ok(snap.groupsStarted < 50, 'stopped early');
      assert.equal(snap.trajectoriesCompleted, snap.groupsStarted, 'in-flight trajectories were finished');
      await w.stop();
    } finally {
      await t.cleanup();
    }
  });

  test('control on the log: commands of another run or of an earlier session are ignored, this session\'s apply', async () => {
    const t = await embeddedLog();
    try {
      const producer = await t.log.producer();
      const control = (id: string, runId: string, timeMs: number, command: 'stop' | 'pause') => ({ key: runId, value: t.serde.encode('Control', { event_id: id, time_ms: timeMs, run_id: runId, command, staleness_bound: null, reason: id, issued_by: null }) });
      // Before the worker exists: an earlier session's stop and pause, another run's stop, and bytes that are no event.
      await producer.send(TOPICS.control, [control('old-stop', 'run-w', Date.now() - 5000, 'stop'), control('old-pause', 'run-w', Date.now() - 5000, 'pause'), control('other', 'run-x', Date.now() + 60_000, 'stop'), { key: 'run-w', value: Buffer.from('junk') }]);
      const { w } = worker(t, () => 'ok', { staleness_bound: null, concurrency: 2, poll_interval_ms: 20 }, { latencyMs: 30, followPolicy: true });
      const running = w.run(Array.from({ length: 200 }, (_, i) => row(i, 'single_turn')));
      try {
        // A pause of this session, sent after the ones above: once it applies, the follower has read past them.
        await producer.send(TOPICS.control, [control('pause', 'run-w', Date.now(), 'pause')]);
        await until(() => (w.snapshot().counters['control_pause'] ?? 0) > 0);
        const counters = w.snapshot().counters;
        assert.equal(counters['control_stop'], undefined, 'no stop applied');
        assert.equal(counters['control_pause'], 1, 'only this session\'s pause applied');
        assert.equal(counters['undecodable_records'], 1);
        assert.equal(w.snapshot().blockedBy, 'paused');
        assert.ok(w.snapshot().trajectoriesStarted > 0 && w.snapshot().groupsStarted < 200);
        await producer.send(TOPICS.control, [control('stop', 'run-w', Date.now(), 'stop')]);
        await running;
        assert.equal(w.snapshot().counters['control_stop'], 1);
      } finally {
        await producer.close();
        await w.stop({ abort: true });
      }
    } finally {
      await t.cleanup();
    }
  });

  test('stop({abort}) ends in-flight trajectories with termination aborted, still published', async () => {
    const t = await embeddedLog();
    try {
      const { w } = worker(t, () => 'ok', { staleness_bound: null, concurrency: 4 }, { latencyMs: 10_000 });
      const running = w.run(Array.from({ length: 4 }, (_, i) => row(i, 'single_turn')));
      await until(() => w.snapshot().trajectoriesStarted === 4);
      await w.stop({ abort: true });
      await running;
      const events = await readTopic(t, TOPICS.rolloutEvents, 8);
      const done = events.filter((e) => e.event.name === 'TrajectoryCompleted').map((e) => (e.event.value as { trajectory: Trajectory }).trajectory);
      assert.equal(done.length, 4);
      assert.ok(done.every((x) => x.termination === 'aborted'));
    } finally {
      await t.cleanup();
    }
  });

  test('evaluation mode: held-out split, greedy, bypasses the gate', async () => {
    const t = await embeddedLog();
    try {
      const { w, backend } = worker(t, () => 'ok', { staleness_bound: 0, groups_per_step: 1, sampling: { temperature: 0.9 } });
      const trajs = await w.evaluate([row(1, 'single_turn'), row(2, 'single_turn'), row(3, 'single_turn')]);
      await w.stop();
      assert.equal(trajs.length, 3);
      assert.ok(trajs.every((x) => x.dataset.split === 'heldout'));
      assert.deepEqual(trajs.map((x) => x.ground_truth), ['2', '4', '6']);
      assert.ok(backend.requests.every((r) => r.sampling.temperature === 0));
      const started = (await readTopic(t, TOPICS.rolloutEvents, 9)).filter((e) => e.event.name === 'TrajectoryStarted');
      assert.ok(started.every((e) => (e.event.value as { dataset: { split: string } }).dataset.split === 'heldout'));
    } finally {
      await t.cleanup();
    }
  });
});

describe('options and policy sync', () => {
  test('holdingPolicy: no version is applied while an evaluation holds the backend; a pause sent meanwhile is still read', async () => {
    const t = await embeddedLog();
    const dir = tempDir('weights');
    try {
      const { w, backend } = worker(t, () => 'ok', { staleness_bound: null, poll_interval_ms: 20 }, { followPolicy: true });
      const running = w.run(Array.from({ length: 2 }, (_, i) => row(i, 'single_turn')));
      const producer = await t.log.producer();
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      const held = w.holdingPolicy(async (version) => {
        await producer.send(TOPICS.policyVersions, [{ key: 'run-w', value: t.serde.encode('PolicyVersion', await policyVersion(dir, 1)) }]);
        // The follower reads version 1 (and a pause sent meanwhile) but applies no version until the hold ends.
        await producer.send(TOPICS.control, [{ key: 'run-w', value: t.serde.encode('Control', { event_id: 'c-hold', time_ms: Date.now(), run_id: 'run-w', command: 'pause', staleness_bound: null, reason: 'test', issued_by: null }) }]);
        await until(() => w.snapshot().paused);
        assert.equal(backend.currentPolicyVersion(), version);
        await released;
        return version;
      });
      await new Promise((r) => setTimeout(r, 300));
      assert.equal(backend.currentPolicyVersion(), 0, 'still the held version');
      release();
      assert.equal(await held, 0);
      await until(() => backend.currentPolicyVersion() === 1);
      w.resume();
      await running;
      await producer.close();
      await w.stop();
    } finally {
      await t.cleanup();
    }
  });

  test('verifyPolicyVersion: sha256 and URI forms', async () => {
    const dir = tempDir('weights');
    const pv = await policyVersion(dir, 4);
    assert.equal((await verifyPolicyVersion(pv)).weightsPath, join(dir, 'weights-4.safetensors'));
    assert.equal((await verifyPolicyVersion({ ...pv, weights_uri: join(dir, 'weights-4.safetensors') })).version, 4);
    await assert.rejects(verifyPolicyVersion(await policyVersion(dir, 5, true)), /WEIGHTS|sha256/);
    await assert.rejects(verifyPolicyVersion({ ...pv, weights_uri: 's3://bucket/w' }), /only local paths/);
    await assert.rejects(verifyPolicyVersion({ ...pv, weights_uri: join(dir, 'missing') }), /not found/);
  });
});

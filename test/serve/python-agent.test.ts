// A Python agent written with the official `openai` package (test/serve/agent.py) drives multi-turn tool-calling
// conversations against `rlstream serve` with the built-in policy (the calculator's SFT checkpoint) and the
// reward, advantage and trainer roles in the same process: its trajectories are rewarded (by the task and by the
// agent), get advantages and are trained on; the token ids recorded are those the backend generated and the
// endpoint returned; the template re-tokenization check finds no mismatch. Skips only where no Python exists.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { it } from 'node:test';
import assert from 'node:assert/strict';
import { TOPICS } from '../../core/topics.ts';
import { MEDIUM, problems, take } from '../../examples/calculator/task.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import type { AdvantagedTrajectory, RewardedTrajectory, TrainStep, TrajectoryCompleted, TurnCompleted } from '../../schemas/generated/types.ts';
import { startServe, TOKEN, topicEvents } from './helpers.ts';

const ROOT = join(import.meta.dirname, '../..');
/** infra/setup.sh installs the openai package into this venv; a python3 with it installed works too. */
// Where infra/setup.sh installs it: RLSTREAM_INFRA_DIR (infra/env.sh), by default the checkout's .infra/.
const VENV_PYTHON = join(process.env['RLSTREAM_INFRA_DIR'] ?? join(ROOT, '.infra'), 'python/bin/python');

function findPython(): string | null {
  if (existsSync(VENV_PYTHON)) return VENV_PYTHON;
  return spawnSync('python3', ['--version']).status === 0 ? 'python3' : null;
}

const python = findPython();

interface AgentTrajectory {
  trajectory_id: string;
  group_id: string;
  served: number[][];
  termination: string;
  own_reward: number | null;
  tokenization_mismatches: number | null;
}

function run(cmd: string, args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

it('a Python openai agent against rlstream serve: recorded, rewarded, advantaged, trained on', { skip: python === null ? 'no python3 on this machine' : false, timeout: 600_000 }, async () => {
  const check = spawnSync(python!, ['-c', 'import openai']);
  assert.equal(check.status, 0, `the openai Python package is missing for ${python}: run infra/setup.sh (it installs it into .infra/python), or pip install openai\n${check.stderr}`);

  // What the backend generated, per trajectory and call, observed on the real built-in policy.
  const generated = new Map<string, number[][]>();
  const capture = (inner: LlmBackend): LlmBackend => ({
    name: inner.name,
    async generate(request, signal) {
      const out = await inner.generate(request, signal);
      const list = generated.get(request.sessionId!) ?? [];
      list.push([...out.tokenIds]);
      generated.set(request.sessionId!, list);
      return out;
    },
    releaseSession: (id) => inner.releaseSession?.(id),
    updatePolicy: (u) => inner.updatePolicy?.(u) ?? Promise.resolve(),
    currentPolicyVersion: () => inner.currentPolicyVersion(),
    close: () => inner.close(),
  });
  const { job, stop } = await startServe({ train: true, wrapBackend: capture, overrides: { 'trainer.max_steps': 2, 'trainer.groups_per_step': 2 } });
  try {
    const list = take(problems(11, 'train', MEDIUM), 4);
    const agent = await run(python!, [join(import.meta.dirname, 'agent.py')], {
      RLSTREAM_URL: job.url,
      RLSTREAM_TOKEN: TOKEN,
      RLSTREAM_MODEL: 'calculator',
      RLSTREAM_PROBLEMS: JSON.stringify(list.map((p) => ({ question: p.question, answer: p.answer }))),
      RLSTREAM_N: '2',
      RLSTREAM_MAX_TURNS: '3',
    });
    assert.equal(agent.code, 0, `agent.py failed:\n${agent.stderr}`);
    const trajectories = (JSON.parse(agent.stdout) as { trajectories: AgentTrajectory[] }).trajectories;
    assert.equal(trajectories.length, 8);
    assert.equal(new Set(trajectories.map((t) => t.group_id)).size, 4);

    // The trainer's run() resolves at trainer.max_steps: two steps of two groups each.
    await job.training;
    const ids = new Set(trajectories.map((t) => t.trajectory_id));

    const events = await topicEvents(job, TOPICS.rolloutEvents);
    const turns = events.filter((e) => e.name === 'TurnCompleted').map((e) => e.value as TurnCompleted).filter((t) => ids.has(t.trajectory_id));
    for (const t of trajectories) {
      const assistant = turns.filter((x) => x.trajectory_id === t.trajectory_id && x.role === 'assistant').sort((a, b) => a.turn_index - b.turn_index);
      // Recorded = returned to the agent = generated by the backend, call by call.
      assert.deepEqual(assistant.map((x) => x.token_ids), t.served, `trajectory ${t.trajectory_id}`);
      assert.deepEqual(generated.get(t.trajectory_id), t.served, `trajectory ${t.trajectory_id}`);
      if (t.tokenization_mismatches !== null) assert.equal(t.tokenization_mismatches, 0);
    }
    // Multi-turn: the policy called the calculator and the agent's results came back as masked tool turns.
    const toolTurns = turns.filter((t) => t.role === 'tool');
    assert.ok(toolTurns.length > 0, 'no tool turn was recorded');
    assert.ok(toolTurns.every((t) => t.response_mask.every((m) => m === 0)));
    // The re-tokenization check ran on every observation (tokenization_check_every 1) and found nothing.
    assert.ok(turns.every((t) => !t.tokenization_mismatch));
    assert.equal(job.service.counters.get('tokenization_checks'), toolTurns.length);
    assert.equal(job.service.counters.get('tokenization_mismatches'), 0);
    const completed = events.filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory).filter((t) => ids.has(t.trajectory_id));
    assert.equal(completed.length, 8);
    for (const c of completed) assert.deepEqual(c.response_ids, turns.filter((t) => t.trajectory_id === c.trajectory_id).sort((a, b) => a.turn_index - b.turn_index).flatMap((t) => t.token_ids));

    // Rewarded: by the agent where it gave a reward, by the task's reward function otherwise.
    const rewarded = (await topicEvents(job, TOPICS.rewarded)).map((e) => e.value as RewardedTrajectory).filter((r) => ids.has(r.trajectory.trajectory_id));
    assert.equal(rewarded.length, 8);
    for (const t of trajectories) {
      const r = rewarded.find((x) => x.trajectory.trajectory_id === t.trajectory_id)!;
      if (t.own_reward !== null) {
        assert.equal(r.reward.score, t.own_reward);
        assert.equal(r.reward.reward_fn, 'external');
      } else assert.equal(r.reward.reward_fn, 'rlstream/calculator');
    }
    const advantaged = (await topicEvents(job, TOPICS.advantaged)).map((e) => e.value as AdvantagedTrajectory).filter((a) => ids.has(a.trajectory.trajectory_id));
    assert.equal(advantaged.length, 8);
    const steps = (await topicEvents(job, TOPICS.trainSteps)).map((e) => e.value as TrainStep);
    assert.ok(steps.length >= 2, `trainer steps: ${steps.length}`);
    const trained = new Set(steps.flatMap((s) => s.trajectory_ids));
    for (const id of ids) assert.ok(trained.has(id), `trajectory ${id} was not trained on`);
    // The endpoint follows the versions the trainer publishes: its next calls are served by the trained policy.
    const newest = Math.max(...steps.map((s) => s.produced_version ?? 0));
    assert.ok(newest >= 1, 'the trainer published no policy version');
    for (let i = 0; i < 200 && job.backend.currentPolicyVersion() < newest; i++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(job.backend.currentPolicyVersion(), newest);
  } finally {
    await stop();
  }
});

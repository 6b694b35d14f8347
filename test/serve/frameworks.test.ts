// Agents written with real frameworks from PyPI (test/serve/frameworks.py: the official `openai` client, LangGraph's
// create_react_agent on langchain-openai, the OpenAI Agents SDK) against `rlstream serve` with the built-in policy
// (the calculator's SFT checkpoint) and the reward, advantage and trainer roles in the same process. Nothing names
// a trajectory: each conversation must be exactly one trajectory, every model call a turn of it (its context the
// recorded token ids), and the trainer must train on them. The frameworks come from infra/setup.sh's
// .infra/pyagents; without them the test skips, unless RLSTREAM_REQUIRE_SERVICES=1.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { it } from 'node:test';
import assert from 'node:assert/strict';
import { TOPICS } from '../../core/topics.ts';
import { MEDIUM, problems, take } from '../../examples/calculator/task.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import type { TrainStep, TrajectoryCompleted, TrajectoryStarted, TurnCompleted } from '../../schemas/generated/types.ts';
import { startServe, TOKEN, topicEvents } from './helpers.ts';

// Where infra/setup.sh installs it: RLSTREAM_INFRA_DIR (infra/env.sh), by default the checkout's .infra/.
const PYTHON = join(process.env['RLSTREAM_INFRA_DIR'] ?? join(import.meta.dirname, '../../.infra'), 'pyagents/bin/python');
const FRAMEWORKS = ['openai', 'langgraph', 'agents'] as const;
const PER_FRAMEWORK = 2;

function missing(): string | null {
  if (!existsSync(PYTHON)) return `${PYTHON} is missing: run infra/setup.sh`;
  const check = spawnSync(PYTHON, ['-c', 'import openai, langgraph.prebuilt, langchain_openai, agents']);
  return check.status === 0 ? null : `the agent frameworks do not import: ${check.stderr.toString().slice(-400)}`;
}

const why = missing();
const required = process.env['RLSTREAM_REQUIRE_SERVICES'] === '1';

function run(args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(PYTHON, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

it('openai, LangGraph and openai-agents agents: one trajectory per conversation without naming anything, trained on', { skip: why !== null && !required ? why : false, timeout: 900_000 }, async () => {
  assert.equal(why, null, why ?? '');
  // The context of every generate call, per trajectory, as the backend received it.
  const contexts = new Map<string, number[][]>();
  const capture = (inner: LlmBackend): LlmBackend => ({
    name: inner.name,
    async generate(request, signal) {
      const list = contexts.get(request.sessionId!) ?? [];
      list.push([...request.promptIds]);
      contexts.set(request.sessionId!, list);
      return inner.generate(request, signal);
    },
    releaseSession: (id) => inner.releaseSession?.(id),
    updatePolicy: (u) => inner.updatePolicy?.(u) ?? Promise.resolve(),
    currentPolicyVersion: () => inner.currentPolicyVersion(),
    close: () => inner.close(),
  });
  const total = FRAMEWORKS.length * PER_FRAMEWORK;
  // Greedy decoding: the checkpoint then calls the calculator on these problems every time, so each framework's
  // conversations go past their first call (the case a re-serialising client breaks) without depending on luck.
  const { job, stop } = await startServe({ train: true, wrapBackend: capture, overrides: { 'trainer.max_steps': total / 2, 'trainer.groups_per_step': 2, 'rollout.sampling.temperature': 0 } });
  try {
    const list = take(problems(23, 'train', MEDIUM), total);
    const conversations: { framework: string; calls: string[]; termination: string | null }[] = [];
    for (const [k, framework] of FRAMEWORKS.entries()) {
      const mine = list.slice(k * PER_FRAMEWORK, (k + 1) * PER_FRAMEWORK);
      const agent = await run([join(import.meta.dirname, 'frameworks.py')], {
        RLSTREAM_URL: job.url,
        RLSTREAM_TOKEN: TOKEN,
        RLSTREAM_MODEL: 'calculator',
        RLSTREAM_PROBLEMS: JSON.stringify(mine.map((p) => ({ question: p.question, answer: p.answer }))),
        RLSTREAM_MAX_TURNS: '3',
        FRAMEWORK: framework,
      });
      assert.equal(agent.code, 0, `${framework} failed:\n${agent.stderr.slice(-3000)}`);
      for (const c of (JSON.parse(agent.stdout) as { conversations: { calls: string[]; termination: string | null }[] }).conversations) conversations.push({ framework, ...c });
    }
    assert.equal(conversations.length, total);
    for (const c of conversations) {
      assert.ok(c.calls.length >= 1, `${c.framework}: no model call`);
      assert.equal(new Set(c.calls).size, 1, `${c.framework}: one conversation was served by ${new Set(c.calls).size} trajectories: ${c.calls.join(' ')}`);
    }
    // The policy called the calculator: conversations of several calls, the case a re-serialising client breaks.
    for (const f of FRAMEWORKS) assert.ok(conversations.some((c) => c.framework === f && c.calls.length >= 2), `${f}: no conversation went past its first call`);
    const ids = conversations.map((c) => c.calls[0]!);
    assert.equal(new Set(ids).size, total, 'two conversations shared a trajectory');

    await job.training;
    const events = await topicEvents(job, TOPICS.rolloutEvents);
    // No trajectory besides the conversations' (none opened by a call that failed to continue its own).
    const started = events.filter((e) => e.name === 'TrajectoryStarted').map((e) => e.value as TrajectoryStarted);
    assert.deepEqual(started.map((s) => s.trajectory_id).sort(), [...ids].sort());
    const turns = events.filter((e) => e.name === 'TurnCompleted').map((e) => e.value as TurnCompleted);
    for (const [i, c] of conversations.entries()) {
      const id = ids[i]!;
      const mine = turns.filter((t) => t.trajectory_id === id).sort((a, b) => a.turn_index - b.turn_index);
      // Every model call of the conversation is an assistant turn of its trajectory.
      assert.equal(mine.filter((t) => t.role === 'assistant').length, c.calls.length, `${c.framework} ${id}`);
      // Each call's context was the recorded ids: the prompt, then every turn before it, as recorded.
      const s = started.find((x) => x.trajectory_id === id)!;
      let context = [...s.prompt_token_ids];
      let call = 0;
      for (const t of mine) {
        if (t.role === 'assistant') assert.deepEqual(contexts.get(id)![call++], context, `${c.framework} ${id}: call ${call} context`);
        context = context.concat(t.token_ids);
      }
    }
    const completed = events.filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory);
    assert.deepEqual(completed.map((t) => t.trajectory_id).sort(), [...ids].sort());
    for (const t of completed) assert.notEqual(t.termination, 'aborted');
    const steps = (await topicEvents(job, TOPICS.trainSteps)).map((e) => e.value as TrainStep);
    const trained = new Set(steps.flatMap((s) => s.trajectory_ids));
    for (const [i, id] of ids.entries()) assert.ok(trained.has(id), `${conversations[i]!.framework}'s trajectory ${id} was not trained on`);
  } finally {
    await stop();
  }
});

// The endpoint as a role of the main job: `rlstream run` (runMainJob, in this process) on the calculator config
// with serve.enabled, the built-in policy and the embedded log. While the run's own rollouts go on, an HTTP
// client (Node's fetch, as any agent) reads the URL and token from <run dir>/serve-url, completes a group of two
// trajectories through the endpoint (a tool turn included when the model calls the tool) and rewards them; the
// run's trainer then trains on them beside its own groups, and the endpoint is closed when the run ends.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { runMainJob } from '../../cli/run/main-job.ts';
import { silentLogger } from '../../core/telemetry.ts';
import type { TrainStep } from '../../schemas/generated/types.ts';
import { CONFIG } from './helpers.ts';

const CALCULATOR = { type: 'function', function: { name: 'calculator', description: 'Evaluate an arithmetic expression exactly.', parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } } };
const MAX_STEPS = 16;
const PROMPT = [{ role: 'user', content: 'Tom has 12 apples. Tom gets 7 more. How many apples does Tom have now?' }];

interface Choice {
  message: { role: string; content: string | null; tool_calls?: { id: string; function: { name: string; arguments: string } }[] };
  rlstream: { trajectory_id: string; group_id: string; token_ids: number[]; completed: string | null };
}

async function waitForFile(dir: string, name: string, timeoutMs: number): Promise<string> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    for (const run of existsSync(dir) ? readdirSync(dir) : []) if (existsSync(join(dir, run, name))) return join(dir, run, name);
    await sleep(50);
  }
  throw new Error(`no ${name} under ${dir} after ${timeoutMs} ms`);
}

test('rlstream run with serve.enabled: an outside client completes a group through the endpoint while the run goes on, and the trainer trains on it', { timeout: 240_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-serve-role-'));
  const steps: TrainStep[] = [];
  try {
    const running = runMainJob({
      configPath: CONFIG,
      overrides: {
        'run.data_dir': dir,
        'traces.kind': 'none',
        'serve.enabled': true,
        'trainer.max_steps': MAX_STEPS,
        'trainer.groups_per_step': 2,
        // The run's own rollouts go slowly enough that the trainer waits for data: the endpoint's group is then
        // trained within a step or two of being advantaged, well inside the staleness bound, instead of queueing
        // behind groups generated ahead (and being dropped as stale when the steps run fast).
        'trainer.staleness_bound': 4,
        'rollout.n': 4,
        'rollout.concurrency': 2,
        'task.heldout_problems': 4,
        'eval.problems': 2,
        'eval.every_steps': 100,
      },
      admin: false,
      progress: false,
      initialEval: false,
      logger: silentLogger,
      onTrainStep: (s) => steps.push(s),
    });
    const failed = running.then(() => new Error('the run ended before it served'), (err: unknown) => err);
    const file = await Promise.race([waitForFile(dir, 'serve-url', 120_000), failed.then((err) => Promise.reject(err))]);
    assert.equal(statSync(file).mode & 0o777, 0o600, 'the token file is readable by its owner only');
    const env = Object.fromEntries(readFileSync(file, 'utf8').trim().split('\n').map((l) => l.split(/=(.*)/s).slice(0, 2) as [string, string]));
    const base = env['OPENAI_BASE_URL']!;
    const key = env['OPENAI_API_KEY']!;
    assert.match(base, /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    assert.ok(key && key.length >= 20, 'a generated token');

    const post = async (path: string, body: unknown, headers: Record<string, string> = {}) => {
      const res = await fetch(base + path, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
      const text = await res.text();
      assert.equal(res.status, 200, `${path}: ${text}`);
      return JSON.parse(text) as Record<string, unknown>;
    };
    assert.equal((await fetch(`${base}/models`)).status, 401, 'the role authenticates as rlstream serve does');

    const first = await post('/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR], n: 2 });
    const choices = first['choices'] as Choice[];
    assert.equal(choices.length, 2);
    const ids = choices.map((c) => c.rlstream.trajectory_id);
    const open: boolean[] = [];
    for (const c of choices) {
      assert.ok(c.rlstream.token_ids.length > 0);
      let stillOpen = c.rlstream.completed === null;
      const call = c.message.tool_calls?.[0];
      if (call && stillOpen) {
        // The tool result comes from the client, as an outside agent's own tool would give it.
        const next = await post('/chat/completions', { model: 'calculator', messages: [...PROMPT, c.message, { role: 'tool', tool_call_id: call.id, content: '19' }], tools: [CALCULATOR] }, { 'x-rlstream-trajectory': c.rlstream.trajectory_id });
        stillOpen = (next['choices'] as Choice[])[0]!.rlstream.completed === null;
      }
      open.push(stillOpen);
    }
    // Unequal rewards, so the group has non-zero advantages to train on. A trajectory whose response budget ran
    // out was completed by the endpoint already (and is scored by the reward consumer from the task).
    const done = await Promise.all(ids.map((id, i) => (open[i] ? post(`/trajectories/${id}/complete`, { reward: i === 0 ? 1 : 0 }) : null)));
    for (const d of done) if (d) assert.equal(d['tokenization_mismatches'], 0);
    assert.equal(steps.length < MAX_STEPS, true, `the group was completed while the run went on (steps so far: ${steps.length})`);

    const summary = await running;
    assert.equal(summary.steps, MAX_STEPS);
    const trained = steps.flatMap((s) => s.trajectory_ids);
    for (const id of ids) assert.ok(trained.includes(id), `trajectory ${id} was trained on (steps: ${steps.map((s) => s.trajectory_ids.length).join(', ')})`);
    // The run's own rollouts trained too: the endpoint's group joined them rather than replacing them.
    assert.ok(trained.length > ids.length);
    // Stopped with the run: nothing listens any more.
    await assert.rejects(fetch(`${base}/models`, { headers: { authorization: `Bearer ${key}` } }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

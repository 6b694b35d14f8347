// docs/tasks.md is a working task: its files (each fenced block after a `<!-- file: NAME -->` line) are
// written to a temporary directory outside the checkout, `config check` passes on them, and the main job
// trains two steps on them with the built-in policy — dataset, reward module and tool YAML reached through
// the config alone.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkConfig } from '../../cli/run/preflight.ts';
import { runMainJob } from '../../cli/run/main-job.ts';

const ROOT = join(import.meta.dirname, '..', '..');

function docFiles(): Map<string, string> {
  const text = readFileSync(join(ROOT, 'docs', 'tasks.md'), 'utf8');
  const files = new Map<string, string>();
  for (const m of text.matchAll(/<!-- file: (\S+) -->\n```\w*\n([\s\S]*?)```/g)) files.set(m[1]!, m[2]!);
  return files;
}

test('the task of docs/tasks.md checks and trains two steps from its own directory', { timeout: 300_000 }, async () => {
  const files = docFiles();
  assert.deepEqual([...files.keys()].sort(), ['config.yaml', 'heldout.jsonl', 'reward.ts', 'tools.yaml', 'train.jsonl']);
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-own-task-'));
  try {
    for (const [name, body] of files) writeFileSync(join(dir, name), name === 'config.yaml' ? body.replaceAll('RLSTREAM', ROOT) : body);
    const config = join(dir, 'config.yaml');
    assert.deepEqual((await checkConfig(config, {})).problems, []);
    const summary = await runMainJob({ configPath: config, overrides: { 'trainer.max_steps': 2 }, admin: false, progress: false });
    assert.equal(summary.steps, 2);
    assert.equal(summary.heldout_problems, 2);
    assert.equal(summary.trajectories, 2 * 2 * 4);
    assert.ok(summary.data_dir.startsWith(join(dir, '.rlstream')));
    // The tool set of tools.yaml reached the agent: the model called its calculator successfully in one of the two
    // steps (16 sampled trajectories a step; one step alone can miss it).
    assert.ok(summary.tool_success_rate_first > 0 || summary.tool_success_rate_last > 0, 'the calculator from tools.yaml was called');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

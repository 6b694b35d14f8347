// Evaluation events reach the trace tables: the sink writes each one published on train.steps (by the main job's
// own publisher) as an `evaluations` row, once however often it was sent, and `rlstream query` selects them, by
// SQL and by the named query. On chDB always, and on the ClickHouse server (18.16's dialect) where one is set.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { runNamed } from '../../core/traces/queries.ts';
import { TraceSink } from '../../consumers/traces/sink.ts';
import { publishEvaluation } from '../../cli/run/evaluation.ts';
import { ensureTopics } from '../../cli/run/context.ts';
import type { Evaluation } from '../../schemas/generated/types.ts';
import { targets } from './targets.ts';

const ROOT = join(import.meta.dirname, '..', '..');

function evaluation(version: number, solved: number, phase: string, per: Evaluation['per_difficulty'] = []): Evaluation {
  return {
    event_id: `eval-${version}-${phase}`,
    time_ms: 1_790_000_000_000 + version,
    run_id: 'evals',
    policy_version: version,
    step: version === 7 ? null : version,
    phase,
    problem_set: 'calculator/heldout[0:200]',
    n: 200,
    solved,
    solved_rule: "the task's own check",
    mean_reward: solved / 200 + 0.001,
    per_difficulty: per,
    trajectory_ids: [`t-${version}-a`, `t-${version}-b`],
  };
}

const EVENTS = [
  evaluation(0, 16, 'initial'),
  evaluation(10, 66, 'periodic', [
    { difficulty: 'easy', n: 120, solved: 50, mean_reward: 0.42 },
    { difficulty: 'medium', n: 80, solved: 16, mean_reward: 0.2 },
  ]),
  evaluation(7, 3, 'checkpoint'),
];

for (const target of targets()) {
  test(`${target.name}: the sink writes every Evaluation once and query selects it`, { skip: target.skip ?? false, timeout: 120_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-evaluations-'));
    const log = openEmbeddedLog({ dir, fsync: 'none' });
    const registry = await EmbeddedRegistry.open(log);
    const serde = await new EventSerde(registry).init();
    const store = await target.open('evaluations');
    try {
      await ensureTopics(log);
      // The second send of the periodic one is a producer's retry: one row all the same.
      for (const e of [...EVENTS, EVENTS[1]!]) await publishEvaluation({ log, serde }, e);
      const sink = new TraceSink({ log, store, serde, groupId: 'traces' });
      await sink.drain();
      await sink.stop();
      assert.equal(sink.stats.records, 4);
      assert.equal(sink.stats.deadLetters, 0);
      const rows = (await store.queryReadonly('SELECT policy_version, step, phase, n, solved, solved / n AS accuracy, difficulty_names, difficulty_solved, length(trajectory_ids) AS t FROM evaluations FINAL ORDER BY policy_version')).rows;
      assert.deepEqual(
        rows.map((r) => [Number(r['policy_version']), r['step'] === null ? null : Number(r['step']), r['phase'], Number(r['n']), Number(r['solved']), r['accuracy'], r['difficulty_names'], (r['difficulty_solved'] as unknown[]).map(Number), Number(r['t'])]),
        [
          [0, 0, 'initial', 200, 16, 0.08, [], [], 2],
          [7, null, 'checkpoint', 200, 3, 0.015, [], [], 2],
          [10, 10, 'periodic', 200, 66, 0.33, ['easy', 'medium'], [50, 16], 2],
        ],
      );
      const named = (await runNamed(store, 'evaluations', { run: 'evals' }, { maxRows: 100, maxSeconds: 30, overflow: 'throw' })).rows;
      assert.deepEqual(named.map((r) => [Number(r['policy_version']), r['phase'], r['accuracy'], r['mean_reward']]), [
        [0, 'initial', 0.08, 0.081],
        [7, 'checkpoint', 0.015, 0.016],
        [10, 'periodic', 0.33, 0.331],
      ]);
      assert.deepEqual((await runNamed(store, 'evaluations', { run: 'other' })).rows, []);
    } finally {
      await store.close();
      await registry.close();
      await log.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

test('rlstream query selects evaluations from a run\'s chDB store', { timeout: 120_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-evaluations-cli-'));
  const log = openEmbeddedLog({ dir: join(dir, 'log'), fsync: 'none' });
  const registry = await EmbeddedRegistry.open(log);
  const serde = await new EventSerde(registry).init();
  try {
    const store = await openTraceStore(`chdb:${join(dir, 'chdb')}`);
    try {
      await ensureTopics(log);
      for (const e of EVENTS) await publishEvaluation({ log, serde }, e);
      const sink = new TraceSink({ log, store, serde, groupId: 'traces' });
      await sink.drain();
      await sink.stop();
    } finally {
      await store.close();
    }
    const cli = (args: string[]) => spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'cli', 'main.ts'), 'query', '--store', `chdb:${join(dir, 'chdb')}`, '--format', 'json', ...args], { encoding: 'utf8', cwd: ROOT });
    const sql = cli(["SELECT policy_version, solved, n FROM evaluations FINAL WHERE phase = 'periodic'"]);
    assert.equal(sql.status, 0, sql.stderr);
    assert.deepEqual((JSON.parse(sql.stdout) as Record<string, unknown>[]).map((r) => [Number(r['policy_version']), Number(r['solved']), Number(r['n'])]), [[10, 66, 200]]);
    const named = cli(['--named', 'evaluations']);
    assert.equal(named.status, 0, named.stderr);
    assert.deepEqual((JSON.parse(named.stdout) as Record<string, unknown>[]).map((r) => [Number(r['policy_version']), r['accuracy']]), [[0, 0.08], [7, 0.015], [10, 0.33]]);
  } finally {
    await registry.close();
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

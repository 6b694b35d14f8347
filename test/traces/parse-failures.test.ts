// tool_parse_failures must answer from each turn's latest version
// (a newer NULL error hides an older one, a newer error replaces an older one), exactly as FINAL would; so must
// the other top-N questions over turns (18.16 runs them in two passes: keys first, then their columns).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runNamed } from '../../core/traces/queries.ts';
import type { Row } from '../../core/traces/store.ts';
import { targets } from './targets.ts';

const FINAL_SQL = `SELECT run_id, trajectory_id, turn_index, tool_call_parse_error AS error, substring(text, 1, 200) AS text, policy_version, time
FROM turns FINAL WHERE isNotNull(tool_call_parse_error) ORDER BY time DESC, trajectory_id, turn_index LIMIT 100`;

function turn(id: string, index: number, error: string | null, version: number, extra: Row = {}): Row {
  return {
    run_id: 'r', trajectory_id: id, group_id: 'g', turn_index: index, role: 'assistant', token_ids: [1], logprobs: [-1], loss_mask: [1], num_tokens: 1,
    text: `${id}/${index} v${version}`, tool_call_ids: [], tool_call_names: [], tool_call_arguments: [], tool_call_parse_error: error, finish_reason: 'stop',
    policy_version: version, latency_ms: 1, server: 's', tokenization_mismatch: 0, event_id: `${id}-${index}-${version}`, time: Date.UTC(2026, 10, 1, 0, 0, version), _version: Date.UTC(2026, 10, 1, 0, 0, version),
    ...extra,
  };
}

for (const target of targets()) {
  test(`${target.name}: tool_parse_failures answers from the latest version of each turn`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('pf');
    try {
      // Separate inserts, so the versions sit in different parts (nothing merged yet).
      await store.insert('turns', [turn('a', 0, 'bad json', 1), turn('b', 0, null, 1), turn('c', 0, 'old', 1), turn('d', 1, 'kept', 4), turn('e', 0, null, 1)]);
      await store.insert('turns', [turn('a', 0, null, 2), turn('b', 0, 'new error', 3), turn('c', 0, 'newer', 5)]);
      const res = await runNamed(store, 'tool_parse_failures', {});
      assert.deepEqual(
        res.rows.map((r) => [r['trajectory_id'], r['error'], r['text'], r['policy_version']]),
        [['c', 'newer', 'c/0 v5', 5], ['d', 'kept', 'd/1 v4', 4], ['b', 'new error', 'b/0 v3', 3]],
      );
      assert.deepEqual(res.rows, (await store.query(FINAL_SQL)).rows, 'same rows as FINAL');
      assert.deepEqual((await runNamed(store, 'tool_parse_failures', { run: 'other' })).rows, []);
    } finally {
      await store.close();
    }
  });
}

for (const target of targets()) {
  test(`${target.name}: tokenization_mismatches and slowest_turns answer from the latest version of each turn`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('topn');
    try {
      // An old version that was slowest / mismatched and a newer one that is not; ties broken by the key.
      await store.insert('turns', [
        turn('a', 0, null, 1, { latency_ms: 900, tokenization_mismatch: 1 }),
        turn('b', 0, null, 1, { latency_ms: 50 }),
        turn('c', 0, null, 1, { latency_ms: 70, tokenization_mismatch: 1 }),
        turn('d', 2, null, 1, { latency_ms: 70 }),
      ]);
      await store.insert('turns', [turn('a', 0, null, 2, { latency_ms: 10 }), turn('b', 0, null, 3, { latency_ms: 80, tokenization_mismatch: 1 })]);
      const slow = await runNamed(store, 'slowest_turns', { limit: 3 });
      assert.deepEqual(
        slow.rows.map((r) => [r['trajectory_id'], r['latency_ms'], r['policy_version']]),
        [['b', 80, 3], ['c', 70, 1], ['d', 70, 1]],
      );
      const mism = await runNamed(store, 'tokenization_mismatches', { run: 'r' });
      assert.deepEqual(
        mism.rows.map((r) => [r['trajectory_id'], r['text']]),
        [['b', 'b/0 v3'], ['c', 'c/0 v1']],
      );
      assert.deepEqual((await runNamed(store, 'tokenization_mismatches', { limit: 1 })).rows.map((r) => r['trajectory_id']), ['b']);
    } finally {
      await store.close();
    }
  });
}

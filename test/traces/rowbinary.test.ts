// The RowBinary insert path stores exactly what the JSONEachRow path stores: every table of a synthetic run
// (nulls, empty arrays, unicode, times) plus edge rows, inserted both ways into two databases of the same
// target and read back with SELECT * in key order; and bad values are refused with the column named. On chDB
// with the addon built, the binary inserts reach the engine as Native blocks converted from the RowBinary
// (test/native/without-addon.test.ts runs this file without it, where they stay RowBinary).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRlstreamError } from '../../core/errors.ts';
import { TRACE_TABLES, toJsonEachRow, type Row, type TraceTable } from '../../core/traces/store.ts';
import type { DecodedEvent } from '../../core/serde/events.ts';
import { rowsOf, deadLetterRow } from '../../consumers/traces/rows.ts';
import { syntheticRun } from '../../testkit/synthetic-run.ts';
import { targets } from './targets.ts';

function rowsByTable(): Map<TraceTable, Row[]> {
  const by = new Map<TraceTable, Row[]>();
  const add = (table: TraceTable, row: Row) => (by.get(table) ?? by.set(table, []).get(table)!).push(row);
  for (const ev of syntheticRun({ groups: 12, groupSize: 4, assistantTurns: 3, tokensPerTurn: 9, trajectoriesPerStep: 16, seed: 5 })) {
    for (const { table, row } of rowsOf({ name: ev.name, value: ev.value, schemaId: 0 } as DecodedEvent)) add(table, row);
  }
  // Edge values: unicode and control characters, a long text, tiny floats, extreme ids, a Nullable null, and a
  // dead letter inside its 90-day TTL. (Non-finite floats have their own test: 18.16 reads JSON null as NaN.)
  const turn = { ...by.get('turns')![0]! };
  add('turns', { ...turn, turn_index: 900, text: 'é ✓ 𝄞 \t\n\\ "quoted" ' + 'x'.repeat(5000), logprobs: [-0.5, -0, 2.5, 1e-40], token_ids: [0, 4294967295, 7, 1], loss_mask: [0, 1, 1, 0], tool_call_parse_error: null, latency_ms: 0.125 });
  add('turns', { ...turn, turn_index: 901, token_ids: [], logprobs: [], loss_mask: [], tool_call_ids: [], tool_call_names: [], tool_call_arguments: [], tool_call_parse_error: '' });
  // Strings at the encoder's length boundaries (hand copy up to 16 UTF-16 units, 1-byte length below 43), multibyte.
  const sizes = ['a'.repeat(16), 'a'.repeat(15) + 'é', 'é'.repeat(17), 'é'.repeat(42), '🙂'.repeat(21), 'x'.repeat(42) + '✓', 'ü'.repeat(64), 'y'.repeat(127) + 'ß'];
  add('turns', { ...turn, turn_index: 902, tool_call_ids: sizes, tool_call_names: sizes.map((x) => x.slice(0, 20)), tool_call_arguments: [], text: sizes.join('|') });
  // Evaluations: a step the evaluator did not know (null) beside a known one, and per-difficulty slices or none.
  const evaluation = { event_id: 'ev-1', time_ms: 1_790_000_000_123, run_id: 'synthetic', policy_version: 3, step: null, phase: 'checkpoint', problem_set: 'calculator/heldout[0:200]', n: 200, solved: 71, solved_rule: "the task's own check", mean_reward: 0.355, per_difficulty: [], trajectory_ids: ['a', 'b'] };
  for (const value of [evaluation, { ...evaluation, event_id: 'ev-2', step: 4, phase: 'periodic', per_difficulty: [{ difficulty: 'é medium', n: 2, solved: 1, mean_reward: 1e-40 }], trajectory_ids: [] }]) {
    for (const { table, row } of rowsOf({ name: 'Evaluation', value, schemaId: 0 } as DecodedEvent)) add(table, row);
  }
  add('dead_letters', deadLetterRow('c', 'topic', 1, 2 ** 40, 'SERDE_DECODE', 'bad', null, Buffer.from([0, 1, 2]), 'dl-1', Math.floor(Date.now() / 1000) * 1000 - 789));
  return by;
}

const ORDER: Record<TraceTable, string> = {
  trajectory_starts: 'run_id, trajectory_id',
  trajectories: 'run_id, trajectory_id',
  turns: 'run_id, trajectory_id, turn_index',
  tool_calls: 'run_id, trajectory_id, turn_index, call_id',
  rewards: 'run_id, trajectory_id, reward_fn',
  advantages: 'run_id, trajectory_id, estimator',
  train_steps: 'run_id, step',
  policy_versions: 'run_id, version',
  control: 'run_id, time, event_id',
  evaluations: 'run_id, policy_version, event_id',
  dead_letters: 'source_topic, source_partition, source_offset, event_id',
};

for (const target of targets()) {
  test(`${target.name}: RowBinary inserts store exactly what JSONEachRow inserts store`, { skip: target.skip ?? false }, async () => {
    const binary = await target.open('rb');
    const json = await target.open('js');
    try {
      const by = rowsByTable();
      for (const [table, rows] of by) {
        await binary.insert(table, rows);
        // insertRaw sends the lines as they are: on 18.16 its DateTime columns take seconds, as insert() sent them.
        const sec = (r: Row) => Object.fromEntries(Object.entries(r).map(([k, v]) => [k, ['time', 'started', 'completed'].includes(k) ? Math.floor((v as number) / 1000) : v]));
        const jsonRows = json.dialect === 'compat-18' ? rows.map(sec) : rows;
        await json.insertRaw(table, toJsonEachRow(jsonRows), rows.length);
      }
      for (const table of TRACE_TABLES) {
        const sql = `SELECT * FROM ${table} ORDER BY ${ORDER[table]}`;
        const [a, b] = [(await binary.query(sql)).rows, (await json.query(sql)).rows];
        assert.equal(a.length, by.get(table)?.length ?? 0, `${table}: row count`);
        assert.deepEqual(a, b, `${table}: same stored values`);
      }
      const bytes = (binary as { bytesSent?: number }).bytesSent ?? 0;
      assert.ok(bytes > 0, 'bytesSent counts the RowBinary payload');
      // Non-finite numbers are stored as JSON carried them: null, so the column default (0) or NULL.
      await binary.insert('turns', [{ ...by.get('turns')![0]!, turn_index: 4000, latency_ms: NaN, logprobs: [Infinity, -1, NaN] }]);
      assert.deepEqual((await binary.query('SELECT latency_ms, logprobs FROM turns WHERE turn_index = 4000')).rows, [{ latency_ms: 0, logprobs: [0, -1, 0] }]);
      // A value that needs the general rules in the middle of an array (the packed loop hands the rest over).
      await binary.insert('turns', [{ ...by.get('turns')![0]!, turn_index: 4001, token_ids: [7, '8', 9], logprobs: [-1, NaN, -0, 2], loss_mask: [1, true, 0] }]);
      assert.deepEqual((await binary.query('SELECT token_ids, logprobs, loss_mask FROM turns WHERE turn_index = 4001')).rows, [
        { token_ids: [7, 8, 9], logprobs: [-1, 0, 0, 2], loss_mask: [1, 1, 0] },
      ]);
      // Bad values: the column is named; nothing half-written.
      const turn = by.get('turns')![0]!;
      await assert.rejects(binary.insert('turns', [{ ...turn, turn_index: 5000, token_ids: [1, -2] }]), (e) => isRlstreamError(e, 'TRACE_STORE') && /token_ids/.test(e.message));
      await assert.rejects(binary.insert('turns', [{ ...turn, turn_index: 5001, text: { a: 1 } }]), (e) => isRlstreamError(e, 'TRACE_STORE') && /text/.test(e.message));
      assert.deepEqual((await binary.query('SELECT count() AS n FROM turns WHERE turn_index >= 5000')).rows, [{ n: 0 }]);
    } finally {
      await binary.close();
      await json.close();
    }
  });
}

// `rlstream query --trajectory` says what is true of each turn: a tool's turn names no policy version (it records
// -1, no policy generated it), a latency reads to a tenth of a millisecond rather than every digit of a float,
// the mask count is "in the loss mask" (what a step would train on), and a held-out trajectory says it was
// never trained. Against a real chDB store, rows as the trace sink writes them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderTrajectory } from '../../core/traces/render.ts';
import type { Row } from '../../core/traces/store.ts';
import { targets } from './targets.ts';

const T = Date.UTC(2026, 10, 1);

function turn(index: number, role: string, version: number, latency: number, extra: Row = {}): Row {
  const assistant = role === 'assistant';
  return {
    run_id: 'r', trajectory_id: 'tr', group_id: 'g', turn_index: index, role, token_ids: [1, 2, 3], logprobs: [-1, -1, -1], loss_mask: assistant ? [1, 1, 1] : [0, 0, 0], num_tokens: 3,
    text: `${role} ${index}`, tool_call_ids: [], tool_call_names: [], tool_call_arguments: [], tool_call_parse_error: null, finish_reason: assistant ? 'stop' : '',
    policy_version: version, latency_ms: latency, server: assistant ? 's' : '', tokenization_mismatch: 0, event_id: `t${index}`, time: T + index, _version: T + index,
    ...extra,
  };
}

for (const target of targets()) {
  test(`${target.name}: a trajectory renders versions, latencies and its split as they are`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('render');
    try {
      await store.insert('trajectory_starts', [{
        run_id: 'r', trajectory_id: 'tr', group_id: 'g', sample_index: 0, group_size: 1, agent_name: 'tool_agent', data_source: 'calc', dataset_name: 'calc', split: 'heldout',
        dataset_index: 0, prompt_roles: ['user'], prompt_contents: ['2+2?'], prompt_token_ids: [9], tool_names: ['calculator'], tools_json: '[]', sampling_json: '{}',
        policy_version: 7, ground_truth: '4', extra_info_json: '{}', event_id: 's', time: T, _version: T,
      }]);
      await store.insert('turns', [turn(0, 'assistant', 7, 1702.656912000035), turn(1, 'tool', -1, 0.25), turn(2, 'assistant', 7, 12)]);
      const text = await renderTrajectory(store, 'tr');
      const lines = text.split('\n');
      assert.ok(lines.includes('heldout split: evaluation only, never trained'), text);
      assert.ok(lines.includes('--- turn 0 assistant: 3 tokens, 3 in the loss mask, policy v7, 1702.7 ms, finish stop'), text);
      assert.ok(lines.includes('--- turn 1 tool: 3 tokens, 0 in the loss mask, 0.3 ms'), text);
      assert.doesNotMatch(text, /v-1|\d\.\d{3,} ms| trained,/);
    } finally {
      await store.close();
    }
  });
}

// The engine's batched KV cache (SlotCache) against a plain model of it: per row, the list of its columns.
// Random joins, decode columns, leaves and shrinks drive the capacity up and down, so resizes happen both into
// new buffers and in place (re-strided within the same memory), with rows of different lengths.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { policyConfig } from '../../producers/policy/config.ts';
import { MASKED } from '../../producers/policy/export.ts';
import type { KvTensors } from '../../producers/policy/runner.ts';
import { Rng } from '../../producers/policy/sampler.ts';
import { compactRow, SlotCache } from '../../producers/policy/slots.ts';

const c = policyConfig({ hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 50, max_position_embeddings: 512 });
const KVH = c.numKvHeads;
const D = c.headDim;
const L = c.numLayers;

/** One column of one row: its K and V per layer and head, [layer][kv][head * D + d]. */
type Column = Float32Array[][];

let counter = 0;
function freshColumn(): Column {
  return Array.from({ length: L }, () => Array.from({ length: 2 }, () => Float32Array.from({ length: KVH * D }, () => ++counter)));
}

/** A batch-1 cache holding `cols`, in the layout prefill hands to the slot cache. */
function rowCache(cols: Column[]): KvTensors {
  const n = cols.length;
  const kv: KvTensors = { len: n, keys: [], values: [] };
  for (let l = 0; l < L; l++) {
    const k = new Float32Array(KVH * n * D);
    const v = new Float32Array(KVH * n * D);
    cols.forEach((col, j) => {
      for (let h = 0; h < KVH; h++) {
        k.set(col[l]![0]!.subarray(h * D, (h + 1) * D), (h * n + j) * D);
        v.set(col[l]![1]!.subarray(h * D, (h + 1) * D), (h * n + j) * D);
      }
    });
    kv.keys.push(k);
    kv.values.push(v);
  }
  return kv;
}

function checkAgainst(slots: SlotCache, model: Column[][]): void {
  assert.equal(slots.rows, model.length);
  const view = slots.view();
  const cap = slots.capacity;
  model.forEach((cols, b) => {
    assert.equal(slots.lengthOf(b), cols.length);
    assert.ok(cols.length < cap, `row ${b}: ${cols.length} tokens need a free column in capacity ${cap}`);
    for (let j = 0; j < cap; j++) assert.equal(slots.bias[b * cap + j], j < cols.length ? 0 : MASKED, `bias of row ${b}, column ${j}`);
    cols.forEach((col, j) => {
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < KVH; h++) {
          const at = ((b * KVH + h) * cap + j) * D;
          assert.deepEqual(view.keys[l]!.subarray(at, at + D), col[l]![0]!.subarray(h * D, (h + 1) * D), `K of row ${b}, column ${j}, layer ${l}, head ${h}`);
          assert.deepEqual(view.values[l]!.subarray(at, at + D), col[l]![1]!.subarray(h * D, (h + 1) * D), `V of row ${b}, column ${j}, layer ${l}, head ${h}`);
        }
      }
    });
    // extract() gives the row back as a compact cache, equal to the one it was built from.
    assert.deepEqual(slots.extract(b), compactRow(c, [{ kv: rowCache(cols), row: 0, from: 0, count: cols.length }]));
  });
}

test('the slot cache keeps every row intact through joins, decode columns, leaves, growth and shrinking', () => {
  const rng = new Rng(7);
  const slots = new SlotCache(c);
  const model: Column[][] = [];
  let grew = 0;
  let shrank = 0;
  let inPlace = 0;
  let reallocated = 0;
  for (let step = 0; step < 400; step++) {
    const r = rng.next();
    const before = slots.capacity;
    const buffer = slots.view().keys[0];
    if (r < 0.15 && model.length < 24) {
      // Joins of very different lengths, so one long row sets the capacity for short ones.
      const n = 1 + Math.floor(rng.next() * (rng.next() < 0.2 ? 150 : 20));
      const cols = Array.from({ length: n }, freshColumn);
      slots.append([{ kv: rowCache(cols), row: 0, from: 0, count: n }]);
      model.push(cols);
    } else if (r < 0.3 && model.length > 0) {
      // Leaves: the longest row more often, so the capacity shrinks.
      const longest = model.reduce((m, cols, b) => (cols.length > model[m]!.length ? b : m), 0);
      const b = rng.next() < 0.5 ? longest : Math.floor(rng.next() * model.length);
      slots.remove(b);
      model[b] = model[model.length - 1]!;
      model.pop();
      slots.shrink();
    } else if (model.length > 0) {
      // A decode step: every row gets one column.
      slots.reserveColumn();
      const cols = model.map(() => freshColumn());
      const packed = new Float32Array(model.length * L * 2 * KVH * D);
      cols.forEach((col, b) => col.forEach((kv, l) => kv.forEach((x, i) => packed.set(x, ((b * L + l) * 2 + i) * KVH * D))));
      slots.appendColumn(packed);
      cols.forEach((col, b) => model[b]!.push(col));
      slots.reserveColumn();
    }
    if (slots.capacity > before && before > 0) grew++;
    if (slots.capacity < before && slots.rows > 0) shrank++;
    if (slots.capacity !== before && before > 0 && slots.rows > 0) {
      if (slots.view().keys[0] === buffer) inPlace++;
      else reallocated++;
    }
    if (model.length > 0) checkAgainst(slots, model);
  }
  assert.ok(grew >= 3, `the capacity grew ${grew} times`);
  assert.ok(shrank >= 2, `the capacity shrank ${shrank} times`);
  assert.ok(inPlace >= 2 && reallocated >= 2, `resizes in place ${inPlace}, into new buffers ${reallocated}: both paths ran`);
});

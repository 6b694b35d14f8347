// The one continuous-batching scheduler (producers/policy/native-engine.ts) against bad input and failing steps,
// over the ONNX runner: a request with a token id outside the vocabulary (or an unsupported option) is refused on
// its own with the position named while the good requests beside it finish; a step the runner fails rejects the
// turns in it and frees their slots, so the engine goes on serving instead of waiting for slots forever.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { policyConfig } from '../../producers/policy/config.ts';
import { NativeEngine } from '../../producers/policy/native-engine.ts';
import { OnnxSlotRunner } from '../../producers/policy/onnx-slot-runner.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';

const config = policyConfig({ hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 61, max_position_embeddings: 128 });
const weights = randomWeights(config, 3);
const runners: OnnxSlotRunner[] = [];
after(async () => {
  for (const r of runners) await r.release();
});
const sampling = (o: Partial<SamplingParams> = {}): SamplingParams => ({ temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 5, seed: 1, stop_token_ids: [], ...o }) as SamplingParams;

async function runner(): Promise<OnnxSlotRunner> {
  const r = await OnnxSlotRunner.create(config, weights);
  runners.push(r);
  return r;
}

test('bad requests are refused on their own, naming what is wrong; the good ones beside them finish', async () => {
  const engine = new NativeEngine(await runner(), { slots: 4, maxLen: 64 });
  const bad: [unknown[], RegExp][] = [
    [[1, 2, 61], /token id 61 at position 2 is outside the vocabulary \[0, 61\)/],
    [[-1], /token id -1 at position 0/],
    [[1, 2.5], /token id 2.5 at position 1/],
    [[Number.NaN], /token id NaN at position 0/],
    [['7'], /token id 7 at position 0/],
    [[], /promptIds is empty/],
  ];
  const good = [0, 1, 2].map((i) => engine.generate({ requestId: `g${i}`, promptIds: [i + 1, i + 2], sampling: sampling({ seed: i }) }));
  const refused = bad.map(([ids]) => engine.generate({ requestId: 'bad', promptIds: ids as number[], sampling: sampling() }).then(() => null, (e: unknown) => e));
  refused.push(engine.generate({ requestId: 'bad', promptIds: [1], sampling: sampling(), topLogprobs: 2 }).then(() => null, (e: unknown) => e));
  refused.push(engine.generate({ requestId: 'bad', promptIds: null as unknown as number[], sampling: sampling() }).then(() => null, (e: unknown) => e));
  const errors = await Promise.all(refused);
  for (const [i, e] of errors.entries()) {
    assert.ok(isRlstreamError(e) && e.code === 'BACKEND_BAD_REQUEST', `case ${i}: ${String(e)}`);
    if (i < bad.length) assert.match((e as Error).message, bad[i]![1]);
  }
  assert.match((errors[bad.length] as Error).message, /topLogprobs/);
  assert.match((errors[bad.length + 1] as Error).message, /promptIds must be an array/);
  for (const r of await Promise.all(good)) assert.equal(r.tokenIds.length, 5);
  engine.close();
});

test('a step the runner fails rejects its turns and frees their slots: later requests are served', async () => {
  const r = await runner();
  let failNext = false;
  const real = r.extend.bind(r);
  // The real runner, made to fail one step (what a runner error mid-run looks like to the scheduler).
  r.extend = (...args: Parameters<OnnxSlotRunner['extend']>) => {
    if (failNext) {
      failNext = false;
      return Promise.reject(new Error('injected runner failure'));
    }
    return real(...args);
  };
  const engine = new NativeEngine(r, { slots: 2, maxLen: 64 });
  failNext = true;
  const failed = await Promise.allSettled([1, 2].map((i) => engine.generate({ requestId: `f${i}`, sessionId: `s${i}`, promptIds: [i, i + 1], sampling: sampling() })));
  for (const f of failed) {
    assert.equal(f.status, 'rejected');
    assert.match(String((f as PromiseRejectedResult).reason), /injected runner failure/);
  }
  // Both slots were taken by the failed turns; without freeing them these would wait forever.
  const later = await Promise.race([
    Promise.all([3, 4, 5].map((i) => engine.generate({ requestId: `l${i}`, promptIds: [i, i + 1, i + 2], sampling: sampling({ seed: i }) }))),
    new Promise<null>((res) => setTimeout(() => res(null), 20_000).unref()),
  ]);
  assert.ok(later, 'later requests were served after the failed step');
  for (const x of later) assert.equal(x.tokenIds.length, 5);
  // The failed sessions' next turns start from an empty slot: prefilled in full, nothing reused.
  const before = engine.stats().reusedTokens;
  await engine.generate({ requestId: 'again', sessionId: 's1', promptIds: [1, 2, 3], sampling: sampling() });
  assert.equal(engine.stats().reusedTokens, before);
  engine.close();
});

// A failing policy step on real onnxruntime sessions: the requests in the step are rejected with an error that
// names the step and the cause, the engine goes on serving, and a session that no longer runs at all makes
// its requests fail at once instead of hanging.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import type { GenerateRequest } from '../../producers/backends/types.ts';
import { policyConfig } from '../../producers/policy/config.ts';
import { GenerationEngine, PolicyStepError } from '../../producers/policy/engine.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import { PolicyRunner, type RunInput } from '../../producers/policy/runner.ts';

const config = policyConfig({ hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 96, vocab_size: 100, max_position_embeddings: 128, attention_bias: true });
const weights = randomWeights(config, 1);
const engines: GenerationEngine[] = [];
after(async () => {
  for (const e of engines) await e.close();
});

let n = 0;
function req(promptIds: number[], seed: number, maxNew = 8): GenerateRequest {
  return { requestId: `f${n++}`, promptIds, sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: maxNew, seed, stop_token_ids: [] } };
}

/** The same runner, whose chosen call (by count) gets positions beyond the model's table: onnxruntime's Gather throws. */
async function faultyRunner(which: 'decode' | 'run', failingCall: number): Promise<{ runner: PolicyRunner; real: PolicyRunner }> {
  const real = await PolicyRunner.create(config, weights, 1);
  const runner = Object.create(real) as PolicyRunner;
  let calls = 0;
  const corrupt = <I extends Pick<RunInput, 'positionIds'>>(input: I): I => (++calls === failingCall ? { ...input, positionIds: input.positionIds.map(() => 100_000n) } : input);
  if (which === 'decode') runner.decode = (input) => real.decode(corrupt(input));
  else runner.run = (input) => real.run(corrupt(input));
  return { runner, real };
}

async function expected(r: GenerateRequest): Promise<number[]> {
  const e = new GenerationEngine(config, await PolicyRunner.create(config, weights, 1));
  engines.push(e);
  return (await e.generate(r)).tokenIds;
}

for (const which of ['decode', 'run'] as const) {
  const step = which === 'decode' ? 'decode step (batch 2)' : 'prefill step (batch 2, 3 tokens)';
  test(`a failed ${step.split(' ')[0]} step rejects its requests, frees their rows and the engine serves the next ones`, async () => {
    const { runner } = await faultyRunner(which, 1);
    const engine = new GenerationEngine(config, runner, { maxBatch: 2 });
    engines.push(engine);
    const inStep = [engine.generate(req([1, 2, 3], 1)), engine.generate(req([4, 5, 6], 2))];
    const waiting = req([7, 8], 3);
    const queued = engine.generate(waiting); // no room in the batch: it waits, and runs after the failure
    for (const p of inStep) {
      await assert.rejects(p, (err: unknown) => {
        assert.ok(err instanceof PolicyStepError && isRlstreamError(err, 'INTERNAL'));
        assert.match(err.message, new RegExp(`^policy v1 ${step.replace(/[()]/g, '\\$&')} failed: .*Gather.*out of data bounds`));
        return true;
      });
    }
    assert.deepEqual((await queued).tokenIds, await expected(waiting));
    const later = req([9, 10, 11, 12], 4);
    assert.deepEqual((await engine.generate(later)).tokenIds, await expected(later));
    assert.ok(engine.stats().decodeTokens > 0);
  });
}

test('a session that no longer runs fails its pending and later requests at once; a new version serves again', async () => {
  const real = await PolicyRunner.create(config, weights, 1);
  const runner = Object.create(real) as PolicyRunner;
  let calls = 0;
  // The onnxruntime session is disposed between two decode steps, while requests are in flight.
  runner.decode = async (input) => {
    if (++calls === 3) await real.release();
    return real.decode(input);
  };
  const engine = new GenerationEngine(config, runner, { maxBatch: 2 });
  engines.push(engine);
  const all = [engine.generate(req([1, 2], 1, 20)), engine.generate(req([3, 4], 2, 20)), engine.generate(req([5, 6], 3, 20))];
  const outcomes = await Promise.allSettled(all);
  const reasons = outcomes.map((o) => (o.status === 'rejected' ? (o.reason as Error) : assert.fail('a request on a dead session succeeded')));
  assert.match(reasons[0]!.message, /^policy v1 decode step \(batch 2\) failed: .*Session already disposed/);
  assert.ok(reasons[0] instanceof PolicyStepError);
  // The waiting one never ran: it fails with the version's error instead of waiting forever.
  assert.ok(isRlstreamError(reasons[2], 'BACKEND_UNAVAILABLE') && !reasons[2].retriable);
  assert.match(reasons[2].message, /^policy v1 can no longer run .*Session already disposed/);

  const t0 = performance.now();
  await assert.rejects(engine.generate(req([7], 4)), (err: unknown) => isRlstreamError(err, 'BACKEND_UNAVAILABLE') && /can no longer run/.test((err as Error).message));
  assert.ok(performance.now() - t0 < 50, 'a later request fails at once');

  const v2 = await PolicyRunner.create(config, weights, 2);
  engine.install(v2);
  const after2 = await engine.generate(req([7, 8, 9], 5));
  assert.equal(after2.tokenIds.length, 8);
  assert.deepEqual(after2.policyVersions, new Array(8).fill(2));
});

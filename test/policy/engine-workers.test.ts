// The built-in policy with its running batch spread over worker threads (workers: 2): the same tokens and
// log-probs as one engine, sessions that stay on the worker holding their KV cache, bad requests and aborts
// across the thread boundary, hot-swaps that reach every worker, a clean close, and recovery: a worker thread
// that ends is replaced by one on the current version, and a worker a new version failed to load on serves no
// new requests until a retry loads it.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { hfConfigJson, parseModelConfig } from '../../core/weights/model-config.ts';
import { writeSafetensors } from '../../core/weights/safetensors.ts';
import type { GenerateRequest } from '../../producers/backends/types.ts';
import { BuiltinPolicyBackend, type BuiltinPolicyOptions } from '../../producers/policy/backend.ts';
import type { WorkerEngines } from '../../producers/policy/engine-workers.ts';
import { logprobMismatch } from '../../producers/policy/mismatch.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';

const config = parseModelConfig({ hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 96, vocab_size: 100, max_position_embeddings: 256 });
const configJson = JSON.stringify(hfConfigJson(config));
const w1 = randomWeights(config, 1);
const dir = await mkdtemp(join(tmpdir(), 'rlstream-policy-workers-'));
const v2Path = join(dir, 'v2.safetensors');
await writeSafetensors(v2Path, randomWeights(config, 2));
const backends: BuiltinPolicyBackend[] = [];
after(async () => {
  for (const b of backends) await b.close();
  await rm(dir, { recursive: true, force: true });
});

async function backend(options: BuiltinPolicyOptions = {}): Promise<BuiltinPolicyBackend> {
  const b = await BuiltinPolicyBackend.create({ configJson, weights: w1, version: 1 }, options);
  backends.push(b);
  return b;
}

let n = 0;
function req(promptIds: number[], over: Partial<SamplingParams> = {}, sessionId?: string): GenerateRequest {
  return { requestId: `w${n++}`, promptIds, sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 10, seed: 3, stop_token_ids: [], ...over }, ...(sessionId !== undefined && { sessionId }) };
}

const prompts = Array.from({ length: 12 }, (_, i) => Array.from({ length: 2 + (i % 5) }, (_, j) => (i * 17 + j * 3) % 100));

test('two workers give the tokens and log-probs of one engine, for greedy and seeded sampling', async () => {
  const one = await backend({ maxBatch: 8 });
  const two = await backend({ maxBatch: 8, workers: 2 });
  for (const over of [{ temperature: 0, seed: null }, { temperature: 0.8, top_p: 0.9 }]) {
    const requests = prompts.map((p, i) => req(p, { ...over, ...(over.seed === null ? {} : { seed: i }) }));
    const [a, b] = await Promise.all([one, two].map((x) => Promise.all(requests.map((r) => x.generate(r)))));
    a!.forEach((r, i) => {
      assert.deepEqual(b![i]!.tokenIds, r.tokenIds, `request ${i}`);
      assert.ok(logprobMismatch(b![i]!.logprobs, r.logprobs).maxAbs < 1e-4);
    });
  }
});

test('a session stays on one worker, so its later turns reuse the kept KV cache', async () => {
  const b = await backend({ workers: 2 });
  const sessions = Array.from({ length: 6 }, (_, i) => `traj-${i}`);
  const first = await Promise.all(sessions.map((s, i) => b.generate(req(prompts[i]!, { seed: i }, s))));
  const before = b.stats();
  const contexts = sessions.map((_, i) => [...prompts[i]!, ...first[i]!.tokenIds, 42, 43]);
  await Promise.all(sessions.map((s, i) => b.generate(req(contexts[i]!, { seed: 100 + i }, s))));
  const after2 = b.stats();
  assert.equal(after2.cacheHits - before.cacheHits, sessions.length);
  const expectReused = sessions.reduce((t, _, i) => t + prompts[i]!.length + first[i]!.tokenIds.length - 1, 0);
  assert.equal(after2.reusedTokens - before.reusedTokens, expectReused);
});

test('bad requests are rejected with BACKEND_BAD_REQUEST from a worker; good ones complete; aborts cross the thread boundary', async () => {
  const b = await backend({ workers: 2 });
  const outcomes = await Promise.allSettled([b.generate(req([1, 2, 100])), b.generate(req([1], { top_p: 0 })), b.generate(req([1, 2, 3])), b.generate(req([4, 5]))]);
  for (const [i, msg] of [[0, /token id 100/], [1, /top_p/]] as const) {
    const o = outcomes[i]!;
    assert.equal(o.status, 'rejected');
    const reason = (o as PromiseRejectedResult).reason;
    assert.ok(isRlstreamError(reason, 'BACKEND_BAD_REQUEST') && msg.test(reason.message), String(reason));
  }
  for (const o of outcomes.slice(2)) assert.equal(o.status === 'fulfilled' && o.value.tokenIds.length, 10);

  const ac = new AbortController();
  const long = b.generate(req([1, 2, 3], { max_new_tokens: 240 }), ac.signal);
  setTimeout(() => ac.abort(), 20);
  const r = await long;
  assert.equal(r.finishReason, 'abort');
  assert.ok(r.tokenIds.length < 240);
});

test("a hot-swap reaches every worker (each logs it to the backend's logger); after close, requests are refused", async () => {
  const { jsonLogger } = await import('../../core/telemetry.ts');
  const lines: Record<string, unknown>[] = [];
  const b = await backend({ workers: 2, interrupt: 'next_turn', logger: jsonLogger({ level: 'info', write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }) });
  await b.updatePolicy({ version: 2, weightsPath: v2Path, configJson });
  assert.equal(b.currentPolicyVersion(), 2);
  const installed = lines.filter((l) => l['msg'] === 'policy installed' && l['version'] === 2).map((l) => l['worker']);
  assert.deepEqual(installed.sort(), [0, 1]);
  const results = await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 3 }))));
  for (const r of results) assert.deepEqual(r.policyVersions, [2, 2, 2]);
  // The same weights in one engine give the same tokens: the workers really run v2.
  const ref = await backend();
  await ref.updatePolicy({ version: 2, weightsPath: v2Path, configJson });
  const again = await Promise.all(prompts.map((p) => ref.generate(req(p, { max_new_tokens: 3 }))));
  results.forEach((r, i) => assert.deepEqual(r.tokenIds, again[i]!.tokenIds));

  await b.close();
  await assert.rejects(b.generate(req([1])), (e: unknown) => isRlstreamError(e, 'BACKEND_UNAVAILABLE'));
});

test('a bad worker count fails at creation naming the field', async () => {
  await assert.rejects(BuiltinPolicyBackend.create({ configJson, weights: w1, version: 1 }, { workers: 0 }), /workers must be a positive integer/);
});

test("the run config's backend section: the calculator example serves from 2 workers; bad counts and interrupt modes fail at compile naming the field", async () => {
  const { loadRunConfig } = await import('../../cli/config/run-config.ts');
  const { createBackend } = await import('../../cli/run/roles.ts');
  const { silentLogger } = await import('../../core/telemetry.ts');
  const configPath = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.yaml');
  const ctx = (overrides: Record<string, unknown>) => ({ config: loadRunConfig(configPath, overrides), logger: silentLogger }) as unknown as Parameters<typeof createBackend>[0];
  const b = (await createBackend(ctx({}))) as BuiltinPolicyBackend;
  try {
    assert.equal(b.workers, 2);
    // Sessions spread over both workers each keep their cache: the workers' stats are summed.
    const sessions = ['a', 'b', 'c', 'd'];
    await Promise.all(sessions.map((s) => b.generate(req([1, 2, 3], { max_new_tokens: 2 }, s))));
    assert.equal(b.stats().cachedSessions, sessions.length);
  } finally {
    await b.close();
  }
  for (const [key, value, msg] of [
    ['backend.workers', 0, /^backend\.workers: must be >= 1 \(got 0\)/],
    ['backend.threads', '2', /^backend\.threads: must be an integer \(got "2"\)/],
    ['backend.max_batch', 1.5, /^backend\.max_batch: must be an integer \(got 1\.5\)/],
    ['rollout.interrupt', 'later', /^rollout\.interrupt: must be one of next_turn, finish, next_token \(got "later"\)/],
    // The knob lives with the rollouts; its old place names the new one.
    ['backend.swap_mode', 'next_token', /^backend\.swap_mode: unknown key: .*rollout\.interrupt/],
  ] as const) {
    assert.throws(() => loadRunConfig(configPath, { [key]: value }), (e: unknown) => isRlstreamError(e, 'CONFIG_INVALID') && msg.test((e as Error).message));
  }
  // A server backend takes each request on its current weights: it cannot interrupt a turn or pin a version.
  assert.throws(
    () => loadRunConfig(configPath, { backend: { name: 'openai', urls: ['http://127.0.0.1:9'] }, 'rollout.interrupt': 'next_token' }),
    (e: unknown) => isRlstreamError(e, 'CONFIG_INVALID') && /^rollout\.interrupt: backend openai supports next_turn \(got "next_token"\); next_token needs backend\.name: builtin/m.test((e as Error).message),
  );
  assert.equal(loadRunConfig(configPath, { 'rollout.interrupt': 'next_token' }).rollout.interrupt, 'next_token');
});

test('one stop signal shared by many requests (as a rollout worker passes it) keeps no listener per finished request', async () => {
  const { EventEmitter } = await import('node:events');
  const stop = new AbortController();
  for (const options of [{}, { workers: 2 }]) {
    const b = await backend(options);
    await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 2 }), stop.signal)));
    await Promise.allSettled([b.generate(req([1, 2, 100]), stop.signal)]); // a rejected request detaches too
    assert.equal(EventEmitter.getEventListeners(stop.signal, 'abort').length, 0, `workers ${'workers' in options ? 2 : 1}`);
  }
});

/** The engines of a backend with workers, and their worker objects (internals a fault test reaches into). */
function enginesOf(b: BuiltinPolicyBackend): { engines: WorkerEngines; workers: { version: number | null; dead: Error | null; stats: { decodeTokens: number } | null; terminate(): Promise<void>; load: (...a: unknown[]) => Promise<unknown> }[] } {
  const engines = (b as unknown as { engine: WorkerEngines }).engine;
  return { engines, workers: (engines as unknown as { workers: ReturnType<typeof enginesOf>['workers'] }).workers };
}

async function until(what: string, ok: () => boolean, ms = 20_000): Promise<void> {
  const by = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > by) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Tokens of the prompts under v2 in one engine, the reference the workers must match. */
async function v2Reference(): Promise<number[][]> {
  const ref = await backend();
  await ref.updatePolicy({ version: 2, weightsPath: v2Path, configJson });
  return (await Promise.all(prompts.map((p) => ref.generate(req(p, { max_new_tokens: 3 }))))).map((r) => r.tokenIds);
}

test('a worker thread that ends is replaced; the other serves meanwhile, and the replacement catches up with a hot-swap made while it started', async () => {
  const { jsonLogger } = await import('../../core/telemetry.ts');
  const lines: Record<string, unknown>[] = [];
  const b = await backend({ workers: 2, maxBatch: 8, logger: jsonLogger({ level: 'info', write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }) });
  await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 4 }))));
  const before = b.stats();
  const { engines, workers } = enginesOf(b);
  const dying = workers[0]!;
  // Ending an idle thread is what a crash of the worker's JavaScript comes to (ending one inside onnxruntime
  // would abort the whole process, which no recovery can help).
  await dying.terminate();
  await until('the worker is marked dead', () => dying.dead !== null);
  // Its counters move to the engines' retired sum: counted once, also before the replacement starts.
  assert.equal(b.stats().decodeTokens, before.decodeTokens, 'right after the death');
  await until('the worker is replaced', () => workers[0] !== dying);
  assert.equal(engines.restarts, 1);
  assert.match(String(lines.find((l) => l['msg'] === 'a policy engine worker died; starting a replacement')?.['error']), /exited/);
  // Served while the replacement starts, and a new version published meanwhile.
  const during = await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 2 }))));
  assert.equal(during.length, prompts.length);
  await b.updatePolicy({ version: 2, weightsPath: v2Path, configJson });
  await until('the replacement serves v2', () => workers[0]!.version === 2 && workers[1]!.version === 2);
  const after = await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 3 }))));
  for (const r of after) assert.deepEqual(r.policyVersions, [2, 2, 2]);
  assert.ok((workers[0]!.stats?.decodeTokens ?? 0) > 0, 'the replacement served some of them');
  const expected = await v2Reference();
  after.forEach((r, i) => assert.deepEqual(r.tokenIds, expected[i], `request ${i}`));
  // The dead worker's counters are kept, once: 12 requests of 1 then 2 decode steps each came after `before`.
  assert.equal(b.stats().decodeTokens, before.decodeTokens + 12 * (1 + 2));
});

test('with every worker ended at once, requests wait for the replacements and are served by them', async () => {
  const b = await backend({ workers: 2, maxBatch: 8 });
  const { engines, workers } = enginesOf(b);
  const first = await b.generate(req(prompts[0]!, { max_new_tokens: 5 }));
  const ended = [...workers];
  await Promise.all(ended.map((w) => w.terminate()));
  await until('both are marked dead', () => ended.every((w) => w.dead !== null));
  // No worker serves now (a replacement takes far longer to start than this check): the request must wait.
  assert.ok(workers.every((w) => w.dead !== null || w.version === null), 'no worker is ready yet');
  const waited = Date.now();
  const again = await b.generate(req(prompts[0]!, { max_new_tokens: 5 }));
  // Woken when a replacement serves (a start takes a few seconds), not when the 30 s wait runs out.
  assert.ok(Date.now() - waited < 15_000, `the request waited ${Date.now() - waited} ms`);
  assert.equal(engines.restarts, 2);
  assert.deepEqual(again.tokenIds, first.tokenIds, 'the same request (same seed) samples the same tokens on a replacement');
});

test('a version that fails to load on one worker: that worker takes no new requests until a retry loads it', async () => {
  const { jsonLogger } = await import('../../core/telemetry.ts');
  const lines: Record<string, unknown>[] = [];
  const b = await backend({ workers: 2, maxBatch: 8, logger: jsonLogger({ level: 'info', write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }) });
  await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 2 }))));
  const { workers } = enginesOf(b);
  const flaky = workers[1]!;
  const decodedBefore = flaky.stats!.decodeTokens;
  // The failure is injected: this worker's loads fail until the test lets them through (a real one would be,
  // for example, memory running out in that thread only).
  const realLoad = flaky.load.bind(flaky);
  let failing = true;
  flaky.load = (...a: unknown[]) => (failing ? Promise.reject(new Error('injected load failure')) : realLoad(...a));
  await b.updatePolicy({ version: 2, weightsPath: v2Path, configJson });
  assert.equal(b.currentPolicyVersion(), 2);
  assert.equal(flaky.version, 1);
  const mixed = await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 3 }))));
  for (const r of mixed) assert.deepEqual(r.policyVersions, [2, 2, 2], 'no new request ran on the worker left on v1');
  assert.equal(flaky.stats!.decodeTokens, decodedBefore);
  assert.ok(lines.some((l) => l['msg'] === 'policy engine worker could not load a new version; it serves no new requests until a retry does' && l['worker'] === 1));
  failing = false;
  await until('the retry loads v2', () => flaky.version === 2);
  const after = await Promise.all(prompts.map((p) => b.generate(req(p, { max_new_tokens: 3 }))));
  assert.ok(flaky.stats!.decodeTokens > decodedBefore, 'the worker serves again');
  const expected = await v2Reference();
  after.forEach((r, i) => assert.deepEqual(r.tokenIds, expected[i], `request ${i}`));
});

test('a version no worker can load fails the update and changes nothing', async () => {
  const b = await backend({ workers: 2 });
  const badPath = join(dir, 'bad.safetensors');
  const bad = randomWeights(config, 3);
  bad.delete('model.norm.weight');
  await writeSafetensors(badPath, bad);
  await assert.rejects(b.updatePolicy({ version: 3, weightsPath: badPath, configJson }), (e: unknown) => isRlstreamError(e, 'WEIGHTS_FORMAT'));
  assert.equal(b.currentPolicyVersion(), 1);
  const r = await b.generate(req(prompts[0]!, { max_new_tokens: 2 }));
  assert.deepEqual(r.policyVersions, [1, 1]);
});

test('a session served by another worker while its own one was replaced is released there too', async () => {
  const b = await backend({ workers: 2, maxBatch: 8 });
  const { workers } = enginesOf(b);
  const cached = () => workers.map((w) => (w.stats as unknown as { cachedSessions: number } | null)?.cachedSessions ?? 0);
  await b.generate(req(prompts[0]!, { max_new_tokens: 3 }, 's1'));
  const own = cached().findIndex((n) => n === 1);
  assert.ok(own >= 0, `one worker keeps the session's cache (${cached()})`);
  const dying = workers[own]!;
  await dying.terminate();
  await until('its worker is marked dead', () => dying.dead !== null);
  // The next turn runs on the other worker (its own is being replaced), which now keeps the session's cache.
  await b.generate(req([...prompts[0]!, 5, 6], { max_new_tokens: 3 }, 's1'));
  assert.equal(cached()[1 - own], 1, 'the other worker keeps it now');
  await until('the replacement serves', () => workers[own] !== dying && workers[own]!.version === 1);
  b.releaseSession('s1');
  // Stats come with results: one request on each worker (least in flight: the first goes to one, the second to
  // the other) reports their caches after the release.
  await Promise.all([b.generate(req(prompts[1]!, { max_new_tokens: 2 })), b.generate(req(prompts[2]!, { max_new_tokens: 2 }))]);
  assert.ok(workers.every((w) => w.stats !== null), 'both workers reported');
  assert.deepEqual(cached(), [0, 0]);
});

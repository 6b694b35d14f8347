// Rollout engines in processes of their own (producers/policy/engine-processes.ts, what backend.devices starts on
// the other GPUs of a host), run here on the CPU with the reference collective in place of NCCL: the engines behind
// the server manager's least-load routing and sticky sessions; each version broadcast from a trainer's model in
// this process into their weights (every parameter, or the LoRA adapters only) with no file read, checked against
// the trainer's own forward pass; an engine process SIGKILLed mid-run (its sessions move to the other engine, no
// broadcast waits on it, later versions arrive by file); an engine stopped (SIGSTOP) when a version is offered
// (killed after the stage timeout, the offer never hangs); backend.devices refused where the GPUs are not.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { engineDevicesProblems } from '../../native/gpus.ts';
import { Model, nativeAvailable, type ModelConfig } from '../../native/index.ts';
import { EngineProcesses } from '../../producers/policy/engine-processes.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { TINY, maxAbsDiff, pack, rng } from '../native/helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const CFG: ModelConfig = { ...TINY, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 61, max_position_embeddings: 128 };
const configJson = JSON.stringify(CFG);
const sampling = (o: Partial<SamplingParams> = {}) => ({ temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 12, seed: 3, stop_token_ids: [], ...o }) as SamplingParams;

async function forwardLogprobs(m: Model, prompt: number[], out: number[]): Promise<number[]> {
  const { batch, targets } = pack([[...prompt, ...out]]);
  const { logprobs } = await m.forward(batch, targets);
  return Array.from(logprobs.slice(prompt.length - 1, prompt.length - 1 + out.length));
}

function start(dir: string, devices: number[], stageTimeoutMs?: number, adapters = false): Promise<EngineProcesses> {
  return EngineProcesses.start({
    adapters,
    ...(stageTimeoutMs !== undefined ? { stageTimeoutMs } : {}),
    devices,
    device: 'cpu',
    source: { configJson, weightsPath: join(dir, 'v0.safetensors'), version: 0 },
    maxBatch: 4,
    maxLen: 96,
    gpuMemoryUtilization: 0.5,
    interrupt: 'next_token',
    weightsGroup: 'cpu',
    manager: { healthIntervalMs: 0, backoffBaseMs: 10 },
  });
}

/** Generates one turn per session; each result's log-probs against `reference`'s forward pass. */
async function turnsMatch(fleet: EngineProcesses, reference: Model, sessions: string[], version: number): Promise<Set<string>> {
  const servers = new Set<string>();
  const results = await Promise.all(sessions.map((s, i) => fleet.generate({ requestId: `${s}-${version}`, sessionId: s, promptIds: [3 + i, 7, 9, 11], sampling: sampling({ seed: i }) })));
  for (const [i, r] of results.entries()) {
    assert.ok(r.tokenIds.length > 0);
    assert.deepEqual(new Set(r.policyVersions), new Set([version]), `session ${sessions[i]}: every token of version ${version}`);
    const want = await forwardLogprobs(reference, [3 + i, 7, 9, 11], r.tokenIds);
    assert.ok(maxAbsDiff(r.logprobs, want) < 1e-4, `session ${sessions[i]} on ${r.server}: log-probs of version ${version}'s weights (max diff ${maxAbsDiff(r.logprobs, want)})`);
    servers.add(r.server);
  }
  return servers;
}

/**
 * A directory with version 0's weights (v0), a trainer model of other weights, and the fleet `run` starts (closed,
 * and everything disposed, after it).
 */
async function withFleet(run: (f: { dir: string; v0: Model; trainer: Model; open: (fleet: EngineProcesses) => EngineProcesses }) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'rls-engines-'));
  const v0 = Model.init(CFG, { seed: 1, threads: 1, initStd: 0.3 });
  const trainer = Model.init(CFG, { seed: 2, threads: 1, initStd: 0.3 });
  let fleet: EngineProcesses | null = null;
  try {
    await v0.save(join(dir, 'v0.safetensors'));
    await run({ dir, v0, trainer, open: (f) => (fleet = f) });
  } finally {
    await (fleet as EngineProcesses | null)?.close();
    v0.dispose();
    trainer.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Whether process `pid` is gone within `ms`. */
function goneWithin(pid: number, ms: number): Promise<boolean> {
  const until = Date.now() + ms;
  return new Promise((resolve) => {
    const poll = setInterval(() => {
      let alive = true;
      try {
        process.kill(pid, 0);
      } catch {
        alive = false;
      }
      if (!alive || Date.now() > until) {
        clearInterval(poll);
        resolve(!alive);
      }
    }, 20);
  });
}

test('two engine processes: least-load routing, sticky sessions, and a version broadcast from the trainer model here into both, no file read', { skip, timeout: 120_000 }, async () => {
  await withFleet(async ({ dir, v0, trainer, open }) => {
    const fleet = open(await start(dir, [0, 1]));
    assert.deepEqual(fleet.addresses, ['cpu:0', 'cpu:1']);
    const servers0 = await turnsMatch(fleet, v0, ['a', 'b', 'c', 'd'], 0);
    assert.deepEqual([...servers0].sort(), ['cpu:0', 'cpu:1'], 'four sessions at once spread over both engines');
    // version 1's file does not exist: an engine that read it would fail the update
    await fleet.stageWeights(1, trainer);
    await fleet.updatePolicy({ version: 1, weightsPath: join(dir, 'v1-not-written.safetensors'), configJson });
    assert.equal(fleet.currentPolicyVersion(), 1);
    await turnsMatch(fleet, trainer, ['e', 'f', 'g', 'h'], 1);
    // a session's next turn goes where its first went
    const first = await fleet.generate({ requestId: 's1', sessionId: 'sticky', promptIds: [1, 2, 3], sampling: sampling() });
    for (let k = 0; k < 3; k++) {
      const next = await fleet.generate({ requestId: `s${k + 2}`, sessionId: 'sticky', promptIds: [1, 2, 3, ...first.tokenIds, 5], sampling: sampling() });
      assert.equal(next.server, first.server);
    }
    assert.equal(fleet.broadcastStats().count, 1);
    assert.ok(fleet.deviceSeconds().generate > 0, "the engines' compute time is reported");
  });
});

test('LoRA: only the adapters are broadcast; each engine folds them into its weights from memory, and takes them out again for the next version', { skip, timeout: 120_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-engines-'));
  const base = join(dir, 'v0.safetensors');
  const v0 = Model.init(CFG, { seed: 1, threads: 1, initStd: 0.3 });
  let fleet: EngineProcesses | null = null;
  const made: Model[] = [v0];
  try {
    await v0.save(base);
    const trainer = Model.load(base, CFG, { threads: 1, lora: { rank: 4, alpha: 8, seed: 5, targets: ['q_proj', 'v_proj', 'down_proj'] } });
    made.push(trainer);
    fleet = await start(dir, [0, 1], undefined, true);
    const { offset, numel } = trainer.trainRange();
    for (const version of [1, 2, 3]) {
      // the trainer's adapters of this version: random, so that B A is not zero
      const block = trainer.blockView('params');
      for (let i = 0; i < numel; i++) block[offset + i] = Math.sin(version * 1000 + i) * 0.2;
      trainer.paramsWritten(offset, numel);
      const reference = Model.load(base, CFG, { threads: 1 });
      made.push(reference);
      reference.mergeAdapterTensors([...trainer.adapter()].map(([n, t]) => [n, Float32Array.from(t.data)]), { rank: 4, alpha: 8 }, 1, 'test');
      await fleet.stageWeights(version, trainer);
      await fleet.updatePolicy({ version, weightsPath: join(dir, `adapter-${version}-not-written.safetensors`), configJson, adapter: { path: join(dir, `adapter-${version}-not-written.safetensors`), baseWeightsPath: base } });
      await turnsMatch(fleet, reference, [`a${version}`, `b${version}`, `c${version}`], version);
    }
    assert.equal(fleet.broadcastStats().count, 3);
  } finally {
    await fleet?.close();
    for (const m of made) m.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an engine process SIGKILLed: its sessions move to the other engine, no broadcast waits on it, later versions arrive by file', { skip, timeout: 120_000 }, async () => {
  await withFleet(async ({ dir, trainer, open }) => {
    const fleet = open(await start(dir, [0, 1]));
    const pinned = await fleet.generate({ requestId: 'p1', sessionId: 'p', promptIds: [4, 5, 6], sampling: sampling() });
    const victim = fleet.pids[fleet.addresses.indexOf(pinned.server)]!;
    process.kill(victim, 'SIGKILL');
    assert.ok(await goneWithin(victim, 10_000));
    await new Promise((r) => setTimeout(r, 200)); // the exit event reaches the fleet
    const survivor = fleet.addresses.find((a) => a !== pinned.server)!;
    // the pinned session's next turn, on the engine that is left
    const moved = await fleet.generate({ requestId: 'p2', sessionId: 'p', promptIds: [4, 5, 6, ...pinned.tokenIds, 8], sampling: sampling() });
    assert.equal(moved.server, survivor);
    // the group is gone: staging returns at once, and the version is read from its file
    await fleet.stageWeights(1, trainer);
    await trainer.save(join(dir, 'v1.safetensors'));
    await assert.rejects(fleet.updatePolicy({ version: 1, weightsPath: join(dir, 'v1.safetensors'), configJson }), /reached 1 of 2 servers/);
    const servers = await turnsMatch(fleet, trainer, ['x', 'y'], 1);
    assert.deepEqual([...servers], [survivor]);
    assert.equal(fleet.broadcastStats().count, 0);
  });
});

test('an engine stopped (SIGSTOP) when a version is offered: the offer ends within the stage timeout, the engine is killed, the other serves the version from its file', { skip, timeout: 120_000 }, async () => {
  await withFleet(async ({ dir, trainer, open }) => {
    const fleet = open(await start(dir, [0, 1], 1500));
    const [stopped, other] = [fleet.pids[0]!, fleet.addresses[1]!];
    process.kill(stopped, 'SIGSTOP');
    const t0 = Date.now();
    await fleet.stageWeights(1, trainer);
    const took = Date.now() - t0;
    assert.ok(took >= 1400 && took < 10_000, `the offer waited for the stage timeout, not forever (${took} ms)`);
    assert.ok(await goneWithin(stopped, 10_000), 'the stopped engine was killed');
    await trainer.save(join(dir, 'v1.safetensors'));
    await assert.rejects(fleet.updatePolicy({ version: 1, weightsPath: join(dir, 'v1.safetensors'), configJson }), /reached 1 of 2 servers/);
    assert.deepEqual([...(await turnsMatch(fleet, trainer, ['x', 'y'], 1))], [other]);
    // the group is gone: the next offer returns at once
    const t1 = Date.now();
    await fleet.stageWeights(2, trainer);
    assert.ok(Date.now() - t1 < 100);
  });
});

test('generated: an engine SIGKILLed at a random moment of a run of versions and turns; every turn is answered with the log-probs of the version its tokens carry, no offer hangs', { skip, timeout: 300_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-engines-'));
  const v0 = Model.init(CFG, { seed: 1, threads: 1, initStd: 0.3 });
  try {
    await v0.save(join(dir, 'v0.safetensors'));
    let killedInLife = 0;
    const seeds = [1, 2, 3, 4, 5, 6];
    for (const seed of seeds) {
      const r = rng(seed);
      const weights = new Map<number, Model>([[0, v0]]);
      const fleet = await start(dir, [0, 1]);
      const victim = fleet.pids[Math.floor(r() * 2)]!;
      // where the kill lands: a version, a point in it (before its offer, between offer and update, with its turns
      // under way, after them) and a few milliseconds more, not awaited
      const killVersion = 1 + Math.floor(r() * 4);
      const killPoint = Math.floor(r() * 4);
      const killDelay = Math.floor(r() * 20);
      let killer: NodeJS.Timeout | undefined;
      const maybeKill = (version: number, point: number) => {
        if (version !== killVersion || point !== killPoint) return;
        killedInLife++;
        // after the last turns of the life: now, before the fleet closes
        if (version === 4 && point === 3) process.kill(victim, 'SIGKILL');
        else killer = setTimeout(() => process.kill(victim, 'SIGKILL'), killDelay);
      };
      try {
        for (let version = 1; version <= 4; version++) {
          const trainer = Model.init(CFG, { seed: 100 * seed + version, threads: 1, initStd: 0.3 });
          weights.set(version, trainer);
          await trainer.save(join(dir, `s${seed}-v${version}.safetensors`));
          maybeKill(version, 0);
          await fleet.stageWeights(version, trainer);
          maybeKill(version, 1);
          // after the kill the survivor takes the version and the update names the engine it did not reach
          await fleet.updatePolicy({ version, weightsPath: join(dir, `s${seed}-v${version}.safetensors`), configJson }).catch((err: Error) => assert.match(err.message, /reached 1 of 2 servers/));
          const pending = Promise.all([0, 1, 2, 3].map((i) => fleet.generate({ requestId: `s${seed}v${version}t${i}`, sessionId: `s${seed}-${i}`, promptIds: [3 + i, 7, 9], sampling: sampling({ seed: i, max_new_tokens: 6 }) })));
          maybeKill(version, 2);
          const turns = await pending;
          maybeKill(version, 3);
          for (const [i, t] of turns.entries()) {
            const versions = new Set(t.policyVersions);
            assert.equal(versions.size, 1, `seed ${seed}: a turn on one version (${[...versions].join(', ')})`);
            const want = await forwardLogprobs(weights.get(t.policyVersions[0]!)!, [3 + i, 7, 9], t.tokenIds);
            assert.ok(maxAbsDiff(t.logprobs, want) < 1e-4, `seed ${seed}, version ${version}, turn ${i} on ${t.server}: the log-probs of v${t.policyVersions[0]}`);
          }
        }
      } finally {
        clearTimeout(killer);
        await fleet.close();
        for (const [v, m] of weights) if (v !== 0) m.dispose();
      }
    }
    assert.equal(killedInLife, seeds.length, 'every life had its engine killed');
  } finally {
    v0.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('backend.devices refused where the GPUs are not, on the CPU engine, and on a trainer GPU, naming the key and the fix', () => {
  const none = { count: 0, source: 'nvidia-smi -L (not runnable here)' };
  const two = { count: 2, source: 'test' };
  const one = { ranks: 1, deviceIds: null };
  assert.match(engineDevicesProblems([1], 'cpu', undefined, two)[0]!, /^backend\.devices: .*set backend\.device: cuda/);
  assert.match(engineDevicesProblems([1], 'cuda', undefined, none)[0]!, /^backend\.devices: GPU 1 is not one of the 0 GPU\(s\) found; counted by nvidia-smi/);
  assert.deepEqual(engineDevicesProblems([1], 'cuda', { ...one, device: 'cuda' }, two), []);
  assert.match(engineDevicesProblems([0, 1], 'cuda', { ...one, device: 'cuda' }, two)[0]!, /GPU 0 is also the trainer's \(trainer\.devices: GPUs 0\)/);
  assert.match(engineDevicesProblems([1, 2, 3], 'cuda', { ranks: 2, deviceIds: null, device: 'cuda' }, { count: 4, source: 'test' })[0]!, /GPU 1 is also the trainer's \(trainer\.devices: GPUs 0, 1\)/);
  // a trainer on the CPU shares no GPU
  assert.deepEqual(engineDevicesProblems([0], 'cuda', { ...one, device: 'cpu' }, two), []);
});

// The trainer with trainer.devices > 1 on the CPU: its own process is rank 0 and ranks 1..N-1 are real child
// processes (consumers/trainer/parallel/launcher.ts, rank-main.ts) meeting through the reference collective. What
// must hold: N processes train what one process trains (same trajectories per step, same losses and weights within
// fp32 summation order), every rank writes its optimizer shard into each step's checkpoint, the processes are gone
// after close; a rank process killed at any moment (hand-picked and generated moments, SIGKILL) abandons the step
// under way with nothing committed, the restarted trainer (on any rank count) trains every trajectory exactly
// once; and when rank 0's process is killed, the other ranks' processes leave on their own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { rng } from '../../../core/random.ts';
import { openEmbeddedLog } from '../../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../../core/serde/events.ts';
import { TOPICS } from '../../../core/topics.ts';
import { cudaAvailable, nativeAvailable } from '../../../native/index.ts';
import { gpusFound } from '../../../native/gpus.ts';
import { ncclStatus } from '../../../native/collectives/nccl-collective.ts';
import type { Trainer } from '../../../consumers/trainer/trainer.ts';
import type { TrainStep } from '../../../schemas/generated/types.ts';
import { readAll, tinyTrainer, trainerInputs, type TinyTrainerSetup } from '../fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (npm run build:native)';
const RUN = 'dp-launch';
const GROUP_SIZE = 3;

async function setup(prefix: string, groups: number): Promise<TinyTrainerSetup & { close: () => Promise<void> }> {
  const inputs = await trainerInputs(prefix, RUN, Array.from({ length: groups }, (_, g) => ({ g })), GROUP_SIZE);
  const log = openEmbeddedLog({ dir: inputs.logDir });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  return { log, serde, runId: RUN, dataDir: join(inputs.dir, 'data'), weights: inputs.weights, close: () => log.close() };
}

function trainerOn(s: TinyTrainerSetup, ranks: number, steps: number, groupsPerStep: number, onStep?: (e: TrainStep) => void, device: 'cpu' | 'cuda' = 'cpu', stepTimeoutS = 1800): Trainer {
  return tinyTrainer(
    s,
    { groups_per_step: groupsPerStep, max_steps: steps, threads: 1, learning_rate: 0.01, staleness_bound: 1000, devices: ranks, device, data_parallel: { collective: device === 'cuda' ? 'nccl' : 'reference', step_timeout_s: stepTimeoutS } },
    { followControl: false, ...(onStep ? { onStep } : {}) },
  );
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function until(what: string, ok: () => boolean, ms = 15_000): Promise<void> {
  const t0 = Date.now();
  while (!ok()) {
    if (Date.now() - t0 > ms) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** The rank processes a trainer started (launcher internals, read for the test: pids of ranks 1..N-1). */
function rankPids(t: Trainer): number[] {
  return (t as unknown as { ranks: { pids: number[] } | null }).ranks?.pids ?? [];
}

/**
 * The trainer on 1 and on each of `counts` ranks over copies of one log: the same trajectories per step, losses
 * and weights within `tolerance` of one process, a shard per rank in every checkpoint, no rank process left.
 */
async function sameAsOneProcess(device: 'cpu' | 'cuda', counts: number[], tolerance: number): Promise<void> {
  const STEPS = 3;
  const results = new Map<number, { steps: TrainStep[]; params: Map<string, Float32Array> }>();
  for (const ranks of [1, ...counts]) {
    const s = await setup(`dp-launch-${device}-${ranks}`, 12);
    const steps: TrainStep[] = [];
    const t = trainerOn(s, ranks, STEPS, 4, (e) => steps.push(e), device);
    await t.start();
    const pids = rankPids(t);
    assert.equal(pids.length, ranks - 1, 'one process per rank beside this one');
    await t.run();
    const params = new Map([...t.liveModel.parameters()].map(([n, v]) => [n, Float32Array.from(v.data)]));
    await t.close();
    for (const pid of pids) await until(`rank process ${pid} gone after close`, () => !alive(pid));
    // every committed step's checkpoint holds every rank's optimizer shard (or one process's whole state)
    for (let k = 1; k <= STEPS; k++) {
      const dir = join(s.dataDir, 'trainer', `step-${k}`);
      let files: string[] = [];
      try {
        files = readdirSync(dir);
      } catch {
        continue; // pruned (keep_checkpoints)
      }
      const want = ranks === 1 ? ['optimizer.safetensors'] : Array.from({ length: ranks }, (_, r) => `optimizer-shard-${String(r).padStart(5, '0')}-of-${String(ranks).padStart(5, '0')}.safetensors`);
      for (const f of want) assert.ok(files.includes(f), `${dir} holds ${f}: ${files.join(', ')}`);
      assert.equal(files.filter((f) => f.startsWith('optimizer')).length, want.length, files.join(', '));
    }
    // what the log holds is what the trainer reported
    const logged = await readAll<TrainStep>(s.log, s.serde, TOPICS.trainSteps, 'TrainStep');
    assert.deepEqual(logged.map((e) => e.step), [1, 2, 3]);
    await s.close();
    results.set(ranks, { steps, params });
  }
  const one = results.get(1)!;
  for (const ranks of counts) {
    const r = results.get(ranks)!;
    for (let k = 0; k < STEPS; k++) {
      const [a, b] = [one.steps[k]!, r.steps[k]!];
      assert.deepEqual([...b.trajectory_ids].sort(), [...a.trajectory_ids].sort(), `step ${k + 1}: the same trajectories`);
      assert.equal(b.tokens, a.tokens);
      for (const key of ['loss', 'pg_loss', 'entropy', 'grad_norm', 'clip_fraction'] as const) {
        assert.ok(Math.abs(b[key] - a[key]) <= tolerance * Math.max(1, Math.abs(a[key])), `${ranks} ranks, step ${k + 1} ${key}: ${b[key]} vs ${a[key]}`);
      }
    }
    let worst = 0;
    for (const [name, v] of one.params) {
      const w = r.params.get(name)!;
      for (let i = 0; i < v.length; i++) worst = Math.max(worst, Math.abs(v[i]! - w[i]!));
    }
    assert.ok(worst <= tolerance, `${device}, ${ranks} ranks: weights within ${tolerance} of one process (max ${worst})`);
    console.log(`${device}, ${ranks} ranks against one process over ${STEPS} steps: weights within ${worst}`);
  }
}

test('N rank processes train what one process trains: the same trajectories per step, losses and weights within fp32 order, a shard per rank in every checkpoint, no process left', { skip, timeout: 180_000 }, () => sameAsOneProcess('cpu', [2, 3], 1e-5));

// On a machine with two GPUs or more and NCCL (the GPU machine; `bash test/gpu/pack-node.sh test DIR
// test/trainer/parallel/launcher.test.ts`): one process per GPU, the gradient block reduced on the device by NCCL.
// Within 1e-5, not bit for bit: the CUDA embedding backward sums with atomics (nccl.test.ts).
const gpus = ((): string | false => {
  if (skip) return skip;
  if (!cudaAvailable()) return 'no CUDA GPU here';
  const nccl = ncclStatus();
  if (!nccl.usable) return `NCCL cannot run here: ${nccl.reason}`;
  const found = gpusFound();
  return found.count >= 2 ? false : `two GPUs needed, ${found.count} found (${found.source})`;
})();
test('GPU ranks over NCCL train what one GPU trains', { skip: gpus, timeout: 300_000 }, () => sameAsOneProcess('cuda', [2], 1e-5));

/**
 * Lives of a trainer over one log until `steps` steps are committed, each life on `plan[i].ranks` ranks, with the
 * rank process `plan[i].kill` (1..N-1) killed `plan[i].afterMs` after the life starts its steps (null: no kill).
 * Returns the committed TrainSteps and every life's error.
 */
async function lives(s: TinyTrainerSetup, steps: number, plan: { ranks: number; kill: number | null; afterMs: number }[], device: 'cpu' | 'cuda' = 'cpu'): Promise<{ committed: TrainStep[]; errors: string[] }> {
  const errors: string[] = [];
  for (const life of [...plan, { ranks: 2, kill: null, afterMs: 0 }]) {
    const done = (await readAll<TrainStep>(s.log, s.serde, TOPICS.trainSteps, 'TrainStep')).length;
    if (done >= steps) break;
    const t = trainerOn(s, life.ranks, steps, 3, undefined, device);
    let timer: NodeJS.Timeout | undefined;
    try {
      await t.start();
      const pids = rankPids(t);
      if (life.kill !== null && pids.length > 0) {
        const pid = pids[(life.kill - 1) % pids.length]!;
        timer = setTimeout(() => process.kill(pid, 'SIGKILL'), life.afterMs);
      }
      await t.run();
    } catch (err) {
      errors.push((err as Error).message);
    } finally {
      clearTimeout(timer);
      await t.close();
    }
  }
  return { committed: await readAll<TrainStep>(s.log, s.serde, TOPICS.trainSteps, 'TrainStep'), errors };
}

function assertExactlyOnce(committed: TrainStep[], steps: number, groupsPerStep: number, what: string): void {
  assert.deepEqual(committed.map((e) => e.step), Array.from({ length: steps }, (_, k) => k + 1), `${what}: steps 1..${steps}, each once, in order`);
  const ids = committed.flatMap((e) => [...e.trajectory_ids, ...e.dropped_trajectory_ids]);
  assert.equal(new Set(ids).size, ids.length, `${what}: no trajectory trained twice`);
  assert.equal(ids.length, steps * groupsPerStep * GROUP_SIZE, `${what}: every trajectory of the ${steps * groupsPerStep} groups, once`);
}

/**
 * Two lives on `ranks` ranks that lose their last rank process: the first right after start (so before step 1: the
 * run fails, nothing is committed), the second inside step 2's commit (after rank 0's transaction, before it tells
 * the ranks: the run fails saying step 2 was committed, and it is in the log); then the rest on other rank counts.
 */
async function killedRanks(device: 'cpu' | 'cuda', ranks: number, rest: number[]): Promise<void> {
  const s = await setup(`dp-launch-kill-${device}`, 18);
  const last = ranks - 1;
  const before = trainerOn(s, ranks, 6, 3, undefined, device);
  await before.start();
  const victim = rankPids(before)[last - 1]!;
  process.kill(victim, 'SIGKILL');
  // reaped, so the launcher has seen it exit
  await until(`rank ${last}'s process reaped`, () => !alive(victim));
  await assert.rejects(before.run(), new RegExp(`data-parallel rank ${last} failed: its process \\(pid \\d+\\) exited \\(signal SIGKILL\\); the step is abandoned \\(nothing committed\\)`));
  await before.close();
  assert.deepEqual((await readAll<TrainStep>(s.log, s.serde, TOPICS.trainSteps, 'TrainStep')).length, 0, 'nothing committed');
  assert.deepEqual(await s.log.committed(`${RUN}.trainer`, TOPICS.advantaged), [], 'no offsets committed');
  const t = trainerOn(s, ranks, 6, 3, (e) => {
    if (e.step === 2) process.kill(rankPids(t)[last - 1]!, 'SIGKILL');
  }, device);
  await t.start();
  await assert.rejects(t.run(), new RegExp(`data-parallel rank ${last} failed after the step was committed: its process \\(pid \\d+\\) exited \\(signal SIGKILL\\); the step is in the log`));
  await t.close();
  const after = await readAll<TrainStep>(s.log, s.serde, TOPICS.trainSteps, 'TrainStep');
  assert.deepEqual(after.map((e) => e.step), [1, 2], 'step 2 is in the log, as the error says, and nothing after it');
  const offsets = await s.log.committed(`${RUN}.trainer`, TOPICS.advantaged);
  assert.equal(offsets.reduce((n, o) => n + o.offset, 0), 2 * 3 * GROUP_SIZE, 'the committed offsets are step 2\'s');
  // the rest on other rank counts (the checkpoint's shards of `ranks` ranks resumed on each)
  const { committed, errors } = await lives(s, 6, rest.map((r) => ({ ranks: r, kill: null, afterMs: 0 })), device);
  assert.deepEqual(errors, []);
  assertExactlyOnce(committed, 6, 3, 'after the kills');
  await s.close();
}

test('a rank process killed before a step abandons it with nothing committed, killed after the commit fails the run saying so; the error names the rank, and the restarted trainer (other rank counts) trains every trajectory once', { skip, timeout: 240_000 }, () => killedRanks('cpu', 3, [2]));

// Over NCCL the killed rank's peer is inside a collective on the device: the launcher sees the process exit and
// aborts rank 0's communicator (ncclCommAbort), which ends the collective with an error instead of a hang.
test('a GPU rank process killed before a step and after a commit: NCCL aborted, the errors true, the run resumed on two GPUs trains every trajectory once', { skip: gpus, timeout: 300_000 }, () => killedRanks('cuda', 2, []));

test('a rank process that stops answering (SIGSTOP) fails the run after trainer.data_parallel.step_timeout_s, naming it; it is killed, the error says truly whether the step was committed, and the resumed run trains every trajectory once', { skip, timeout: 120_000 }, async () => {
  const s = await setup('dp-launch-stop', 18);
  let stopped = 0;
  const t = trainerOn(s, 3, 6, 3, (e) => {
    if (e.step === 2) process.kill((stopped = rankPids(t)[0]!), 'SIGSTOP');
  }, 'cpu', 6);
  await t.start();
  const t0 = Date.now();
  // stopped inside step 2's commit, after rank 0's transaction and before it tells the ranks: step 2 is in the log,
  // and rank 1 never says it finished
  await assert.rejects(t.run(), /data-parallel rank 1 failed after the step was committed: rank\(s\) 1 did not finish the step within 6 s \(trainer\.data_parallel\.step_timeout_s\); their processes were killed; the step is in the log and the run resumes after it/);
  assert.ok(Date.now() - t0 < 30_000, `failed within the timeout, not a hang (${Date.now() - t0} ms)`);
  await t.close();
  await until(`the stopped rank process ${stopped} killed`, () => !alive(stopped) || /^[^)]*\) Z/.test(readFileSync(`/proc/${stopped}/stat`, 'utf8')));
  const after = await readAll<TrainStep>(s.log, s.serde, TOPICS.trainSteps, 'TrainStep');
  assert.deepEqual(after.map((e) => e.step), [1, 2], 'step 2 is in the log, as the error says, and nothing after it');
  const { committed, errors } = await lives(s, 6, [{ ranks: 3, kill: null, afterMs: 0 }]);
  assert.deepEqual(errors, []);
  assertExactlyOnce(committed, 6, 3, 'after the stop');
  await s.close();
});

test('generated kills: rank processes SIGKILLed at random moments over lives of 1-3 ranks; every trajectory trained exactly once', { skip, timeout: 420_000 }, async () => {
  for (const seed of [1, 2, 3]) {
    const r = rng(seed * 7919);
    const s = await setup(`dp-launch-gen-${seed}`, 15);
    const plan = Array.from({ length: 3 }, () => {
      const ranks = 1 + Math.floor(r() * 3);
      return { ranks, kill: ranks > 1 ? 1 + Math.floor(r() * (ranks - 1)) : null, afterMs: Math.floor(r() * 1200) };
    });
    const { committed, errors } = await lives(s, 5, plan);
    for (const e of errors) assert.match(e, /data-parallel rank \d+ failed/, `seed ${seed}: a life ends only by a rank failing`);
    assertExactlyOnce(committed, 5, 3, `seed ${seed} (${JSON.stringify(plan)}; ${errors.length} lives failed)`);
    await s.close();
  }
});

test('rank 0\'s process killed: the other ranks\' processes leave on their own', { skip, timeout: 120_000 }, async () => {
  const inputs = await trainerInputs('dp-launch-rank0', 'restart-test', Array.from({ length: 400 }, (_, g) => ({ g })), GROUP_SIZE);
  const fixture = join(import.meta.dirname, '..', 'fixtures', 'trainer-process.ts');
  const child = spawn(process.execPath, ['--import', 'tsx', fixture, inputs.logDir, join(inputs.dir, 'data'), inputs.weights, '0', '3'], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  let exited: number | null = null;
  child.on('exit', (code) => (exited = code ?? -1));
  await until('the trainer ready', () => {
    assert.equal(exited, null, 'the trainer process exited before it was ready');
    return out.includes('ready');
  }, 60_000);
  try {
    const ranks = childrenOf(child.pid!).filter((pid) => cmdline(pid).includes('rank-main.ts'));
    assert.equal(ranks.length, 2, `two rank processes under the trainer: ${ranks.join(', ')}`);
    child.kill('SIGKILL');
    for (const pid of ranks) await until(`rank process ${pid} gone after rank 0 was killed`, () => !alive(pid), 20_000);
  } finally {
    child.kill('SIGKILL');
  }
});

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
  } catch {
    return '';
  }
}

/** The processes whose parent is `pid` (from /proc; tsx's esbuild service is one of them too). */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

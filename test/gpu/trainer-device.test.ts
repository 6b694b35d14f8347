// trainer.device: the config key compiles everywhere; 'cuda' where the addon cannot run it stops the trainer, the
// SFT warm start and the main job at start-up with a ConfigError naming the field and the fix (the main job before
// it makes a run directory, which a restart would otherwise take for an unfinished run); where CUDA is available
// the trainer trains on the GPU, on the same samples and to the same losses as on the CPU (bf16 tolerance), and the
// main job on examples/calculator/config.gpu.yaml runs end to end.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadRunConfig } from '../../cli/config/run-config.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { RlstreamError } from '../../core/errors.ts';
import { checkDeviceRunsHere } from '../../consumers/trainer/device.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { runMainJob } from '../../cli/run/main-job.ts';
import { cudaAvailable, nativeAvailable } from '../../native/index.ts';
import type { TrainStep } from '../../schemas/generated/types.ts';
import { tinyTrainer, trainerInputs } from '../trainer/fixtures/synthetic.ts';

const GPU_CONFIG = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.gpu.yaml');
const cuda = cudaAvailable();
const noCuda = cuda ? 'CUDA is available here' : false;
const needsCuda = cuda ? false : 'needs the addon built with RLSTREAM_CUDA=1 and a GPU (test/gpu/pack-node.sh)';

/** The precise start-up error: CONFIG_INVALID at trainer.device, saying why and both fixes. */
function isDeviceError(e: unknown): boolean {
  return (
    e instanceof ConfigError &&
    e.issues.length === 1 &&
    e.issues[0]!.path === 'trainer.device' &&
    /'cuda' cannot run in this process/.test(e.message) &&
    e.message.includes('RLSTREAM_CUDA=1 npm run build:native') &&
    e.message.includes('set trainer.device: cpu')
  );
}

test('trainer.device compiles: cpu by default, cuda accepted, anything else refused naming the field', () => {
  assert.equal(compileTrainerOptions({}).device, 'cpu');
  assert.equal(compileTrainerOptions({ device: 'cuda' }).device, 'cuda');
  assert.throws(
    () => compileTrainerOptions({ device: 'gpu' }),
    (e: unknown) => e instanceof ConfigError && e.issues.some((i) => i.path === 'trainer.device'),
  );
  // The GPU example compiles on any machine (a config is checked where it is written, not only where it trains).
  const c = loadRunConfig(GPU_CONFIG);
  assert.equal(c.trainer.device, 'cuda');
  assert.equal(c.traces.kind, 'none');
  assert.equal(loadRunConfig(GPU_CONFIG, { 'trainer.device': 'cpu' }).trainer.device, 'cpu');
});

test("trainer.device 'cpu' passes the start-up check everywhere", () => {
  assert.doesNotThrow(() => checkDeviceRunsHere('cpu'));
});

test("trainer.device 'cuda' without CUDA: the main job fails at start-up, naming the field and the fix, and leaves no run behind", { skip: noCuda, timeout: 60_000 }, async () => {
  assert.throws(() => checkDeviceRunsHere('cuda'), isDeviceError);
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-gpu-config-'));
  try {
    // refused by the run's config check (the problems config check lists), before the roles start
    const preflight = (e: unknown) =>
      e instanceof RlstreamError && e.code === 'CONFIG_INVALID' && /\n {2}trainer\.device: 'cuda' cannot run in this process: .*RLSTREAM_CUDA=1 npm run build:native.*set trainer\.device: cpu/.test(e.message);
    await assert.rejects(runMainJob({ configPath: GPU_CONFIG, overrides: { 'run.data_dir': dir }, admin: false, progress: false }), preflight);
    assert.deepEqual(readdirSync(dir), [], 'no run directory (a restart would resume it as an unfinished run)');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("trainer.device 'cuda' without CUDA: a trainer process (rlstream worker trainer) fails in start() with the same error", { skip: noCuda || (!nativeAvailable() && 'native addon not built'), timeout: 60_000 }, async () => {
  const { dir, logDir, weights } = await setUp(1);
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const trainer = tinyTrainer({ log, serde, runId: RUN, dataDir: join(dir, 'data'), weights }, { device: 'cuda', max_steps: 1 }, { followControl: false });
    await assert.rejects(trainer.start(), isDeviceError);
    assert.equal(existsSync(join(dir, 'data', 'weights')), false, 'nothing published');
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

const RUN = 'device-test';

function setUp(groups: number): Promise<{ dir: string; logDir: string; weights: string }> {
  return trainerInputs('trainer-device', RUN, Array.from({ length: groups }, (_, g) => ({ g })), 4);
}

/** A trainer over a fresh copy of the same samples, on `device`, to max_steps; its steps. */
async function trainOn(device: 'cpu' | 'cuda', steps: number): Promise<{ steps: TrainStep[]; device: string }> {
  const { dir, logDir, weights } = await setUp(steps * 2);
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const seen: TrainStep[] = [];
    const trainer = tinyTrainer({ log, serde, runId: RUN, dataDir: join(dir, 'data'), weights }, { device, max_steps: steps, groups_per_step: 2, staleness_bound: 100, learning_rate: 1e-2, threads: 1 }, { followControl: false, onStep: (s) => seen.push(s) });
    await trainer.start();
    const on = trainer.device;
    await trainer.run();
    await trainer.close();
    return { steps: seen, device: on };
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('the trainer on cuda trains the same samples to the same losses as on cpu (bf16 tolerance)', { skip: needsCuda, timeout: 120_000 }, async () => {
  const cpu = await trainOn('cpu', 3);
  const gpu = await trainOn('cuda', 3);
  assert.equal(cpu.device, 'cpu');
  assert.equal(gpu.device, 'cuda');
  assert.equal(gpu.steps.length, 3);
  for (let i = 0; i < 3; i++) {
    const a = cpu.steps[i]!;
    const b = gpu.steps[i]!;
    assert.deepEqual(b.trajectory_ids, a.trajectory_ids, `step ${i + 1}: same samples`);
    assert.equal(b.produced_version, a.produced_version);
    // After 0, 1 and 2 AdamW updates at lr 1e-2 (each moves every weight by ~1e-2): bf16 products move the loss
    // and the entropy by ~1e-3, an update missed or applied wrongly by far more.
    assert.ok(Math.abs(b.loss - a.loss) <= 1e-2 * Math.abs(a.loss) + 5e-3, `step ${i + 1}: loss ${b.loss} on cuda vs ${a.loss} on cpu`);
    assert.ok(Math.abs(b.entropy - a.entropy) <= 5e-3 * Math.abs(a.entropy), `step ${i + 1}: entropy ${b.entropy} on cuda vs ${a.entropy} on cpu`);
    assert.ok(Math.abs(b.grad_norm - a.grad_norm) <= 3e-2 * a.grad_norm, `step ${i + 1}: grad norm ${b.grad_norm} on cuda vs ${a.grad_norm} on cpu`);
  }
});

test('the main job on examples/calculator/config.gpu.yaml runs end to end with the trainer on cuda', { skip: needsCuda, timeout: 300_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-gpu-run-'));
  try {
    const steps: TrainStep[] = [];
    const s = await runMainJob({
      configPath: GPU_CONFIG,
      overrides: { 'run.data_dir': dir, 'trainer.max_steps': 4, 'task.heldout_problems': 16, 'eval.every_steps': 2 },
      admin: false,
      progress: false,
      onTrainStep: (st) => steps.push(st),
    });
    assert.equal(s.steps, 4);
    assert.equal(s.policy_versions, 5);
    assert.ok(s.trajectories >= 4 * 8 * 8, `trained ${s.trajectories} trajectories`);
    assert.ok(s.rl.trainer_compute_seconds > 0 && s.rl.generated_tokens > 0);
    assert.ok(steps.every((st) => Number.isFinite(st.loss) && Number.isFinite(st.grad_norm)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// trainer.devices and trainer.data_parallel: each bad value refused at its path when the config compiles, the GPUs
// a run asks for checked against the GPUs found (by the CUDA runtime through the addon, else nvidia-smi -L), and
// `config check` and `rlstream run` refusing, with the count found, a config asking for more GPUs than this machine
// has (this machine's own count, whatever it is: CI machines have none).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { ConfigError } from '../../../core/config/validate.ts';
import { compileTrainerOptions } from '../../../consumers/trainer/options.ts';
import { checkTrainerDevices, devicesProblems } from '../../../consumers/trainer/parallel/devices.ts';
import { gpusFound } from '../../../native/gpus.ts';
import { checkConfig } from '../../../cli/run/preflight.ts';

const ROOT = join(import.meta.dirname, '..', '..', '..');

function issues(raw: Record<string, unknown>): string[] {
  try {
    compileTrainerOptions(raw);
  } catch (err) {
    if (err instanceof ConfigError) return err.issues.map((i) => `${i.path}: ${i.message}`);
    throw err;
  }
  return [];
}

test('the defaults: one rank, 25 MiB fp32 buckets over NCCL, a step with fewer groups than ranks refused', () => {
  const o = compileTrainerOptions({});
  assert.deepEqual({ ...o.dataParallel }, { ranks: 1, deviceIds: null, bucketBytes: 25 * 1024 * 1024, dtype: 'fp32', collective: 'nccl', fewerGroups: 'refuse', onGpus: false, stepTimeoutMs: 1_800_000 });
  const list = compileTrainerOptions({ device: 'cuda', devices: [0, 2, 5], groups_per_step: 3, data_parallel: { reduce_dtype: 'bf16', bucket_bytes: 2 * 1001, step_timeout_s: 90.5 } });
  assert.deepEqual({ ...list.dataParallel, deviceIds: [...list.dataParallel.deviceIds!] }, { ranks: 3, deviceIds: [0, 2, 5], bucketBytes: 2002, dtype: 'bf16', collective: 'nccl', fewerGroups: 'refuse', onGpus: true, stepTimeoutMs: 90_500 });
  // CPU ranks: processes meeting through the reference collective
  const cpu = compileTrainerOptions({ devices: 3, groups_per_step: 3, data_parallel: { collective: 'reference' } });
  assert.deepEqual([cpu.dataParallel.ranks, cpu.dataParallel.onGpus, cpu.dataParallel.collective], [3, false, 'reference']);
});

test('bad trainer.devices and trainer.data_parallel values are refused at their path, with the fix', () => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ devices: 0 }, /^trainer\.devices: must be >= 1/],
    [{ devices: -3 }, /^trainer\.devices: must be >= 1/],
    [{ devices: 1.5 }, /^trainer\.devices: /],
    [{ devices: 'two' }, /^trainer\.devices: /],
    [{ devices: [] }, /^trainer\.devices: must list at least 1 item/],
    [{ devices: [0, 0], device: 'cuda' }, /^trainer\.devices: /],
    [{ devices: [-1] }, /^trainer\.devices\[0\]: must be >= 0/],
    [{ devices: 2 }, /^trainer\.devices: 2 ranks on trainer\.device: cpu need the reference collective \(NCCL reduces GPU memory\); set trainer\.device: cuda \(one GPU each\), or trainer\.data_parallel\.collective: reference, or trainer\.devices: 1$/],
    [{ devices: 2, device: 'cuda', data_parallel: { collective: 'reference' } }, /^trainer\.data_parallel\.collective: 'reference' cannot reach GPU memory; GPU ranks reduce with NCCL: set it to nccl \(or trainer\.device: cpu\)$/],
    [{ devices: 2, device: 'cuda', kl_coef: 0.1 }, /^trainer\.kl_coef: 0\.1 needs a reference model on every rank, which the data-parallel step does not hold yet; set it to 0, or trainer\.devices: 1$/],
    [{ devices: [1, 0], device: 'cuda' }, /^trainer\.devices: \[1, 0\] puts rank 0 on GPU 1, but rank 0 is the trainer's own process and trains on the first GPU it sees; list 0 first/],
    [{ devices: 4, device: 'cuda', groups_per_step: 2 }, /^trainer\.groups_per_step: 2 group\(s\) per step cannot cover 4 ranks \(a group is never split\); raise it to at least 4, or set trainer\.data_parallel\.fewer_groups: idle$/],
    [{ data_parallel: { bucket_bytes: 6 } }, /^trainer\.data_parallel\.bucket_bytes: 6 is not a whole number of fp32 elements \(4 bytes each\); use a multiple of 4$/],
    [{ data_parallel: { bucket_bytes: 2 } }, /^trainer\.data_parallel\.bucket_bytes: must be >= 4/],
    [{ data_parallel: { reduce_dtype: 'fp16' } }, /^trainer\.data_parallel\.reduce_dtype: must be one of fp32, bf16/],
    [{ data_parallel: { collective: 'gloo' } }, /^trainer\.data_parallel\.collective: must be one of nccl, reference/],
    [{ data_parallel: { bucket_mb: 25 } }, /^trainer\.data_parallel\.bucket_mb: /],
    [{ data_parallel: { step_timeout_s: 0 } }, /^trainer\.data_parallel\.step_timeout_s: must be > 0/],
  ];
  for (const [raw, want] of cases) {
    const got = issues(raw);
    assert.ok(got.length >= 1, `${JSON.stringify(raw)} compiled`);
    assert.match(got.join('\n'), want, `${JSON.stringify(raw)}: ${got.join(' | ')}`);
  }
  // fewer groups than ranks is accepted where the extra ranks may idle
  assert.deepEqual(issues({ devices: 4, device: 'cuda', groups_per_step: 2, data_parallel: { fewer_groups: 'idle' } }), []);
});

test('the GPUs asked for against the GPUs found: too many, an index past the last, one GPU other than the first; CPU ranks ask for none', () => {
  const dp = (raw: Record<string, unknown>) => compileTrainerOptions({ device: 'cuda', groups_per_step: 8, ...raw }).dataParallel;
  const smi = (count: number) => ({ count, source: 'nvidia-smi -L' });
  assert.deepEqual(devicesProblems(dp({}), smi(0)), [], 'one rank asks nothing of the machine here (trainer.device checks the GPU)');
  assert.deepEqual(devicesProblems(dp({ devices: [0] }), smi(1)), []);
  const tooMany = devicesProblems(dp({ devices: 4 }), smi(1));
  assert.match(tooMany[0]!, /^trainer\.devices: asks for 4 GPU\(s\); this machine has 1 \(counted by nvidia-smi -L\)\. Set trainer\.devices to at most 1$/);
  assert.equal(tooMany.length, 1, tooMany.join('\n'));
  assert.match(devicesProblems(dp({ devices: 2 }), smi(0))[0]!, /this machine has 0 \(counted by nvidia-smi -L\)\. Set trainer\.devices to at most 1 and trainer\.device: cpu$/);
  const past = devicesProblems(dp({ devices: [0, 7] }), smi(4));
  assert.ok(past.includes('trainer.devices: GPU 7 is not one of the 4 GPU(s) found (indices 0 to 3; counted by nvidia-smi -L)'), past.join('\n'));
  assert.match(devicesProblems(dp({ devices: [3] }), smi(4))[0]!, /^trainer\.devices: \[3\] selects GPU 3, but the trainer trains on the first GPU it sees; start the run with CUDA_VISIBLE_DEVICES=3 and set trainer\.devices: 1$/);
  // enough GPUs: accepted
  assert.deepEqual(devicesProblems(dp({ devices: 8 }), smi(8)), []);
  assert.deepEqual(devicesProblems(dp({ devices: [0, 3] }), smi(4)), []);
  assert.throws(() => checkTrainerDevices(dp({ devices: [0, 2, 9] }), smi(2)), (e: unknown) => e instanceof ConfigError && e.issues.length === 3 && e.issues.every((i) => i.path === 'trainer.devices'));
  // CPU ranks never count GPUs
  const cpu = compileTrainerOptions({ devices: 4, groups_per_step: 8, data_parallel: { collective: 'reference' } }).dataParallel;
  assert.deepEqual(devicesProblems(cpu, () => assert.fail('CPU ranks must not count GPUs')), []);
});

test('this machine\'s GPUs: counted by the CUDA runtime through the addon or by nvidia-smi -L, whichever is here', () => {
  const found = gpusFound();
  const smi = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' });
  assert.ok(Number.isInteger(found.count) && found.count >= 0);
  if (smi.status !== 0) {
    // no driver tool: neither can the CUDA runtime see a GPU
    assert.equal(found.count, 0, found.source);
  } else if (process.env['CUDA_VISIBLE_DEVICES'] === undefined) {
    assert.equal(found.count, smi.stdout.split('\n').filter((l) => /^GPU \d+:/.test(l)).length, found.source);
  }
});

test('config check and rlstream run refuse more GPUs than this machine has, naming the count found', async () => {
  const config = join(ROOT, 'examples', 'calculator', 'config.yaml');
  const found = gpusFound();
  // at least 2: one rank asks nothing of the machine's GPU count (trainer.device 'cuda' is checked on its own)
  const asked = Math.max(2, found.count + 1);
  const { problems } = await checkConfig(config, { 'trainer.device': 'cuda', 'trainer.devices': asked, 'trainer.groups_per_step': Math.max(8, asked) });
  assert.ok(problems.some((p) => p.startsWith(`trainer.devices: asks for ${asked} GPU(s); this machine has ${found.count} (counted by ${found.source})`)), problems.join('\n'));
  // the command line, --nproc as the count: check exits 1, and run refuses before it makes a run directory
  const cli = (args: string[]) => spawnSync(process.execPath, [join(ROOT, 'bin', 'rlstream.js'), ...args], { encoding: 'utf8', cwd: ROOT, timeout: 120_000 });
  const nproc = ['--set', 'trainer.device=cuda', '--set', `trainer.groups_per_step=${Math.max(8, asked)}`, '--nproc', String(asked)];
  const check = cli(['config', 'check', config, ...nproc]);
  assert.equal(check.status, 1, check.stderr);
  assert.match(check.stderr, new RegExp(`trainer\\.devices: asks for ${asked} GPU\\(s\\); this machine has ${found.count} `));
  const run = cli(['run', config, '--new', '--no-admin', ...nproc]);
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, new RegExp(`trainer\\.devices: asks for ${asked} GPU\\(s\\); this machine has ${found.count} `));
  assert.doesNotMatch(run.stderr, /^run: /m, 'no run was chosen or made');
  // a count that is not one is named at its path
  const bad = cli(['config', 'check', config, '--nproc', 'two']);
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /trainer\.devices: /);
});

// The native core's CUDA layer builds, links and loads where nvcc is installed, so that CUDA code that no longer
// compiles fails here rather than on the GPU machine. The addon is built with RLSTREAM_CUDA=1 (native/binding.gyp,
// through npm as `npm run build:native` does, or node-gyp directly where there is no npm: the GPU machine's Node
// comes from test/gpu/pack-node.sh without it) into a copy of native/, and loaded in a child process. Where no GPU is
// usable (every CI machine) device 'cuda' is refused with that reason; where nvidia-smi lists one, a CUDA forward
// runs and agrees with the CPU's. Either way the same build runs a model's forward on the CPU. Skips without nvcc;
// fails instead under RLSTREAM_REQUIRE_SERVICES=1 (infra/setup.sh installs Debian's nvidia-cuda-toolkit).
// A build of the same sources with the same compilers and Node done before on this machine (its key:
// infra/native-key.sh) is copied from the per-user cache instead of compiled again; the probe always runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** The CUDA install binding.gyp will use: CUDA_HOME, /usr/local/cuda, or the one whose nvcc is on PATH. */
function cudaHome(): string | null {
  for (const home of [process.env['CUDA_HOME'], '/usr/local/cuda']) if (home && existsSync(join(home, 'bin', 'nvcc'))) return home;
  const which = spawnSync('sh', ['-c', 'command -v nvcc'], { encoding: 'utf8' });
  return which.status === 0 && which.stdout.trim() !== '' ? dirname(dirname(which.stdout.trim())) : null;
}

const home = cudaHome();
const required = process.env['RLSTREAM_REQUIRE_SERVICES'] === '1';
const skip = home || required ? false : 'nvcc not found: the CUDA layer is not built here (bash infra/setup.sh installs it)';
// Whether this machine has a GPU, asked of the driver, not of the build under test
const hasGpu = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' }).status === 0;

// What the child process checks, on the addon built with the CUDA layer: the raw addon, loaded from its path.
const PROBE = `
import { createRequire } from 'node:module';
import { parseModelConfig } from ${JSON.stringify(join(ROOT, 'native/model.ts'))};
const addon = createRequire(import.meta.url)(process.argv[1]);
const cfg = parseModelConfig({ hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
  intermediate_size: 128, vocab_size: 100, rope_theta: 10000, rms_norm_eps: 1e-5, tie_word_embeddings: true,
  max_position_embeddings: 64, attention_bias: false });
const make = (device) => new addon.NativeModel(cfg, { threads: 1, random: true, seed: 1, initStd: 0.02, device });
let refused = null, gpu = null;
try { gpu = make('cuda'); } catch (e) { refused = String(e.message); }
// a forward of one 6-token sequence on the CPU (and on the GPU where there is one): each token's log-prob of the
// next (a distribution over 100); the same seed gives both models the same weights
const tokens = Int32Array.of(1, 2, 3, 4, 5, 6), logprobs = new Float32Array(6), entropy = new Float32Array(6);
await make('cpu').forward(tokens, Int32Array.of(0, 6), Int32Array.of(2, 3, 4, 5, 6, 7), logprobs, entropy);
let cudaLogprobs = null;
if (gpu) {
  const lp = new Float32Array(6), ent = new Float32Array(6);
  await gpu.forward(tokens, Int32Array.of(0, 6), Int32Array.of(2, 3, 4, 5, 6, 7), lp, ent);
  cudaLogprobs = [...lp];
}
console.log(JSON.stringify({ backend: addon.backend, cuda: addon.cudaAvailable(), refused, logprobs: [...logprobs], entropy: [...entropy], cudaLogprobs }));
`;

/** node-gyp as `npm run build:native` runs it, or directly where this machine's Node came without npm. */
function nodeGyp(): { cmd: string; args: string[] } {
  if (spawnSync('npm', ['--version'], { encoding: 'utf8' }).status === 0) return { cmd: 'npm', args: ['exec', '--no', '--', 'node-gyp'] };
  // Node's own headers beside its binary (pack-node.sh unpacks include/node there), as pack-node.sh's build uses
  const prefix = dirname(dirname(process.execPath));
  const nodedir = existsSync(join(prefix, 'include', 'node', 'node_api.h')) ? [`--nodedir=${prefix}`] : [];
  return { cmd: process.execPath, args: [join(ROOT, 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'), ...nodedir] };
}

test('the CUDA layer builds with nvcc and loads without a GPU: cuda refused with the reason, a CPU forward runs', { skip, timeout: 900_000 }, (t) => {
  assert.ok(home, 'nvcc is not installed (bash infra/setup.sh installs Debian nvidia-cuda-toolkit)');
  // (not testkit's tempDir: it loads the event schemas, whose npm modules the GPU machine's pack does not carry)
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-cuda-build-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  for (const part of ['binding.gyp', 'src', 'cuda']) cpSync(join(ROOT, 'native', part), join(dir, 'native', part), { recursive: true });
  // node-addon-api (binding.gyp's include dir) and node-gyp resolve from here; npm brings this machine's npm
  // config (its nodedir, say) as for `npm run build:native`.
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'));
  writeFileSync(join(dir, 'package.json'), '{ "private": true }\n');
  const addon = join(dir, 'native/build/Release/rlstream_native.node');
  // The same sources, compilers and Node built before on this machine: that build is this one (infra/native-key.sh)
  const env = { ...process.env, RLSTREAM_CUDA: '1', CUDA_HOME: home!, NODE: process.execPath };
  const key = spawnSync('bash', [join(ROOT, 'infra/native-key.sh'), ROOT], { env, encoding: 'utf8' });
  const cached = key.status === 0 ? join(process.env['RLSTREAM_CACHE_DIR'] ?? join(homedir(), '.cache', 'rlstream'), 'native', key.stdout.trim(), 'rlstream_native.node') : null;
  if (cached && existsSync(cached)) {
    t.diagnostic(`the CUDA build of these sources is in ${dirname(cached)}: not compiled again`);
    mkdirSync(dirname(addon), { recursive: true });
    copyFileSync(cached, addon);
  } else {
    const gyp = nodeGyp();
    const build = spawnSync(gyp.cmd, [...gyp.args, 'rebuild', '--directory', 'native'], { cwd: dir, env, encoding: 'utf8', maxBuffer: 64 << 20 });
    // (a build that could not start has no output, only its error)
    assert.equal(build.status, 0, `the CUDA build failed:\n${`${build.error ? `${String(build.error)}\n` : ''}${build.stdout ?? ''}${build.stderr ?? ''}`.slice(-6000)}`);
    if (cached) {
      try {
        mkdirSync(dirname(cached), { recursive: true });
        copyFileSync(addon, `${cached}.tmp`);
        renameSync(`${cached}.tmp`, cached);
      } catch {
        // the cache only saves time: a read-only or full home must not fail the check
      }
    }
  }
  const probe = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', PROBE, addon], { cwd: ROOT, encoding: 'utf8' });
  assert.equal(probe.status, 0, probe.stderr);
  const got = JSON.parse(probe.stdout.trim().split('\n').at(-1)!) as { backend: string; cuda: boolean; refused: string | null; logprobs: number[]; entropy: number[]; cudaLogprobs: number[] | null };
  assert.equal(got.backend, 'cpu+cuda', 'the CUDA layer is compiled in');
  if (hasGpu) {
    assert.equal(got.cuda, true, 'nvidia-smi lists a GPU: the CUDA build must find it usable');
    assert.equal(got.refused, null);
    // bf16 products on the GPU against fp32 on the CPU, same weights: equal to well within bf16's rounding
    for (let i = 0; i < 6; i++) assert.ok(Math.abs(got.cudaLogprobs![i]! - got.logprobs[i]!) < 1e-2, `token ${i}: cuda ${got.cudaLogprobs![i]} vs cpu ${got.logprobs[i]}`);
  } else {
    assert.equal(got.cuda, false, 'no GPU is usable on this machine');
    assert.match(got.refused ?? '', /no CUDA GPU is usable on this machine/);
  }
  // near-uniform over 100 tokens at initStd 0.02: log-probs and entropies close to ln(1/100) and ln(100)
  for (const lp of got.logprobs) assert.ok(Math.abs(lp + Math.log(100)) < 0.5, `CPU forward of the CUDA build: log-prob ${lp}`);
  for (const h of got.entropy) assert.ok(Math.abs(h - Math.log(100)) < 0.5, `CPU forward of the CUDA build: entropy ${h}`);
});

// The built-in CPU policy under the main job's rollout load, on this checkout and on others side by side: one engine
// (one of the main job's two engine workers: max_batch 32, kv_cache_bytes 128 MiB, 1 thread) on the calculator's
// checkpoint, 32 trajectories in flight of 1-3 sessioned turns (a 40-69-token prompt, up to 15-96 new tokens a turn
// at temperature 1 with no stop token, 8 tool tokens appended between turns), 192 trajectories in all, and a new
// policy version (rollout.interrupt next_turn, the default) after every --swap-every finished trajectories, one
// update at a time. Each checkout runs in its own process, in interleaved rounds (the order rotates each round);
// tokens per CPU-second of that process (the figure that moves least with other load on a shared machine), tokens
// per second, and the mean time a swap took from its request to its return. --tree takes other checkouts (each a
// directory with producers/policy/engine-host.ts's InProcessEngine, e.g. `git worktree add /tmp/old b2cf3f8`,
// node_modules and native/build linked in); the ratios are taken within each round against this checkout.
// Run: npm run bench -- engine-replay [--tree DIR,DIR,…] [--rounds 3] [--swap-every 16] (0: no swaps).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchChildSpec, runBenchChild, writeBenchChildResult } from './child.ts';
import { int, parseFlags, ROUND_FLAGS, type Flag } from './flags.ts';
import { fmtStats, interleaved, probeSummary, roundRatios, summarize, type Mode, type RoundRecord } from './harness.ts';

const MARKER = 'ENGINE-REPLAY ';
const HERE = resolve(fileURLToPath(new URL('..', import.meta.url)));
const IN_FLIGHT = 32;
const TRAJECTORIES = 192;

interface Spec {
  dataDir: string;
  tree: string;
  swapEvery: number;
}

interface Result {
  tokens: number;
  wallMs: number;
  cpuMs: number;
  tokensPerS: number;
  tokensPerCpuS: number;
  swaps: number;
  meanSwapMs: number;
}

interface Engine {
  generate(r: unknown): Promise<{ tokenIds: number[] }>;
  releaseSession(id: string): void;
  load(config: unknown, weights: unknown, version: number): Promise<unknown>;
  close(): Promise<void>;
}

async function replay(spec: Spec): Promise<Result> {
  const from = (p: string) => import(join(spec.tree, p));
  const { InProcessEngine } = (await from('producers/policy/engine-host.ts')) as { InProcessEngine: { create(...a: unknown[]): Promise<Engine> } };
  const { policyConfig } = (await from('producers/policy/config.ts')) as { policyConfig(json: string): unknown };
  const { readSafetensors } = (await from('core/weights/safetensors.ts')) as { readSafetensors(p: string): Promise<unknown> };
  // The same model and weights for every checkout: this one's.
  const dir = join(HERE, 'examples/calculator');
  const config = policyConfig(readFileSync(join(dir, 'model.json'), 'utf8'));
  const weights = await readSafetensors(join(dir, 'checkpoints/sft/model.safetensors'));
  const setup = { maxBatch: 32, kvCacheBytes: 128 * 1024 * 1024, maxLen: 512, interrupt: 'next_turn', threads: 1, server: 'bench' };
  const quiet = { debug() {}, info() {}, warn() {}, error() {}, child: () => quiet };
  const engine = await InProcessEngine.create(config, weights, 0, setup, quiet);
  // One fixed stream of lengths and tokens, whatever the engine samples.
  let seed = 12345;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  let tokens = 0;
  let done = 0;
  let version = 0;
  let swapMs = 0;
  let swaps = 0;
  let updates: Promise<void> = Promise.resolve();
  const trajectory = async (i: number) => {
    const turns = 1 + rnd(3);
    let ctx = Array.from({ length: 40 + rnd(30) }, () => 1 + rnd(500));
    for (let t = 0; t < turns && ctx.length <= 400; t++) {
      const sampling = { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 15 + rnd(82), seed: i * 10 + t, stop_token_ids: [] };
      const r = await engine.generate({ requestId: `r${i}.${t}`, sessionId: `s${i}`, promptIds: ctx, sampling });
      tokens += r.tokenIds.length;
      ctx = [...ctx, ...r.tokenIds, ...Array.from({ length: 8 }, () => 1 + rnd(500))];
    }
    engine.releaseSession(`s${i}`);
    if (++done % spec.swapEvery === 0 && spec.swapEvery > 0) {
      const v = ++version;
      const t0 = performance.now();
      // One update at a time, as the backend's PolicyUpdates applies them.
      updates = updates.then(async () => {
        await engine.load(config, weights, v);
        swapMs += performance.now() - t0;
        swaps++;
      });
    }
  };
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  let started = 0;
  const lane = async () => {
    while (started < TRAJECTORIES) await trajectory(started++);
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, lane));
  await updates;
  const wallMs = performance.now() - t0;
  const cpu = process.cpuUsage(c0);
  const cpuMs = (cpu.user + cpu.system) / 1000;
  await engine.close();
  return { tokens, wallMs, cpuMs, tokensPerS: (tokens / wallMs) * 1000, tokensPerCpuS: (tokens / cpuMs) * 1000, swaps, meanSwapMs: swaps > 0 ? swapMs / swaps : 0 };
}

const child = benchChildSpec<Spec>(import.meta.url);
if (child) writeBenchChildResult(MARKER, await replay(child));

const trees: Flag<string[]> = { takesValue: true, hint: 'DIR,DIR,…', parse: (raw) => raw.split(',').filter((x) => x !== '').map((x) => resolve(x)) };

export async function main(args: string[]): Promise<unknown> {
  const { values: f } = parseFlags(args, { ...ROUND_FLAGS, tree: trees, 'swap-every': int(0) });
  const rounds = f.rounds ?? (f.quick ? 1 : 3);
  const swapEvery = f['swap-every'] ?? 16;
  const others = f.tree ?? [];
  const label = (t: string) => (t === HERE ? 'this checkout' : basename(t));
  const all = [HERE, ...others];
  const dataDir = mkdtempSync(join(tmpdir(), 'rlstream-engine-replay-'));
  try {
    const modes: Mode<Result>[] = all.map((tree) => ({ name: label(tree), run: () => runBenchChild<Result>(import.meta.url, label(tree), { dataDir, tree, swapEvery } as Spec, MARKER, 600) }));
    // The order rotates each round, so neither side always runs first.
    const records: RoundRecord<Result>[] = [];
    for (let r = 0; r < rounds; r++) {
      const order = modes.map((_, i) => modes[(i + r) % modes.length]!);
      const log = (line: string) => console.log(line.replace(/^round 1\/1/, `round ${r + 1}/${rounds}`));
      for (const rec of await interleaved(order, 1, log)) records.push({ ...rec, round: r });
    }
    const perCpu = summarize(records, (x) => x.tokensPerCpuS);
    const perS = summarize(records, (x) => x.tokensPerS);
    const swap = summarize(records, (x) => x.meanSwapMs);
    console.log(`\n| checkout | tokens per CPU-second | tokens/s | mean swap, ms |\n|---|---|---|---|`);
    for (const m of modes) console.log(`| ${m.name} | ${fmtStats(perCpu[m.name]!, 0)} | ${fmtStats(perS[m.name]!, 0)} | ${fmtStats(swap[m.name]!, 0)} |`);
    const ratios = Object.fromEntries(modes.slice(1).map((m) => [m.name, { tokensPerCpuS: roundRatios(records, modes[0]!.name, m.name, (x) => x.tokensPerCpuS), tokensPerS: roundRatios(records, modes[0]!.name, m.name, (x) => x.tokensPerS) }]));
    for (const [name, r] of Object.entries(ratios)) console.log(`this checkout against ${name}: ${fmtStats(r.tokensPerCpuS, 2, 'x')} the tokens per CPU-second, ${fmtStats(r.tokensPerS, 2, 'x')} the tokens/s (same-round ratios over ${rounds} rounds)`);
    return { options: { rounds, swapEvery, trees: all, inFlight: IN_FLIGHT, trajectories: TRAJECTORIES }, figures: { tokensPerCpuS: perCpu, tokensPerS: perS, meanSwapMs: swap, ratios }, probes: probeSummary(records), records };
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}

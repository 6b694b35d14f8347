// Training behaviour of the native core: overfitting a few sequences, AdamW and clipping against formulas in TS,
// gradient accumulation over micro-batches, policy-loss metrics, checkpoints (weights + optimizer state + step),
// BF16 loading, and the async contract (event loop free, calls on one model queued).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { Model, nativeAvailable, type AdamWOptions, type ModelConfig } from '../../native/index.ts';
import { TINY, maxAbsDiff, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const SMALL: ModelConfig = { ...TINY, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 64, vocab_size: 24, max_position_embeddings: 128 };
const ADAM: AdamWOptions = { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.0 };

test('a tiny model overfits a few packed sequences to near-zero loss', { skip }, async () => {
  const seqs = [
    [1, 5, 9, 2, 7, 7, 3, 11, 4, 20],
    [2, 8, 8, 1, 15, 3, 3, 9],
    [3, 12, 6, 6, 0, 19, 5],
    [4, 7, 14, 21, 2, 2, 10, 10, 16],
  ];
  const { batch, targets, responseMask } = pack(seqs);
  const model = Model.init(SMALL, { seed: 3, threads: 2 });
  let first = 0;
  let last = 0;
  for (let step = 0; step < 150; step++) {
    model.zeroGrad();
    const { loss } = await model.backwardCrossEntropy(batch, targets, responseMask);
    if (step === 0) first = loss;
    last = loss;
    model.clipGradNorm(1.0);
    await model.adamwStep(ADAM);
  }
  assert.ok(first > 2.5, `initial loss ${first} should be near ln(24) = 3.18`);
  assert.ok(last < 0.02, `loss after 150 steps is ${last}`);
  assert.equal(model.step, 150);
  model.dispose();
});

test('adamwStep follows PyTorch AdamW (decoupled decay, bias correction) over two steps', { skip }, async () => {
  const model = Model.init(TINY, { seed: 9, threads: 2, initStd: 0.3 });
  const { batch, targets, responseMask } = pack(randomSeqs(rng(4), [6, 5], TINY.vocab_size));
  const opts: AdamWOptions = { lr: 0.05, beta1: 0.8, beta2: 0.9, eps: 1e-6, weightDecay: 0.3 };
  const name = 'model.layers.1.mlp.up_proj.weight';
  const p = Float64Array.from(model.parameters().get(name)!.data);
  const m = new Float64Array(p.length);
  const v = new Float64Array(p.length);
  for (let step = 1; step <= 2; step++) {
    model.zeroGrad();
    await model.backwardCrossEntropy(batch, targets, responseMask);
    const g = model.gradients().get(name)!.data;
    for (let i = 0; i < p.length; i++) {
      m[i] = opts.beta1 * m[i]! + (1 - opts.beta1) * g[i]!;
      v[i] = opts.beta2 * v[i]! + (1 - opts.beta2) * g[i]! ** 2;
      const mh = m[i]! / (1 - opts.beta1 ** step);
      const vh = v[i]! / (1 - opts.beta2 ** step);
      p[i] = p[i]! * (1 - opts.lr * opts.weightDecay) - (opts.lr * mh) / (Math.sqrt(vh) + opts.eps);
    }
    await model.adamwStep(opts);
    // the reference p tracks native params computed from the same native grads
    assert.ok(maxAbsDiff(p, model.parameters().get(name)!.data) < 1e-5, `step ${step}`);
    p.set(model.parameters().get(name)!.data);
  }
  assert.ok(maxAbsDiff(m, model.optimizerState().expAvg.get(name)!.data) < 1e-6);
  model.dispose();
});

test('clipGradNorm returns the global norm and scales gradients down to maxNorm', { skip }, async () => {
  const model = Model.init(TINY, { seed: 1, threads: 2, initStd: 0.5 });
  const { batch, targets, responseMask } = pack(randomSeqs(rng(5), [8], TINY.vocab_size));
  await model.backwardCrossEntropy(batch, targets, responseMask);
  let ss = 0;
  for (const t of model.gradients().values()) for (const x of t.data) ss += x * x;
  const norm = model.clipGradNorm(1e-3);
  assert.ok(Math.abs(norm - Math.sqrt(ss)) < 1e-5 * Math.sqrt(ss));
  assert.ok(Math.abs(model.gradNorm() - 1e-3) < 1e-6);
  assert.ok(Math.abs(model.clipGradNorm(1) - 1e-3) < 1e-6); // below the bound: unchanged
  model.zeroGrad();
  assert.equal(model.gradNorm(), 0);
  model.dispose();
});

test('gradient accumulation: two micro-batches with lossScale 1/2 equal one packed batch', { skip }, async () => {
  const seqs = randomSeqs(rng(8), [7, 7, 7, 7], SMALL.vocab_size);
  const a = pack(seqs.slice(0, 2));
  const b = pack(seqs.slice(2));
  const all = pack(seqs);
  const m1 = Model.init(SMALL, { seed: 5, threads: 2, initStd: 0.2 });
  const m2 = Model.init(SMALL, { seed: 5, threads: 2, initStd: 0.2 });
  await m1.backwardCrossEntropy(a.batch, a.targets, a.responseMask, { lossScale: 0.5 });
  await m1.backwardCrossEntropy(b.batch, b.targets, b.responseMask, { lossScale: 0.5 });
  await m2.backwardCrossEntropy(all.batch, all.targets, all.responseMask);
  for (const [name, g] of m1.gradients()) {
    const h = m2.gradients().get(name)!.data;
    const scale = Math.max(...h.map(Math.abs));
    assert.ok(maxAbsDiff(g.data, h) <= 1e-5 * scale + 1e-7, `${name}`);
  }
  m1.dispose();
  m2.dispose();
});

test('policy loss metrics: clip fraction, approximate KL, importance weights, tokens', { skip }, async () => {
  const model = Model.init(TINY, { seed: 2, threads: 2, initStd: 0.3 });
  const d = pack(randomSeqs(rng(6), [10, 6], TINY.vocab_size));
  const { logprobs, entropy } = await model.forward(d.batch, d.targets);
  const T = logprobs.length;
  const r = rng(1);
  const prox = logprobs.map((x) => x + (r() - 0.5) * 0.6);
  const behav = prox.map((x) => x + (r() - 0.5) * 3);
  const adv = logprobs.map(() => r() - 0.5);
  for (let t = 0; t < T; t++) if (!d.responseMask[t]) prox[t] = behav[t] = adv[t] = 0;
  const met = await model.backwardPolicyLoss(d.batch, { targets: d.targets, responseMask: d.responseMask, advantages: adv, behaviourLogprobs: behav, proximalLogprobs: prox }, { clipLow: 0.2, clipHigh: 0.2 });
  let n = 0;
  let clip = 0;
  let akl = 0;
  let iw = 0;
  let iwMax = 0;
  let trunc = 0;
  let ent = 0;
  for (let t = 0; t < T; t++) {
    if (!d.responseMask[t]) continue;
    n++;
    const ratio = Math.exp(logprobs[t]! - prox[t]!);
    if (-adv[t]! * Math.min(1.2, Math.max(0.8, ratio)) > -adv[t]! * ratio) clip++;
    akl += prox[t]! - logprobs[t]!;
    const w = Math.exp(prox[t]! - behav[t]!);
    iw += w;
    iwMax = Math.max(iwMax, w);
    if (w > 2) trunc++;
    ent += entropy[t]!;
  }
  assert.equal(met.tokens, n);
  assert.ok(Math.abs(met.clipFraction - clip / n) < 1e-9);
  assert.ok(clip > 0 && clip < n, 'fixture should clip some tokens but not all');
  assert.ok(Math.abs(met.approxKl - akl / n) < 1e-5);
  assert.ok(Math.abs(met.iwMean - iw / n) < 1e-4 * iwMax);
  assert.ok(Math.abs(met.iwMax - iwMax) < 1e-4 * iwMax);
  assert.ok(Math.abs(met.iwTruncatedFraction - trunc / n) < 1e-9);
  assert.ok(trunc > 0, 'fixture should truncate some importance weights');
  assert.ok(Math.abs(met.entropy - ent / n) < 1e-5);
  assert.equal(met.kl, 0);
  model.dispose();
});

test('checkpoints hold weights, config, optimizer state and step: training resumes bit-identically', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-native-'));
  try {
    const { batch, targets, responseMask } = pack(randomSeqs(rng(3), [9, 5], SMALL.vocab_size));
    const trainStep = async (m: Model): Promise<void> => {
      m.zeroGrad();
      await m.backwardCrossEntropy(batch, targets, responseMask);
      await m.adamwStep({ ...ADAM, weightDecay: 0.01 });
    };
    const a = Model.init(SMALL, { seed: 12, threads: 2 });
    await trainStep(a);
    await trainStep(a);
    await a.saveCheckpoint(join(dir, 'ckpt'));
    const b = await Model.loadCheckpoint(join(dir, 'ckpt'), { threads: 2 });
    assert.equal(b.step, 2);
    assert.deepEqual(b.config, a.config);
    await trainStep(a);
    await trainStep(b);
    for (const [name, t] of a.parameters()) assert.deepEqual(Buffer.from(b.parameters().get(name)!.data.buffer), Buffer.from(t.data.buffer), name);
    // plain weights round trip through save/load
    await a.save(join(dir, 'w.safetensors'));
    const c = Model.load(join(dir, 'w.safetensors'), SMALL, { threads: 1 });
    for (const [name, t] of a.parameters()) assert.deepEqual(c.parameters().get(name)!.data, t.data, name);
    for (const m of [a, b, c]) m.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('BF16 and F16 safetensors load by conversion to float32', { skip }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-native-'));
  try {
    const src = Model.init(TINY, { seed: 4, threads: 1 });
    for (const dtype of ['BF16', 'F16'] as const) {
      const header: Record<string, unknown> = {};
      const chunks: Buffer[] = [];
      let off = 0;
      const expected = new Map<string, Float32Array>();
      for (const [name, t] of src.parameters()) {
        const b = Buffer.alloc(t.data.length * 2);
        const exp = new Float32Array(t.data.length);
        for (let i = 0; i < t.data.length; i++) {
          const x = t.data[i]!;
          if (dtype === 'BF16') {
            const bits = new Uint32Array(Float32Array.of(x).buffer)[0]! >>> 16; // truncate: exact round trip
            b.writeUInt16LE(bits, i * 2);
            exp[i] = new Float32Array(Uint32Array.of(bits << 16).buffer)[0]!;
          } else {
            // round to a value exactly representable in half precision, via the sign/exponent/mantissa of a normal half
            const q = Math.round(x * 1024) / 1024;
            const s = q < 0 ? 0x8000 : 0;
            const a = Math.abs(q);
            let h = 0;
            if (a !== 0) {
              const e = Math.floor(Math.log2(a));
              const mant = Math.round((a / 2 ** e - 1) * 1024);
              h = s | ((e + 15) << 10) | mant;
            }
            b.writeUInt16LE(h, i * 2);
            const e = (h >> 10) & 0x1f;
            exp[i] = (h & 0x8000 ? -1 : 1) * (h === 0 || (h & 0x7fff) === 0 ? 0 : (1 + (h & 0x3ff) / 1024) * 2 ** (e - 15));
          }
        }
        header[name] = { dtype, shape: t.shape, data_offsets: [off, off + b.length] };
        off += b.length;
        chunks.push(b);
        expected.set(name, exp);
      }
      const hj = Buffer.from(JSON.stringify(header));
      const len = Buffer.alloc(8);
      len.writeBigUInt64LE(BigInt(hj.length));
      const path = join(dir, `${dtype}.safetensors`);
      writeFileSync(path, Buffer.concat([len, hj, ...chunks]));
      const m = Model.load(path, TINY, { threads: 1 });
      for (const [name, exp] of expected) assert.deepEqual(m.parameters().get(name)!.data, exp, `${dtype} ${name}`);
      m.dispose();
    }
    src.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('long calls leave the event loop free and calls on one model are queued in order', { skip }, async () => {
  const cfg: ModelConfig = { ...SMALL, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, vocab_size: 2000, max_position_embeddings: 1024 };
  const model = Model.init(cfg, { seed: 1, threads: 2 });
  const { batch, targets, responseMask } = pack(randomSeqs(rng(1), [512, 512], cfg.vocab_size));
  let ticks = 0;
  const timer = setInterval(() => ticks++, 1);
  const t0 = Date.now();
  const order: string[] = [];
  const p1 = model.backwardCrossEntropy(batch, targets, responseMask).then(() => order.push('backward'));
  const p2 = model.forward(batch, targets).then(() => order.push('forward'));
  const p3 = model.adamwStep(ADAM).then(() => order.push('step'));
  assert.throws(() => model.zeroGrad(), (e: unknown) => isRlstreamError(e, 'NATIVE_INVALID_ARGUMENT') && /still running/.test(e.message));
  await Promise.all([p1, p2, p3]);
  clearInterval(timer);
  const elapsed = Date.now() - t0;
  assert.deepEqual(order, ['backward', 'forward', 'step']);
  assert.ok(ticks > elapsed / 20, `only ${ticks} timer ticks in ${elapsed} ms: the main thread was blocked`);
  model.zeroGrad(); // allowed again once idle
  model.dispose();
});

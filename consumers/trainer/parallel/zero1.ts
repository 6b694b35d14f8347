// ZeRO-1: AdamW's moments sharded across the ranks. The flat parameter vector is cut into `size` equal slices
// (the last one padded); rank r keeps the first and second moments of slice r only, so each rank's optimizer state
// is 1/size of the whole. A step: every rank holds the all-reduced gradient, updates its own slice of the
// parameters with AdamW, then an all-gather hands every rank every updated slice.
//
// AdamW here is elementwise and evaluated in fp32, operation by operation, as the native core's (native/src
// cpu_kernels.cpp) writes it: the sharded step is bit for bit the same as adamwFlat over the whole vector, and
// agrees with the native kernel within the last bits where its compiler fuses a multiply-add.
import { RlstreamError } from '../../../core/errors.ts';
import type { AdamWOptions } from '../../../native/index.ts';
import type { Collective } from './collective.ts';
import { FlatLayout } from './flat.ts';

const f = Math.fround;

/** One AdamW update of p over [0, p.length) at 1-based step `step` (bias corrections as the native core's). */
export function adamwFlat(p: Float32Array, g: Float32Array, m: Float32Array, v: Float32Array, step: number, o: AdamWOptions): void {
  // the native glue takes each option as a float, and the bias corrections in double from those floats
  const lr = f(o.lr);
  const b1 = f(o.beta1);
  const b2 = f(o.beta2);
  const bc1 = f(1 - Math.pow(b1, step));
  const bc2 = f(1 - Math.pow(b2, step));
  const eps = f(o.eps);
  const stepSize = f(lr / bc1);
  const sbc2 = f(Math.sqrt(bc2));
  const decay = f(1 - f(lr * f(o.weightDecay)));
  const c1 = f(1 - b1);
  const c2 = f(1 - b2);
  for (let i = 0; i < p.length; i++) {
    const gi = g[i]!;
    const mi = f(f(b1 * m[i]!) + f(c1 * gi));
    const vi = f(f(b2 * v[i]!) + f(f(c2 * gi) * gi));
    m[i] = mi;
    v[i] = vi;
    p[i] = f(f(p[i]! * decay) - f(f(stepSize * mi) / f(f(f(Math.sqrt(vi)) / sbc2) + eps)));
  }
}

export class Zero1AdamW {
  /** Elements of every rank's slice (the last rank's is padded with zeros past the vector's end). */
  readonly chunk: number;
  readonly start: number;
  readonly end: number;
  readonly expAvg: Float32Array;
  readonly expAvgSq: Float32Array;
  /** Updates taken (AdamW's t, for the bias corrections). */
  step = 0;

  constructor(
    readonly layout: FlatLayout,
    private readonly collective: Collective,
  ) {
    const { rank, size } = collective;
    this.chunk = Math.ceil(layout.numel / size);
    this.start = Math.min(layout.numel, rank * this.chunk);
    this.end = Math.min(layout.numel, this.start + this.chunk);
    this.expAvg = new Float32Array(this.chunk);
    this.expAvgSq = new Float32Array(this.chunk);
  }

  /** Bytes of optimizer state this rank holds. */
  get stateBytes(): number {
    return this.expAvg.byteLength + this.expAvgSq.byteLength;
  }

  /**
   * One sharded AdamW update: this rank's slice of `params` from the same slice of `grads` (already summed over the
   * ranks), then all of `params` from every rank's slice. Every rank must call it at the same point.
   */
  async update(params: readonly Float32Array[], grads: readonly Float32Array[], o: AdamWOptions): Promise<void> {
    const n = this.end - this.start;
    const p = new Float32Array(this.chunk);
    const g = new Float32Array(this.chunk);
    this.layout.read(params, this.start, this.end, p);
    this.layout.read(grads, this.start, this.end, g);
    this.step++;
    adamwFlat(p.subarray(0, n), g.subarray(0, n), this.expAvg.subarray(0, n), this.expAvgSq.subarray(0, n), this.step, o);
    const all = new Float32Array(this.chunk * this.collective.size);
    await this.collective.allGather(p, all);
    this.layout.write(params, 0, this.layout.numel, all);
  }

  /** This rank's moments as the whole vector's [start, end) (checkpoints gather them; tests compare them). */
  moments(): { start: number; expAvg: Float32Array; expAvgSq: Float32Array } {
    const n = this.end - this.start;
    return { start: this.start, expAvg: this.expAvg.subarray(0, n), expAvgSq: this.expAvgSq.subarray(0, n) };
  }
}

export function checkAdamW(o: AdamWOptions): void {
  if (!(o.lr > 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps > 0 && o.weightDecay >= 0)) throw new RlstreamError('INPUT_INVALID', `AdamW options out of range: ${JSON.stringify(o)}`);
}

// The model's tensors as one flat vector: tensor i occupies [offsets[i], offsets[i] + length) in the order given
// (the model's own order, the same on every rank). Buckets and ZeRO-1 slices are ranges of this vector, so they
// may start and end inside a tensor.
export class FlatLayout {
  readonly offsets: number[];
  readonly numel: number;

  constructor(readonly lengths: readonly number[]) {
    let n = 0;
    this.offsets = lengths.map((l) => ((n += l), n - l));
    this.numel = n;
  }

  /** Copies [start, end) of the flat vector held by `tensors` into out[0, end - start). */
  read(tensors: readonly Float32Array[], start: number, end: number, out: Float32Array): void {
    this.each(start, end, (t, from, to, at) => out.set(tensors[t]!.subarray(from, to), at));
  }

  /** Writes src[0, end - start) over [start, end) of the flat vector held by `tensors`. */
  write(tensors: readonly Float32Array[], start: number, end: number, src: Float32Array): void {
    this.each(start, end, (t, from, to, at) => tensors[t]!.set(src.subarray(at, at + (to - from)), from));
  }

  /** For each tensor overlapping [start, end): its index, the overlap within it, and where that starts in the range. */
  private each(start: number, end: number, fn: (t: number, from: number, to: number, at: number) => void): void {
    // the first tensor that ends after start (binary search: layouts hold hundreds of tensors)
    let lo = 0;
    let hi = this.lengths.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.offsets[mid]! + this.lengths[mid]! <= start) lo = mid + 1;
      else hi = mid;
    }
    for (let t = lo; t < this.lengths.length && this.offsets[t]! < end; t++) {
      const from = Math.max(start, this.offsets[t]!) - this.offsets[t]!;
      const to = Math.min(end, this.offsets[t]! + this.lengths[t]!) - this.offsets[t]!;
      if (to > from) fn(t, from, to, this.offsets[t]! + from - start);
    }
  }
}

// Rollout metrics: counters by name and latency reservoirs, read through snapshot(). Kept as plain
// numbers so the worker's hot path does no allocation beyond a Map update.

export class LatencyReservoir {
  private readonly samples: number[] = [];
  private next = 0;
  count = 0;
  sum = 0;

  constructor(private readonly capacity = 2048) {}

  add(ms: number): void {
    this.count++;
    this.sum += ms;
    if (this.samples.length < this.capacity) this.samples.push(ms);
    else {
      this.samples[this.next] = ms;
      this.next = (this.next + 1) % this.capacity;
    }
  }

  summary(): { count: number; mean: number; p50: number; p95: number; p99: number; max: number } {
    const s = [...this.samples].sort((a, b) => a - b);
    const q = (p: number) => (s.length === 0 ? 0 : s[Math.min(s.length - 1, Math.floor(p * s.length))]!);
    return { count: this.count, mean: this.count === 0 ? 0 : this.sum / this.count, p50: q(0.5), p95: q(0.95), p99: q(0.99), max: s.length === 0 ? 0 : s[s.length - 1]! };
  }
}

export class Counters {
  private readonly values = new Map<string, number>();

  add(name: string, by = 1): void {
    this.values.set(name, (this.values.get(name) ?? 0) + by);
  }

  get(name: string): number {
    return this.values.get(name) ?? 0;
  }

  toObject(): Record<string, number> {
    return Object.fromEntries([...this.values.entries()].sort(([a], [b]) => a.localeCompare(b)));
  }
}

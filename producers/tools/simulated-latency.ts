// A simulated service delay for tools: every call waits a delay drawn from a heavy-tailed distribution
// before the tool runs, so a fast local tool (the calculator) behaves like a remote service whose latency has
// a long tail — what stalls synchronous RL (bench/async.ts measures it). Configured per tool entry:
//
//   config:
//     timeout_ms: 10000
//     simulated_latency: { distribution: lognormal, median_ms: 200, p99_ms: 4000, seed: 7 }
//     # or { distribution: pareto, median_ms: 200, shape: 1.2 }
//
// The tail is given either as the 99th percentile (p99_ms) or as the distribution's shape parameter
// (lognormal: σ of ln X; pareto: the tail index α). Draws come from a seeded generator in call order, so the
// same seed gives the same sequence of delays. The delay listens to the call's abort signal: when the
// ToolSet's timeout fires (or the worker stops) the wait ends at once and the tool never runs.
import { setTimeout as sleep } from 'node:timers/promises';
import { Ajv, type ErrorObject } from 'ajv';
import { RlstreamError } from '../../core/errors.ts';
import { rng } from '../../core/random.ts';
import type { Tool, ToolCallContext, ToolResult } from './types.ts';

export type LatencyDistribution = 'lognormal' | 'pareto';

/** The YAML shape (snake_case, as written in the tool config). */
export interface SimulatedLatencyConfig {
  distribution: LatencyDistribution;
  median_ms: number;
  /** 99th percentile; give this or `shape`. */
  p99_ms?: number;
  /** lognormal: σ of ln X; pareto: tail index α (smaller is heavier). Give this or `p99_ms`. */
  shape?: number;
  /** Seed of the draws (default 0). */
  seed?: number;
}

const SIMULATED_LATENCY_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: ['distribution', 'median_ms'],
  properties: {
    distribution: { enum: ['lognormal', 'pareto'] },
    median_ms: { type: 'number', exclusiveMinimum: 0 },
    p99_ms: { type: 'number', exclusiveMinimum: 0 },
    shape: { type: 'number', exclusiveMinimum: 0 },
    seed: { type: 'integer' },
  },
} as const;

const validate = new Ajv({ allErrors: true, strict: true, verbose: true }).compile(SIMULATED_LATENCY_SCHEMA);

/** z of the standard normal's 0.99 quantile: lognormal σ = ln(p99 / median) / Z99. */
const Z99 = 2.3263478740408408;

function describe(e: ErrorObject, field: string): string {
  const at = field + e.instancePath.replace(/\//g, '.');
  if (e.keyword === 'additionalProperties') {
    const extra = (e.params as { additionalProperty: string }).additionalProperty;
    return `${at}.${extra} is not a field of simulated_latency (known: ${Object.keys(SIMULATED_LATENCY_SCHEMA.properties).join(', ')})`;
  }
  if (e.keyword === 'required') return `${at}.${(e.params as { missingProperty: string }).missingProperty} is required`;
  if (e.keyword === 'enum') return `${at} must be one of ${(e.params as { allowedValues: string[] }).allowedValues.join(', ')} (got ${JSON.stringify(e.data)})`;
  return `${at} ${e.message ?? 'is invalid'} (got ${JSON.stringify(e.data)})`;
}

/** Draws delays in milliseconds; `quantile` is the exact inverse CDF the draws follow. */
export class LatencySampler {
  private readonly random: () => number;
  private readonly draw: (u: number) => number;
  /** lognormal: σ; pareto: α. */
  readonly shape: number;

  constructor(readonly config: Readonly<SimulatedLatencyConfig>) {
    const { distribution, median_ms: median } = config;
    this.random = rng(config.seed ?? 0);
    if (distribution === 'lognormal') {
      const sigma = config.shape ?? Math.log(config.p99_ms! / median) / Z99;
      this.shape = sigma;
      // Inverse CDF through the normal quantile: one uniform per draw, so the sequence is simple to reproduce.
      this.draw = (u) => median * Math.exp(sigma * normalQuantile(u));
    } else {
      // Pareto I: P(X > x) = (xm / x)^α for x ≥ xm; the median is xm · 2^(1/α), the p99 xm · 100^(1/α).
      const alpha = config.shape ?? Math.log(50) / Math.log(config.p99_ms! / median);
      this.shape = alpha;
      const xm = median / 2 ** (1 / alpha);
      this.draw = (u) => xm * (1 - u) ** (-1 / alpha);
    }
  }

  /** The next delay (ms). */
  next(): number {
    // Keep u inside (0, 1): both inverse CDFs are infinite at the ends.
    const u = Math.min(Math.max(this.random(), 1e-12), 1 - 1e-12);
    return this.draw(u);
  }

  /** The distribution's p-quantile (ms), 0 < p < 1. */
  quantile(p: number): number {
    return this.draw(p);
  }
}

/** Validate a `simulated_latency` mapping (ajv schema, then the rules it cannot say); errors name `field`. */
export function compileSimulatedLatency(raw: unknown, field: string): LatencySampler {
  if (!validate(raw)) {
    const errors = validate.errors ?? [];
    // A type error at the root says it all; otherwise list every field that is wrong.
    throw new RlstreamError('CONFIG_INVALID', errors.map((e) => (e.instancePath === '' && e.keyword === 'type' ? `${field} must be a mapping` : describe(e, field))).join('; '));
  }
  const c = raw as SimulatedLatencyConfig;
  const hasP99 = c.p99_ms !== undefined;
  const hasShape = c.shape !== undefined;
  if (hasP99 === hasShape) throw new RlstreamError('CONFIG_INVALID', `${field} needs exactly one of p99_ms or shape (the tail), got ${hasP99 ? 'both' : 'neither'}`);
  if (hasP99 && !(c.p99_ms! > c.median_ms)) throw new RlstreamError('CONFIG_INVALID', `${field}.p99_ms must be greater than median_ms (got p99_ms ${c.p99_ms}, median_ms ${c.median_ms})`);
  return new LatencySampler(Object.freeze({ ...c }));
}

/**
 * The tool with the delay in front of every execute: same schema, state and lifecycle (the wrapper's
 * prototype is the tool). The delay is reported as the call's `simulated_latency_ms` metric.
 */
export function withSimulatedLatency(tool: Tool, sampler: LatencySampler): Tool {
  const execute = async (instanceId: string, args: Record<string, unknown>, ctx: ToolCallContext): Promise<ToolResult> => {
    const delayMs = sampler.next();
    // Rejects with an AbortError when the call times out or the worker stops: the tool then never runs.
    // Node's timers count whole milliseconds from the event loop's cached clock and can end up to a
    // millisecond or so early by performance.now(), so the wait is topped up to the full sampled delay.
    const until = performance.now() + delayMs;
    await sleep(Math.ceil(delayMs), undefined, { signal: ctx.signal });
    for (let left = until - performance.now(); left > 0; left = until - performance.now()) await sleep(Math.ceil(left), undefined, { signal: ctx.signal });
    const res = await tool.execute(instanceId, args, ctx);
    return { ...res, metrics: { ...res.metrics, simulated_latency_ms: delayMs } };
  };
  return Object.create(tool, { execute: { value: execute, enumerable: true } }) as Tool;
}

/**
 * Φ⁻¹(p) of the standard normal: Acklam's rational approximation (relative error < 1.2e-9), enough for
 * delays in milliseconds.
 */
export function normalQuantile(p: number): number {
  const a = [-3.969683028665376e1, 2.209460984245205e2, -2.759285104469687e2, 1.38357751867269e2, -3.066479806614716e1, 2.506628277459239];
  const b = [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
  const c = [-7.784894002430293e-3, -3.223964580411365e-1, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
  const d = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
  const low = 0.02425;
  if (p < low) {
    const q = Math.sqrt(-2 * Math.log(p));
    return (((((c[0]! * q + c[1]!) * q + c[2]!) * q + c[3]!) * q + c[4]!) * q + c[5]!) / ((((d[0]! * q + d[1]!) * q + d[2]!) * q + d[3]!) * q + 1);
  }
  if (p > 1 - low) return -normalQuantile(1 - p);
  const q = p - 0.5;
  const r = q * q;
  return ((((((a[0]! * r + a[1]!) * r + a[2]!) * r + a[3]!) * r + a[4]!) * r + a[5]!) * q) / (((((b[0]! * r + b[1]!) * r + b[2]!) * r + b[3]!) * r + b[4]!) * r + 1);
}

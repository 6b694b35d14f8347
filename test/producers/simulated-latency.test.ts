// The simulated service delay of tools (producers/tools/simulated-latency.ts): draws follow the configured
// distribution (empirical quantiles against the configured median and p99), the same seed repeats the same
// delays, bad config names the field, and through the ToolSet the delay precedes the tool and yields to the
// call's timeout (the tool then never runs).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { toolSetFromYaml } from '../../producers/tools/config.ts';
import { compileSimulatedLatency, LatencySampler, normalQuantile, withSimulatedLatency } from '../../producers/tools/simulated-latency.ts';
import { ToolSet } from '../../producers/tools/tool-set.ts';
import { StatefulTool, type ToolResult } from '../../producers/tools/types.ts';
import type { ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';

const FIELD = 'tools[0].config.simulated_latency';

function empiricalQuantiles(sampler: LatencySampler, n: number, ps: number[]): number[] {
  const xs = Array.from({ length: n }, () => sampler.next()).sort((a, b) => a - b);
  return ps.map((p) => xs[Math.floor(p * (n - 1))]!);
}

function near(actual: number, expected: number, relTol: number, what: string): void {
  assert.ok(Math.abs(actual - expected) <= relTol * expected, `${what}: ${actual.toFixed(1)} is not within ${relTol * 100}% of ${expected.toFixed(1)}`);
}

describe('simulated latency: distributions', () => {
  test('normal quantile matches known values', () => {
    near(normalQuantile(0.99), 2.3263478740408408, 1e-8, 'z(0.99)');
    near(normalQuantile(0.975), 1.959963984540054, 1e-8, 'z(0.975)');
    assert.ok(Math.abs(normalQuantile(0.5)) < 1e-12);
    near(-normalQuantile(0.001), 3.090232306167813, 1e-8, 'z(0.001)');
  });

  test('lognormal given median and p99: empirical quantiles close to the configured ones', () => {
    const s = compileSimulatedLatency({ distribution: 'lognormal', median_ms: 200, p99_ms: 4000, seed: 3 }, FIELD);
    near(s.quantile(0.5), 200, 1e-9, 'analytic median');
    near(s.quantile(0.99), 4000, 1e-8, 'analytic p99');
    const [p50, p90, p99] = empiricalQuantiles(s, 100_000, [0.5, 0.9, 0.99]);
    near(p50!, 200, 0.03, 'median');
    near(p90!, s.quantile(0.9), 0.05, 'p90');
    near(p99!, 4000, 0.1, 'p99');
  });

  test('pareto given median and p99, and given its shape: heavy tail as configured', () => {
    const byP99 = compileSimulatedLatency({ distribution: 'pareto', median_ms: 150, p99_ms: 3000, seed: 11 }, FIELD);
    near(byP99.quantile(0.99), 3000, 1e-9, 'analytic p99');
    const [m, p99] = empiricalQuantiles(byP99, 100_000, [0.5, 0.99]);
    near(m!, 150, 0.03, 'median');
    near(p99!, 3000, 0.1, 'p99');
    // Tail index α = 1.5: P(X > x) = (xm / x)^1.5, so p99.9 / p99 = 10^(1/1.5).
    const byShape = compileSimulatedLatency({ distribution: 'pareto', median_ms: 100, shape: 1.5 }, FIELD);
    assert.equal(byShape.shape, 1.5);
    near(byShape.quantile(0.999) / byShape.quantile(0.99), 10 ** (1 / 1.5), 1e-9, 'tail ratio');
    const [m2, p999] = empiricalQuantiles(byShape, 200_000, [0.5, 0.999]);
    near(m2!, 100, 0.03, 'median (shape)');
    near(p999!, byShape.quantile(0.999), 0.2, 'p99.9 (shape)');
    // Never below the scale xm = median / 2^(1/α).
    assert.ok(Math.min(...Array.from({ length: 1000 }, () => byShape.next())) >= 100 / 2 ** (1 / 1.5) - 1e-9);
  });

  test('seeded: the same seed repeats the sequence, another seed does not', () => {
    const cfg = { distribution: 'lognormal', median_ms: 50, shape: 1 } as const;
    const a = compileSimulatedLatency({ ...cfg, seed: 5 }, FIELD);
    const b = compileSimulatedLatency({ ...cfg, seed: 5 }, FIELD);
    const c = compileSimulatedLatency({ ...cfg, seed: 6 }, FIELD);
    const seq = (s: LatencySampler) => Array.from({ length: 50 }, () => s.next());
    const sa = seq(a);
    assert.deepEqual(seq(b), sa);
    assert.notDeepEqual(seq(c), sa);
  });
});

describe('simulated latency: config validation names the field', () => {
  const bad: [unknown, RegExp][] = [
    [{ distribution: 'gamma', median_ms: 10, p99_ms: 100 }, /tools\[0\]\.config\.simulated_latency\.distribution must be one of lognormal, pareto \(got "gamma"\)/],
    [{ distribution: 'pareto', p99_ms: 100 }, /tools\[0\]\.config\.simulated_latency\.median_ms is required/],
    [{ distribution: 'pareto', median_ms: -5, p99_ms: 100 }, /tools\[0\]\.config\.simulated_latency\.median_ms must be > 0 \(got -5\)/],
    [{ distribution: 'pareto', median_ms: '10ms', p99_ms: 100 }, /tools\[0\]\.config\.simulated_latency\.median_ms must be number/],
    [{ distribution: 'lognormal', median_ms: 10, p99_ms: 100, p95_ms: 50 }, /tools\[0\]\.config\.simulated_latency\.p95_ms is not a field of simulated_latency/],
    [{ distribution: 'lognormal', median_ms: 10, p99_ms: 100, shape: 1 }, /tools\[0\]\.config\.simulated_latency needs exactly one of p99_ms or shape .* both/],
    [{ distribution: 'lognormal', median_ms: 10 }, /needs exactly one of p99_ms or shape .* neither/],
    [{ distribution: 'lognormal', median_ms: 100, p99_ms: 100 }, /tools\[0\]\.config\.simulated_latency\.p99_ms must be greater than median_ms/],
    [{ distribution: 'pareto', median_ms: 10, shape: 1, seed: 1.5 }, /tools\[0\]\.config\.simulated_latency\.seed must be integer/],
    ['slow', /tools\[0\]\.config\.simulated_latency must be a mapping/],
  ];
  for (const [raw, re] of bad) {
    test(JSON.stringify(raw), async () => {
      assert.throws(() => compileSimulatedLatency(raw, FIELD), re);
      // The same message through the YAML tool config.
      const yaml = `tools:\n  - class_name: calculator\n    config:\n      simulated_latency: ${JSON.stringify(raw)}\n`;
      await assert.rejects(toolSetFromYaml(yaml), (err: Error) => (err as { code?: string }).code === 'CONFIG_INVALID' && re.test(err.message));
    });
  }
});

class CountingTool extends StatefulTool<{ calls: number }> {
  readonly schema: ChatTool = { type: 'function', function: { name: 'count', description: 'counts', parameters: { type: 'object', properties: {} } } };
  executed = 0;
  protected initialState() {
    return { calls: 0 };
  }
  execute(): ToolResult {
    this.executed++;
    return { text: String(this.executed), metrics: { own: 1 } };
  }
}

describe('simulated latency: in the ToolSet', () => {
  test('the delay comes before the answer and is reported as a metric', async () => {
    const set = await toolSetFromYaml('tools:\n  - class_name: calculator\n    config:\n      timeout_ms: 5000\n      simulated_latency: { distribution: lognormal, median_ms: 40, p99_ms: 80, seed: 1 }\n');
    const reference = compileSimulatedLatency({ distribution: 'lognormal', median_ms: 40, p99_ms: 80, seed: 1 }, FIELD);
    const s = set.session('t1');
    for (let i = 0; i < 3; i++) {
      const out = await s.call('calculator', '{"expression": "6*7"}');
      assert.equal(out.status, 'ok');
      assert.equal(out.text, '42');
      const expected = reference.next();
      assert.equal(out.metrics['simulated_latency_ms'], expected);
      // Timers may fire up to a millisecond early against performance.now().
      assert.ok(out.latencyMs >= expected - 1, `latency ${out.latencyMs} < simulated ${expected}`);
    }
    await s.finish();
    await set.close();
  });

  test('the tool timeout wins over a long delay, and the tool then never runs', async () => {
    const tool = new CountingTool();
    const slow = compileSimulatedLatency({ distribution: 'pareto', median_ms: 20_000, shape: 2 }, FIELD);
    const set = new ToolSet().add(withSimulatedLatency(tool, slow), { timeoutMs: 50 });
    const s = set.session('t2');
    const t0 = performance.now();
    const out = await s.call('count', '{}');
    assert.equal(out.status, 'timeout');
    assert.ok(performance.now() - t0 < 2_000, 'the call returned at the timeout, not after the delay');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(tool.executed, 0);
    // An aborted worker ends the wait too: status error, tool not run.
    const ctl = new AbortController();
    const pending = s.call('count', '{}', ctl.signal);
    ctl.abort(new Error('worker stopped'));
    const aborted = await pending;
    assert.notEqual(aborted.status, 'ok');
    assert.equal(tool.executed, 0);
    await s.finish();
    await set.close();
  });

  test('the wrapped tool keeps its own metrics and state', async () => {
    const tool = new CountingTool();
    const fast = compileSimulatedLatency({ distribution: 'lognormal', median_ms: 1, p99_ms: 2 }, FIELD);
    const set = new ToolSet().add(withSimulatedLatency(tool, fast));
    const s = set.session('t3');
    const out = await s.call('count', '{}');
    assert.equal(out.text, '1');
    assert.equal(out.metrics['own'], 1);
    assert.ok(out.metrics['simulated_latency_ms']! > 0);
    await s.finish();
    await set.close();
  });
});

describe('simulated latency: chosen by the run config', () => {
  test('tools.config names the heavy-tail tool config of the calculator example; bad fields are named', async () => {
    const { loadRunConfig } = await import('../../cli/config/run-config.ts');
    const { createTools } = await import('../../cli/run/roles.ts');
    const { resolvePlugins } = await import('../../cli/run/plugins.ts');
    const { REPO } = await import('./helpers.ts');
    const { join } = await import('node:path');
    const configPath = join(REPO, 'examples', 'calculator', 'config.yaml');
    const ctx = async (overrides: Record<string, unknown>) => {
      const config = loadRunConfig(configPath, overrides);
      return { config, plugins: await resolvePlugins(config) } as Parameters<typeof createTools>[0];
    };
    const set = await createTools(await ctx({ 'tools.config': 'tools-heavy-tail.yaml' }));
    const s = set.session('t4');
    const out = await s.call('calculator', '{"expression": "2+2"}');
    assert.equal(out.text, '4');
    assert.ok(out.metrics['simulated_latency_ms']! > 0);
    await s.finish();
    await set.close();
    // Without tools.config: the task's own tools, no delay.
    const plain = await createTools(await ctx({}));
    const p = await plain.session('t5').call('calculator', '{"expression": "2+2"}');
    assert.equal(p.metrics['simulated_latency_ms'], undefined);
    // Bad fields fail when the config is compiled, naming the path; a missing file when the tools load.
    assert.throws(() => loadRunConfig(configPath, { 'tools.file': 'x.yaml' }), /tools\.file: unknown key \(known: config\)/);
    assert.throws(() => loadRunConfig(configPath, { 'tools.config': 42 }), /tools\.config: must be a string or null/);
    await assert.rejects(async () => createTools(await ctx({ 'tools.config': 'missing.yaml' })), /tool config not readable/);
  });
});

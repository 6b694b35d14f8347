// The serving endpoint's overhead per call at 64 concurrent sessions on the built-in policy (the calculator's SFT
// checkpoint): every session runs two turns (prompt with the calculator tool, then a user message), first by
// calling the backend directly with token ids, then through `rlstream serve` over HTTP with the official OpenAI
// request shape. The overhead of a served call is its wall time at the client minus the time the same call spent
// in backend.generate (measured inside the endpoint): HTTP, JSON, validation, template rendering and delta
// tokenization, the sanity check, recording and publishing, and the wait behind other calls' work on the event
// loop. Direct per-call times are printed beside it for scale.
// Run: npm run bench -- serve [--quick]. On a shared 2-core machine timings are noisy: rounds alternate direct and
// served, the load average is printed, and the median round is reported.
import { fork } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { performance } from 'node:perf_hooks';
import { join } from 'node:path';
import { deriveId } from '../core/ids.ts';
import { silentLogger } from '../core/telemetry.ts';
import { startServeJob } from '../cli/run/serve-job.ts';
import { problemRows } from '../examples/calculator/index.ts';
import { MEDIUM, take } from '../examples/calculator/task.ts';
import { CALCULATOR_TOOL } from '../examples/calculator/conversation.ts';
import type { GenerateRequest, LlmBackend } from '../producers/backends/types.ts';
import { ChatTokenizer } from '../producers/tokenizer/chat-tokenizer.ts';
import type { ClientRound } from './serve-client.ts';
import { DeltaTokenizer } from '../producers/tokenizer/delta.ts';

const CONFIG = join(import.meta.dirname, '../examples/calculator/config.yaml');
const TOKEN = 'bench-serve-token-0123456789';
const SESSIONS = 64;
const MAX_TOKENS = 24;
const FOLLOW_UP = { role: 'user', content: 'Check it and give the answer.' };

function stats(xs: number[]): { mean: number; p50: number; p99: number; n: number } {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? 0;
  return { mean: xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length), p50: q(0.5), p99: q(0.99), n: xs.length };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? 0;
}

export async function main(args: string[]): Promise<unknown> {
  const rounds = args.includes('--quick') ? 1 : 3;
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-serve-'));
  /** backend.generate wall time of each served call, by request id. */
  const generateMs = new Map<string, number>();
  const timed = (inner: LlmBackend): LlmBackend => ({
    name: inner.name,
    async generate(request: GenerateRequest, signal?: AbortSignal) {
      const t0 = performance.now();
      const out = await inner.generate(request, signal);
      generateMs.set(request.requestId, performance.now() - t0);
      return out;
    },
    releaseSession: (id) => inner.releaseSession?.(id),
    currentPolicyVersion: () => inner.currentPolicyVersion(),
    close: () => inner.close(),
  });
  const job = await startServeJob({
    configPath: CONFIG,
    port: 0,
    tokens: [{ token: TOKEN, role: 'read' }],
    wrapBackend: timed,
    limits: { maxSessions: 4 * SESSIONS, idleTimeoutMs: 600_000 },
    logger: silentLogger,
    overrides: { 'run.data_dir': dir, 'traces.kind': 'none' },
  });
  const tokenizer = ChatTokenizer.load(join(import.meta.dirname, '../examples/calculator/tokenizer'));
  const delta = new DeltaTokenizer(tokenizer);
  const followUpIds = delta.deltaIds([FOLLOW_UP]).ids;
  const rows = take(problemRows(7, 'train', MEDIUM), SESSIONS);
  const sampling = { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: MAX_TOKENS, seed: null, stop_token_ids: tokenizer.eosTokenId === null ? [] : [tokenizer.eosTokenId] };
  const tools = [CALCULATOR_TOOL];

  /** Main-thread busy time (event-loop utilisation) and process CPU time of a round, in ms. */
  const meter = () => {
    const elu = performance.eventLoopUtilization();
    const cpu = process.cpuUsage();
    return () => {
      const e = performance.eventLoopUtilization(elu);
      const c = process.cpuUsage(cpu);
      return { busyMs: e.active, cpuMs: (c.user + c.system) / 1000 };
    };
  };

  const direct = async (round: number): Promise<{ calls: number[]; wallMs: number; busyMs: number; cpuMs: number }> => {
    const calls: number[] = [];
    const t0 = performance.now();
    const m = meter();
    await Promise.all(
      rows.map(async (row, i) => {
        const sessionId = `direct-${round}-${i}`;
        let ids = delta.promptIds(row.prompt, tools);
        for (let turn = 0; turn < 2; turn++) {
          const c0 = performance.now();
          const r = await job.backend.generate({ requestId: `${sessionId}-${turn}`, sessionId, promptIds: ids, sampling });
          calls.push(performance.now() - c0);
          ids = ids.concat(r.tokenIds, followUpIds);
        }
        job.backend.releaseSession?.(sessionId);
      }),
    );
    return { calls, wallMs: performance.now() - t0, ...m() };
  };

  // The client runs in its own process: this process's CPU time is then the endpoint's (and the engine's) alone.
  const client = fork(join(import.meta.dirname, 'serve-client.ts'), [], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, BENCH_SERVE_URL: job.url, BENCH_SERVE_TOKEN: TOKEN, BENCH_SERVE_SESSIONS: String(SESSIONS), BENCH_SERVE_MAX_TOKENS: String(MAX_TOKENS), BENCH_SERVE_FOLLOW_UP: JSON.stringify(FOLLOW_UP) },
  });
  const next = () =>
    new Promise<unknown>((resolve, reject) => {
      client.once('message', resolve);
      client.once('exit', (code) => reject(new Error(`bench serve client exited ${code}`)));
    });
  await next(); // ready

  const served = async (round: number): Promise<{ calls: number[]; overheads: number[]; wallMs: number; busyMs: number; cpuMs: number }> => {
    const t0 = performance.now();
    const m = meter();
    const answer = next();
    client.send({ round });
    const r = (await answer) as ClientRound;
    const wallMs = performance.now() - t0;
    const used = m();
    const overheads: number[] = [];
    for (const c of r.calls) {
      // The endpoint's request id for a turn is deriveId(trajectory, 'generate', turn) (producers/agent/steps.ts).
      const gen = generateMs.get(deriveId(c.trajectoryId, 'generate', c.turnIndex));
      if (gen !== undefined) overheads.push(c.ms - gen);
    }
    return { calls: r.calls.map((c) => c.ms), overheads, wallMs, ...used };
  };

  try {
    // Warm-up: onnxruntime sessions, the template's shapes, HTTP connections.
    await direct(-1);
    await served(-1);
    const directRounds: Awaited<ReturnType<typeof direct>>[] = [];
    const servedRounds: Awaited<ReturnType<typeof served>>[] = [];
    for (let r = 0; r < rounds; r++) {
      directRounds.push(await direct(r));
      servedRounds.push(await served(r));
    }
    const d = stats(directRounds.flatMap((x) => x.calls));
    const s = stats(servedRounds.flatMap((x) => x.calls));
    const o = stats(servedRounds.flatMap((x) => x.overheads));
    const report = {
      sessions: SESSIONS,
      turns_per_session: 2,
      max_tokens: MAX_TOKENS,
      rounds,
      direct_call_ms: d,
      served_call_ms: s,
      overhead_per_call_ms: o,
      overhead_per_call_ms_median_round: median(servedRounds.map((x) => stats(x.overheads).mean)),
      // What the endpoint costs per call in work, which the load of other processes inflates far less than
      // latency: main-thread busy time and process CPU time of the endpoint's process (the client runs in another),
      // served minus direct, over the calls.
      main_thread_busy_ms_per_call: median(servedRounds.map((x, i) => (x.busyMs - directRounds[i]!.busyMs) / x.calls.length)),
      cpu_ms_per_call: median(servedRounds.map((x, i) => (x.cpuMs - directRounds[i]!.cpuMs) / x.calls.length)),
      direct_round_wall_ms: median(directRounds.map((x) => x.wallMs)),
      served_round_wall_ms: median(servedRounds.map((x) => x.wallMs)),
      loadavg: loadavg(),
    };
    const f = (x: number) => x.toFixed(2);
    console.log(`serve overhead at ${SESSIONS} concurrent sessions, built-in policy (calculator), ${rounds} round(s), load average ${loadavg().map((x) => x.toFixed(1)).join(' ')}`);
    console.log(`  direct backend call  mean ${f(d.mean)} ms  p50 ${f(d.p50)}  p99 ${f(d.p99)}  (${d.n} calls)`);
    console.log(`  served call          mean ${f(s.mean)} ms  p50 ${f(s.p50)}  p99 ${f(s.p99)}  (${s.n} calls)`);
    console.log(`  overhead per call    mean ${f(o.mean)} ms  p50 ${f(o.p50)}  p99 ${f(o.p99)}  (served call minus its backend.generate)`);
    console.log(`  work per call        main thread ${f(report.main_thread_busy_ms_per_call)} ms, process CPU ${f(report.cpu_ms_per_call)} ms (endpoint process, served minus direct)`);
    console.log(`  round wall time      direct ${f(report.direct_round_wall_ms)} ms, served ${f(report.served_round_wall_ms)} ms`);
    return report;
  } finally {
    client.send('exit');
    await job.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

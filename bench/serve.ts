// The serving endpoint's overhead per call at 64 concurrent sessions on the built-in policy (the calculator's SFT
// checkpoint). Every session runs two turns (prompt with the calculator tool, then a user message), each call with
// a seed of its own:
// - served: through `rlstream serve` over HTTP with the official OpenAI request shape, from a client in another
//   process; the endpoint's backend is wrapped to capture each generate request (prompt ids, sampling) and time;
// - direct: the same round replayed against the same backend: each session's captured requests in order, the 64
//   sessions concurrently, so the backend gets the same prompts, sampling and seeds at the same concurrency, and
//   generates the same tokens (the report counts the calls whose tokens matched).
// The overhead of a call is its served wall time at the client minus its direct replay's wall time: what the
// endpoint adds under the same load (HTTP, JSON, validation, rendering and delta tokenization, recording and
// publishing, the client's own work, and the wait behind the other sessions' share of all that on a machine
// the engine keeps busy). Also printed: the part of each served call outside backend.generate, the work per call
// (the endpoint's main-thread CPU, its process's CPU and main-thread busy time, served rounds minus direct rounds;
// the client process's CPU), and the engine's steps a round in both modes.
// Run: npm run bench -- serve [--quick] [--rounds N] [--sessions N] [--profile DIR] (--sessions: concurrent sessions,
// default 64; DIR: a .cpuprofile of the main thread per measured served round). Rounds alternate served and direct,
// with the harness's machine-speed probe before each.
import { fork } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { loadavg, tmpdir } from 'node:os';
import { performance } from 'node:perf_hooks';
import { join } from 'node:path';
import { deriveId } from '../core/ids.ts';
import { silentLogger } from '../core/telemetry.ts';
import { startServeJob } from '../cli/run/serve-job.ts';
import type { GenerateRequest, LlmBackend } from '../producers/backends/types.ts';
import { int, parseFlags, path, ROUND_FLAGS } from './flags.ts';
import { interleaved, probeSummary, type RoundRecord } from './harness.ts';
import type { ClientCall, ClientRound } from './serve-client.ts';

const CONFIG = join(import.meta.dirname, '../examples/calculator/config.yaml');
const TOKEN = 'bench-serve-token-0123456789';
/** Concurrent sessions by default (--sessions N). */
const SESSIONS = 64;
const MAX_TOKENS = 24;
const FOLLOW_UP = { role: 'user', content: 'Check it and give the answer.' };

interface Stats {
  mean: number;
  p50: number;
  p99: number;
  n: number;
}

function stats(xs: number[]): Stats {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? 0;
  return { mean: xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length), p50: q(0.5), p99: q(0.99), n: xs.length };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? 0;
}

/**
 * CPU time of this process's main thread in ms (Linux: /proc/self/task/<pid>/stat, in 10 ms clock ticks), or NaN
 * elsewhere: the endpoint's own work, apart from the engine's worker threads in the same process.
 */
function mainThreadCpuMs(): number {
  try {
    const stat = readFileSync(`/proc/self/task/${process.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // After the command: state is field 3, utime 14 and stime 15 (1-based, as in proc(5)).
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return NaN;
  }
}

const sameIds = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((x, i) => x === b[i]);

/** A generate call the endpoint made: what was asked, what came back, how long it took. */
interface Captured {
  request: GenerateRequest;
  tokenIds: number[];
  ms: number;
}

interface ServedCall extends ClientCall {
  generate: Captured;
}

interface RoundResult {
  /** Served: each call with the generate request it made; direct: each replayed call's wall time. */
  served?: ServedCall[];
  direct?: { ms: number; same: boolean }[];
  /** Served: the client process's CPU time over the round. */
  clientCpuMs?: number;
  wallMs: number;
  busyMs: number;
  cpuMs: number;
  mainCpuMs: number;
  /** Engine steps (decode and prefill) and prefill steps over the round, when the backend counts them. */
  steps: number;
  prefillSteps: number;
}

export async function main(args: string[]): Promise<unknown> {
  const { values: f } = parseFlags(args, { ...ROUND_FLAGS, sessions: int(1, 256), profile: path });
  const quick = f.quick === true;
  const rounds = f.rounds ?? (quick ? 1 : 3);
  const profileDir = f.profile ?? null;
  const sessions = f.sessions ?? SESSIONS;
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-serve-'));
  const captured = new Map<string, Captured>();
  /** The built-in policy's step counters (steps, prefill steps, decoded tokens), where the backend has them. */
  let engineStats: (() => { steps: number; prefillSteps: number; decodeTokens: number }) | null = null;
  const capturing = (inner: LlmBackend): LlmBackend => {
    const withStats = inner as LlmBackend & { stats?: () => { steps: number; prefillSteps: number; decodeTokens: number } };
    if (typeof withStats.stats === 'function') engineStats = () => withStats.stats!();
    return {
      name: inner.name,
      async generate(request: GenerateRequest, signal?: AbortSignal) {
        const t0 = performance.now();
        const out = await inner.generate(request, signal);
        captured.set(request.requestId, { request, tokenIds: out.tokenIds, ms: performance.now() - t0 });
        return out;
      },
      releaseSession: (id) => inner.releaseSession?.(id),
      currentPolicyVersion: () => inner.currentPolicyVersion(),
      close: () => inner.close(),
    };
  };
  const job = await startServeJob({
    configPath: CONFIG,
    port: 0,
    tokens: [{ token: TOKEN, role: 'read' }],
    wrapBackend: capturing,
    limits: { maxSessions: 4 * sessions, idleTimeoutMs: 600_000 },
    logger: silentLogger,
    overrides: { 'run.data_dir': dir, 'traces.kind': 'none' },
  });
  // The wrapped backend: direct replays pay the same wrapper as served calls.
  const inner = job.backend;

  /** Main-thread busy time (event-loop utilisation), process CPU time and main-thread CPU time of a round, in ms. */
  const meter = () => {
    const elu = performance.eventLoopUtilization();
    const cpu = process.cpuUsage();
    const main = mainThreadCpuMs();
    const e0 = engineStats?.() ?? { steps: NaN, prefillSteps: NaN };
    return () => {
      const e = performance.eventLoopUtilization(elu);
      const c = process.cpuUsage(cpu);
      return { busyMs: e.active, cpuMs: (c.user + c.system) / 1000, mainCpuMs: mainThreadCpuMs() - main, steps: (engineStats?.().steps ?? NaN) - e0.steps, prefillSteps: (engineStats?.().prefillSteps ?? NaN) - e0.prefillSteps };
    };
  };

  // The client runs in its own process: this process's CPU time is then the endpoint's (and the engine's) alone.
  const client = fork(join(import.meta.dirname, 'serve-client.ts'), [], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, BENCH_SERVE_URL: job.url, BENCH_SERVE_TOKEN: TOKEN, BENCH_SERVE_SESSIONS: String(sessions), BENCH_SERVE_MAX_TOKENS: String(MAX_TOKENS), BENCH_SERVE_FOLLOW_UP: JSON.stringify(FOLLOW_UP) },
  });
  const next = () =>
    new Promise<unknown>((resolve, reject) => {
      const exited = (code: number | null) => reject(new Error(`bench serve client exited ${code}`));
      client.once('exit', exited);
      client.once('message', (m) => {
        client.off('exit', exited);
        resolve(m);
      });
    });
  await next(); // ready

  const inspector = profileDir ? new Session() : null;
  if (inspector) {
    mkdirSync(profileDir!, { recursive: true });
    inspector.connect();
    await inspector.post('Profiler.enable');
  }

  const served = async (round: number): Promise<RoundResult> => {
    if (inspector && round >= 0) await inspector.post('Profiler.start');
    captured.clear();
    const t0 = performance.now();
    const m = meter();
    const answer = next();
    client.send({ round });
    const r = (await answer) as ClientRound;
    const wallMs = performance.now() - t0;
    const used = m();
    if (inspector && round >= 0) {
      const { profile } = await inspector.post('Profiler.stop');
      writeFileSync(join(profileDir!, `served-round-${round}.cpuprofile`), JSON.stringify(profile));
    }
    const calls = r.calls.map((c) => {
      // The endpoint's request id for a turn is deriveId(trajectory, 'generate', turn) (producers/agent/steps.ts).
      const generate = captured.get(deriveId(c.trajectoryId, 'generate', c.turnIndex));
      if (!generate) throw new Error(`no generate call captured for ${c.trajectoryId} turn ${c.turnIndex}`);
      return { ...c, generate };
    });
    return { served: calls, clientCpuMs: r.cpuMs, wallMs, ...used };
  };

  /** Replay a served round's generate requests: per session in order, the sessions concurrently; results in `of`'s order. */
  const direct = async (round: number, of: readonly ServedCall[]): Promise<RoundResult> => {
    const bySession = new Map<number, number[]>();
    of.forEach((c, i) => bySession.set(c.session, [...(bySession.get(c.session) ?? []), i]));
    const out = new Array<{ ms: number; same: boolean }>(of.length);
    const t0 = performance.now();
    const m = meter();
    await Promise.all(
      [...bySession].map(async ([session, indexes]) => {
        const sessionId = `direct-${round}-${session}`;
        for (const i of indexes.sort((a, b) => of[a]!.turn - of[b]!.turn)) {
          const c = of[i]!;
          const q = c.generate.request;
          const c0 = performance.now();
          const r = await inner.generate({ requestId: `${sessionId}-${c.turn}`, sessionId, promptIds: q.promptIds, sampling: q.sampling });
          out[i] = { ms: performance.now() - c0, same: sameIds(r.tokenIds, c.generate.tokenIds) };
        }
        inner.releaseSession?.(sessionId);
      }),
    );
    return { direct: out, wallMs: performance.now() - t0, ...m() };
  };

  /** Each served call with its direct replay. */
  const paired = (s: ServedCall[], d: RoundResult) => s.map((x, i) => ({ served: x, direct: d.direct![i]! }));

  // Each round's direct mode replays the served mode that ran just before it.
  let lastServed: ServedCall[] = [];
  const servedMode = async (round: number) => {
    const r = await served(round);
    lastServed = r.served!;
    return r;
  };
  const directMode = (round: number) => direct(round, lastServed);

  try {
    // Warm-up: onnxruntime sessions, the template's shapes, HTTP connections.
    await servedMode(-1);
    await directMode(-1);
    const records = await interleaved<RoundResult>([{ name: 'served', run: servedMode }, { name: 'direct', run: directMode }], rounds);
    const ok = (mode: string) => records.filter((r) => r.mode === mode && r.result).map((r) => r as RoundRecord<RoundResult> & { result: RoundResult });
    const s = ok('served');
    const d = ok('direct');
    const pairs = s.flatMap((x, i) => (d[i] ? paired(x.result.served!, d[i].result) : []));
    const overhead = stats(pairs.map((x) => x.served.ms - x.direct.ms));
    const report = {
      sessions,
      turns_per_session: 2,
      max_tokens: MAX_TOKENS,
      rounds,
      served_call_ms: stats(pairs.map((x) => x.served.ms)),
      direct_call_ms: stats(pairs.map((x) => x.direct.ms)),
      overhead_per_call_ms: overhead,
      overhead_per_call_ms_median_round: median(s.map((x, i) => (d[i] ? stats(paired(x.result.served!, d[i].result).map((y) => y.served.ms - y.direct.ms)).mean : NaN))),
      outside_generate_ms: stats(pairs.map((x) => x.served.ms - x.served.generate.ms)),
      same_tokens: pairs.filter((x) => x.direct.same).length,
      // What the endpoint costs per call in work, which the load of other processes inflates far less than
      // latency: main-thread busy time and process CPU time of the endpoint's process (the client runs in another),
      // served minus direct, over the calls.
      main_thread_busy_ms_per_call: median(s.map((x, i) => (d[i] ? (x.result.busyMs - d[i].result.busyMs) / x.result.served!.length : NaN))),
      cpu_ms_per_call: median(s.map((x, i) => (d[i] ? (x.result.cpuMs - d[i].result.cpuMs) / x.result.served!.length : NaN))),
      main_thread_cpu_ms_per_call: median(s.map((x, i) => (d[i] ? (x.result.mainCpuMs - d[i].result.mainCpuMs) / x.result.served!.length : NaN))),
      client_cpu_ms_per_call: median(s.map((x) => x.result.clientCpuMs! / x.result.served!.length)),
      // The round's wall time the endpoint adds, spread over its calls: its cost per call in throughput.
      round_wall_added_ms_per_call: median(s.map((x, i) => (d[i] ? (x.result.wallMs - d[i].result.wallMs) / x.result.served!.length : NaN))),
      // Requests reaching the engine one after another (as the endpoint handles them) are decoded in more, smaller
      // steps than the same requests arriving together: the engine's share of the served rounds' extra CPU.
      engine_steps_served: median(s.map((x) => x.result.steps)),
      engine_steps_direct: median(d.map((x) => x.result.steps)),
      engine_prefill_steps_served: median(s.map((x) => x.result.prefillSteps)),
      engine_prefill_steps_direct: median(d.map((x) => x.result.prefillSteps)),
      served_round_wall_ms: median(s.map((x) => x.result.wallMs)),
      direct_round_wall_ms: median(d.map((x) => x.result.wallMs)),
      probes: probeSummary(records),
      loadavg: loadavg(),
    };
    const f = (x: number) => x.toFixed(2);
    const line = (name: string, x: Stats, tail = '') => console.log(`  ${name.padEnd(22)} mean ${f(x.mean)} ms  p50 ${f(x.p50)}  p99 ${f(x.p99)}  (${x.n} calls)${tail}`);
    console.log(`serve overhead at ${sessions} concurrent sessions, built-in policy (calculator), ${rounds} round(s), load average ${loadavg().map((x) => x.toFixed(1)).join(' ')}`);
    line('direct backend call', report.direct_call_ms, `, same tokens as served: ${report.same_tokens}/${pairs.length}`);
    line('served call', report.served_call_ms);
    line('overhead per call', overhead, ', served minus its direct replay');
    line('outside generate', report.outside_generate_ms, ', served minus its own backend.generate');
    console.log(`  work per call          endpoint: main-thread CPU ${f(report.main_thread_cpu_ms_per_call)} ms (busy ${f(report.main_thread_busy_ms_per_call)} ms), process CPU ${f(report.cpu_ms_per_call)} ms (served minus direct); client process CPU ${f(report.client_cpu_ms_per_call)} ms`);
    console.log(`  round wall time        served ${f(report.served_round_wall_ms)} ms, direct ${f(report.direct_round_wall_ms)} ms: ${f(report.round_wall_added_ms_per_call)} ms added per call`);
    if (Number.isFinite(report.engine_steps_served)) console.log(`  engine steps a round   served ${report.engine_steps_served} (${report.engine_prefill_steps_served} prefill), direct ${report.engine_steps_direct} (${report.engine_prefill_steps_direct} prefill)`);
    if (profileDir) console.log(`  profiles               ${profileDir}/served-round-*.cpuprofile`);
    return report;
  } finally {
    inspector?.disconnect();
    client.send('exit');
    await job.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

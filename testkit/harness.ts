// The fault tests' harness: a run of the distributed shape where every role is its own `rlstream worker`
// process (on a private Kafka broker, the shared registry and ClickHouse), started, SIGKILLed and restarted by
// the test; and the audit that reads the log and ClickHouse back at the end.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { newId } from '../core/ids.ts';
import { Model, parseModelConfig } from '../native/model.ts';
import { openKafkaLog } from '../core/log/kafka/index.ts';
import type { EventLog } from '../core/log/types.ts';
import { silentLogger } from '../core/telemetry.ts';
import { TOPICS } from '../core/topics.ts';
import { ensureTopics } from '../cli/run/context.ts';

const ROOT = resolve(import.meta.dirname, '..');
// The distributed shape's config and model the fault tests run (the README points at the same file).
const FIXTURES = join(ROOT, 'test', 'chaos', 'fixtures');
export const CONFIG = join(FIXTURES, 'config.yaml');
export const ROLES = ['rollout', 'reward', 'advantage', 'trainer', 'traces'] as const;
export type Role = (typeof ROLES)[number];

export interface RunSetup {
  runId: string;
  dir: string;
  database: string;
  brokers: string;
  /** --set overrides every role of this run gets. */
  sets: string[];
}

/** A fresh run: its own id, data directory, ClickHouse database and random init weights. */
export async function newRun(name: string, brokers: string, extra: Record<string, string | number> = {}): Promise<RunSetup> {
  const dir = mkdtempSync(join(tmpdir(), `rlstream-${name}-`));
  const id = newId().replace(/[^A-Za-z0-9]/g, '').slice(0, 10);
  const runId = `${name}-${id}`;
  const database = `${name}_${id}`.replace(/[^A-Za-z0-9_]/g, '_');
  const config = parseModelConfig(JSON.parse(readFileSync(join(FIXTURES, 'model.json'), 'utf8')));
  const model = Model.init(config, { seed: 11, threads: 1 });
  await model.save(join(dir, 'init.safetensors'));
  model.dispose();
  const sets = { 'run.id': runId, 'run.data_dir': join(dir, 'data'), 'model.init': join(dir, 'init.safetensors'), 'traces.database': database, ...extra };
  return { runId, dir, database, brokers, sets: Object.entries(sets).flatMap(([k, v]) => ['--set', `${k}=${v}`]) };
}

export interface RoleOutputOptions {
  /** The role's RLSTREAM_LOG_LEVEL (default: this process's, else warn). */
  logLevel?: string;
  /** Called with each whole line the role writes. */
  onLine?: (line: string) => void;
}

/** One life of a role process. */
export class RoleProcess {
  readonly child: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private tail = '';
  readonly startedAt = Date.now();
  /** Set when the test (not the role itself) sent the signal that ends it. */
  killedFromOutside = false;

  constructor(
    readonly role: Role,
    run: RunSetup,
    extraArgs: string[] = [],
    options: RoleOutputOptions = {},
  ) {
    this.child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'cli/main.ts'), 'worker', role, CONFIG, ...run.sets, ...extraArgs], {
      cwd: ROOT,
      env: { ...process.env, CHAOS_KAFKA: run.brokers, RLSTREAM_LOG_LEVEL: options.logLevel ?? process.env['RLSTREAM_LOG_LEVEL'] ?? 'warn' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    // RLSTREAM_ROLE_LOGS=<dir>: every life's whole output goes to <dir>/<role>.log as well (the tail kept here is
    // what a failure message shows; a stall's cause is often further back).
    const logs = process.env['RLSTREAM_ROLE_LOGS'];
    if (logs) mkdirSync(logs, { recursive: true });
    const file = logs ? createWriteStream(join(logs, `${role}.log`), { flags: 'a' }) : null;
    // A log file that cannot be written must not fail the test it only records.
    file?.on('error', (err) => process.stderr.write(`# role log ${role}: ${err.message}\n`));
    file?.write(`--- ${role} pid ${this.child.pid} started ${new Date(this.startedAt).toISOString()}\n`);
    const keep = (d: Buffer) => {
      this.tail = (this.tail + d.toString()).slice(-64_000);
      file?.write(d);
    };
    this.child.stdout!.on('data', keep);
    this.child.stderr!.on('data', keep);
    // Whole lines per stream (a stderr chunk may arrive in the middle of a stdout line), characters decoded across
    // chunks, the last unterminated line given at the end.
    if (options.onLine) for (const s of [this.child.stdout!, this.child.stderr!]) createInterface({ input: s, crlfDelay: Infinity }).on('line', options.onLine);
    this.exited = new Promise((res) => this.child.once('exit', (code, signal) => res({ code, signal })));
    // 'close' comes after the last output ('exit' may come before it): the file ends there.
    this.child.once('close', (code, signal) => file?.end(`--- ${role} pid ${this.child.pid} exited code ${code} signal ${signal} ${new Date().toISOString()}\n`));
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  get output(): string {
    return this.tail;
  }

  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (this.running) {
      this.killedFromOutside = true;
      this.child.kill(signal);
    }
    await this.exited;
  }
}

/** Resident set size of a process in MiB, from /proc (null when it is gone). */
export function rssMiB(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

/** The run's log on the test's broker, with every topic of the contract created up front (no creation races). */
export async function openRunLog(brokers: string): Promise<EventLog> {
  const log = await openKafkaLog({ brokers: [brokers], clientId: 'rlstream-chaos-test' }, silentLogger);
  await ensureTopics(log);
  return log;
}

export interface Progress {
  rolloutEvents: number;
  lag: Record<'reward' | 'advantage' | 'trainer', number>;
}

export async function progress(log: EventLog, runId: string): Promise<Progress> {
  const sum = async (group: string, topic: string) => (await log.lag(group, topic)).reduce((n, l) => n + l.lag, 0);
  const ends = await log.offsets(TOPICS.rolloutEvents);
  return {
    rolloutEvents: ends.reduce((n, p) => n + p.high, 0),
    lag: { reward: await sum(`${runId}.reward`, TOPICS.rolloutEvents), advantage: await sum(`${runId}.advantage`, TOPICS.rewarded), trainer: await sum(`${runId}.trainer`, TOPICS.advantaged) },
  };
}

/**
 * Keeps one process per role alive, as a process supervisor would: a role that exits is started again, except
 * the rollout worker's clean exit (code 0: its dataset is done) once `finishing` is set.
 */
export class Supervisor {
  readonly procs = new Map<Role, RoleProcess>();
  readonly starts: Record<Role, number> = { rollout: 0, reward: 0, advantage: 0, trainer: 0, traces: 0 };
  readonly done = new Set<Role>();
  readonly crashes: string[] = [];
  finishing = false;
  private closed = false;
  private story: { logLevel: string; keep: RegExp; lines: Map<Role, string[]> } | null = null;

  constructor(
    private readonly run: RunSetup,
    private readonly roles: readonly Role[] = ROLES,
  ) {}

  /**
   * Before start(): run the roles at `logLevel` and keep, across every life of each role, the lines that match
   * `keep` (with each life's start and exit), so a failure can tell what each role did, restarts included.
   */
  keepStory(logLevel: string, keep: RegExp): void {
    this.story = { logLevel, keep, lines: new Map() };
  }

  /** The kept lines of a role (see keepStory). */
  storyOf(role: Role): string[] {
    return this.story?.lines.get(role) ?? [];
  }

  start(): void {
    for (const r of this.roles) this.spawn(r);
  }

  private spawn(role: Role): void {
    const story = this.story;
    const lines = story ? (story.lines.get(role) ?? []) : [];
    story?.lines.set(role, lines);
    const p = new RoleProcess(role, this.run, [], story ? { logLevel: story.logLevel, onLine: (l) => story.keep.test(l) && lines.push(l) } : {});
    lines.push(`${new Date().toISOString()} ${role} pid ${p.child.pid} started`);
    void p.exited.then(({ code, signal }) => lines.push(`${new Date().toISOString()} ${role} pid ${p.child.pid} exited ${code ?? signal}`));
    this.starts[role]++;
    this.procs.set(role, p);
    void p.exited.then(({ code, signal }) => {
      if (this.closed || this.procs.get(role) !== p) return;
      if (code === 0 && role === 'rollout' && this.finishing) return void this.done.add(role);
      // A SIGKILL this supervisor did not send is the role's own: the CLI ends that way when a native call never
      // returned (it says so on its last lines), so it is a crash like an exit code.
      if (code !== 0 && !(signal === 'SIGKILL' && p.killedFromOutside)) {
        // The error line the CLI prints, else (a role that died some other way) the end of its output.
        const said = p.output.split('\n').filter((l) => l.startsWith('rlstream:')).join(' ');
        this.crashes.push(`${role} exited ${code ?? signal}: ${said === '' ? p.output.slice(-1500) : said.slice(0, 300)}`);
      }
      setTimeout(() => !this.closed && this.spawn(role), 100);
    });
  }

  /** SIGKILL the role's current process (the supervisor restarts it). */
  async kill(role: Role): Promise<void> {
    await this.procs.get(role)?.kill('SIGKILL');
  }

  /** Wait until a role has ended by itself (exit 0 while finishing). */
  async waitDone(role: Role, timeoutMs: number): Promise<boolean> {
    const end = Date.now() + timeoutMs;
    while (!this.done.has(role)) {
      if (Date.now() > end) return false;
      await new Promise((r) => setTimeout(r, 250));
    }
    return true;
  }

  /** Stop every process: SIGTERM (a clean stop), SIGKILL after a grace period. */
  async stopAll(graceMs = 15_000): Promise<void> {
    this.closed = true;
    await Promise.all(
      [...this.procs.values()].map(async (p) => {
        if (!p.running) return;
        p.child.kill('SIGTERM');
        const t = setTimeout(() => p.child.kill('SIGKILL'), graceMs);
        await p.exited;
        clearTimeout(t);
      }),
    );
  }
}

// Which run directory the main job works in: a new one (its id carries the start time), or an unfinished one
// that it resumes. A killed main job loses nothing it committed: the log, the trainer's checkpoints and the
// consumers' offsets are in its run directory, so starting the same configuration again picks the newest
// unfinished run of that run.id and seed and carries on from there. `--new` starts afresh, `--resume <dir>`
// picks one. A run directory holds run.json (its id and the hash of the configuration that started it) from
// its start, and summary.json (the summary line) once it has finished.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import type { RunConfig } from '../config/run-config.ts';
import { RlstreamError } from '../../core/errors.ts';
import type { EventLog } from '../../core/log/types.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import { newId } from '../../core/ids.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import type { Evaluation, TrainStep } from '../../schemas/generated/types.ts';
import { readResumePoint, type ResumePoint } from '../../producers/resume.ts';

export type RunChoice = { kind: 'new' } | { kind: 'auto' } | { kind: 'dir'; dir: string };

export interface ChosenRun {
  runId: string;
  runDir: string;
  resumed: boolean;
  /** What was chosen and why, for the terminal. */
  message: string;
}

const RUN_FILE = 'run.json';
const SUMMARY_FILE = 'summary.json';

export interface RunFile {
  run_id: string;
  config_hash: string;
  created_at: string;
  /** Where the model came from (absolute paths or null), so `rlstream export` can copy its tokenizer files. */
  model?: { base: string | null; tokenizer: string | null; chat_template: string | null };
}

/** A digest of the effective configuration: a run is resumed only by the configuration that started it. */
function configHash(config: RunConfig): string {
  return createHash('sha256').update(JSON.stringify(config.effective)).digest('hex').slice(0, 16);
}

export function readRunFile(dir: string): RunFile | null {
  try {
    const v = JSON.parse(readFileSync(join(dir, RUN_FILE), 'utf8')) as Partial<RunFile>;
    return typeof v.run_id === 'string' && typeof v.config_hash === 'string' ? (v as RunFile) : null;
  } catch {
    return null;
  }
}

export function isFinished(dir: string): boolean {
  return existsSync(join(dir, SUMMARY_FILE));
}

/** A run directory whose run ended before it finished (killed, interrupted): `rlstream run` resumes it. */
export function isUnfinishedRun(dir: string): boolean {
  return readRunFile(dir) !== null && !isFinished(dir);
}

/** Pick (and for a new run, create) the run directory. */
export function chooseRun(config: RunConfig, choice: RunChoice, now = new Date()): ChosenRun {
  const prefix = `${config.run.id}-${config.run.seed}-`;
  const hash = configHash(config);
  if (choice.kind === 'dir') {
    const dir = resolve(choice.dir);
    const file = readRunFile(dir);
    if (!file) throw new RlstreamError('CONFIG_INVALID', `--resume ${choice.dir}: not a run directory of the main job (no readable ${RUN_FILE})`);
    if (isFinished(dir)) throw new RlstreamError('CONFIG_INVALID', `--resume ${choice.dir}: that run has finished (${SUMMARY_FILE} is there); start a new one with --new`);
    if (!file.run_id.startsWith(prefix)) throw new RlstreamError('CONFIG_INVALID', `--resume ${choice.dir}: run ${file.run_id} is not a run of run.id ${config.run.id} with seed ${config.run.seed}`);
    const same = file.config_hash === hash ? '' : ' (its configuration differed: the current one applies from here on)';
    return { runId: file.run_id, runDir: dir, resumed: true, message: `resuming run ${file.run_id} from ${dir}, as --resume asked${same}` };
  }
  if (choice.kind === 'auto') {
    const found = unfinishedRuns(config.run.dataDir, prefix, hash);
    if (found.length > 0) {
      const { runId, dir } = found[0]!;
      const more = found.length > 1 ? `; ${found.length - 1} older unfinished run(s) left as they are` : '';
      return { runId, runDir: dir, resumed: true, message: `resuming run ${runId}, the newest unfinished run of this configuration (${dir}${more}); --new starts afresh` };
    }
  }
  const runId = `${prefix}${now.toISOString().replace(/[-:.TZ]/g, '').slice(0, 14)}`;
  const runDir = join(config.run.dataDir, runId);
  mkdirSync(runDir, { recursive: true });
  const model = { base: config.model.base, tokenizer: config.model.tokenizer, chat_template: config.model.chatTemplate };
  writeAtomic(join(runDir, RUN_FILE), JSON.stringify({ run_id: runId, config_hash: hash, created_at: now.toISOString(), model } satisfies RunFile) + '\n');
  const why = choice.kind === 'new' ? 'as --new asked' : 'no unfinished run of this configuration';
  return { runId, runDir, resumed: false, message: `starting run ${runId} in ${runDir} (${why})` };
}

/** Unfinished runs of the prefix started by this configuration, newest first (ids sort by their start time). */
function unfinishedRuns(dataDir: string, prefix: string, hash: string): { runId: string; dir: string }[] {
  let names: string[];
  try {
    names = readdirSync(dataDir);
  } catch {
    return [];
  }
  return names
    .filter((n) => n.startsWith(prefix))
    .sort()
    .reverse()
    .map((n) => ({ runId: n, dir: join(dataDir, n) }))
    .filter(({ runId, dir }) => {
      const file = readRunFile(dir);
      return file !== null && file.run_id === runId && file.config_hash === hash && !isFinished(dir);
    });
}

/** Mark the run finished: an unfinished run is what a later start resumes. */
export function finishRun<T>(runDir: string, summary: T): T {
  writeAtomic(join(runDir, SUMMARY_FILE), JSON.stringify(summary) + '\n');
  return summary;
}

function writeAtomic(path: string, text: string): void {
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, text);
  renameSync(tmp, path);
}

/** What a resumed main job carries over from its earlier lives, read back from its log. */
export interface ResumedState {
  /** The run's committed train steps, in order. */
  steps: TrainStep[];
  /** Samples already completed (not run again) and this life's tag for new trajectory ids. */
  resume: ResumePoint;
  /** The Evaluation events of earlier lives, in log order (the initial one among them, when it was measured). */
  evaluations: Evaluation[];
}

export async function resumedState(log: EventLog, serde: EventSerde, runId: string): Promise<ResumedState> {
  const { steps, evaluations } = await committedSteps(log, serde, runId);
  return { steps, resume: await readResumePoint(log, serde, runId, { resumed: true }), evaluations };
}

async function committedSteps(log: EventLog, serde: EventSerde, runId: string): Promise<{ steps: TrainStep[]; evaluations: Evaluation[] }> {
  const ends = await log.offsets(TOPICS.trainSteps).catch(() => []);
  const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
  const byStep = new Map<number, TrainStep>();
  const evaluations: Evaluation[] = [];
  if (target.size > 0) {
    const consumer = await log.consumer({ groupId: `main-resume-${basename(runId)}-${newId()}`, topics: [TOPICS.trainSteps], readCommitted: true, fromBeginning: true });
    try {
      await readToEnd(consumer, TOPICS.trainSteps, target, async (records) => {
        for (const r of records) {
          const ev = await serde.decode(r.value);
          if (ev.name === 'TrainStep' && ev.value.run_id === runId) byStep.set(ev.value.step, ev.value);
          if (ev.name === 'Evaluation' && ev.value.run_id === runId) evaluations.push(ev.value);
        }
      }, { what: 'resume: train steps', timeoutMs: 60_000 });
    } finally {
      await consumer.close().catch(() => {});
    }
  }
  return { steps: [...byStep.values()].sort((a, b) => a.step - b.step), evaluations };
}

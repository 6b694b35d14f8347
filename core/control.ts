// Following a run's control topic (pause, resume, set_staleness, stop) for as long as a role runs: the one follower
// the rollout worker and the trainer share. It keeps the commands of this run issued during this process's life
// and hands each, decoded through the serde, to the role's callback.
//
// The control topic is read from its beginning (a fresh consumer group per opening), so it holds every session of
// every run sharing the log: a command of another run is not this role's, and one issued before this process
// started belongs to an earlier session of the run (replaying a past stop would end this one).
import { deriveId } from './ids.ts';
import { follow, type Follower } from './log/follow.ts';
import type { EventLog, LogRecord, PollOptions } from './log/types.ts';
import type { EventSerde } from './serde/events.ts';
import { TOPICS } from './topics.ts';
import type { Control } from '../schemas/generated/types.ts';

/**
 * How much older than the process a command may be and still be taken: one issued just before a restarted role's
 * process began (an operator's command racing the restart) is meant for it. Clocks of the issuing and following
 * hosts may differ by about this much too.
 */
export const CONTROL_SLACK_MS = 1000;

export interface ControlFollowOptions {
  runId: string;
  /** When this process (the role) started, Date.now(): commands older than this less CONTROL_SLACK_MS are skipped. */
  startedMs: number;
  /** The role's name in the consumer group id (`${runId}.${role}-control.<fresh id>`). */
  role: string;
  /** Each command of this run and session, in log order. */
  onControl(c: Control): void | Promise<void>;
  /** A failed poll (the consumer is replaced), a callback that threw, or a record that does not decode (skipped). */
  onError(err: unknown, where: 'poll' | 'handle' | 'decode', record?: LogRecord): void;
  /** Default: up to 100 records, 200 ms. */
  poll?: PollOptions;
  /** The wait after a failure (default: follow's). */
  retryDelayMs?: number;
}

/** Whether a command is for this run and this session of it (see CONTROL_SLACK_MS). */
export function controlApplies(c: Control, runId: string, startedMs: number): boolean {
  return c.run_id === runId && c.time_ms >= startedMs - CONTROL_SLACK_MS;
}

export function followControl(log: EventLog, serde: EventSerde, o: ControlFollowOptions): Follower {
  return follow(
    log,
    async (records) => {
      for (const r of records) {
        let decoded;
        try {
          decoded = await serde.decode(r.value);
        } catch (err) {
          o.onError(err, 'decode', r);
          continue;
        }
        if (decoded.name === 'Control' && controlApplies(decoded.value, o.runId, o.startedMs)) await o.onControl(decoded.value);
      }
    },
    {
      consumer: () => ({ groupId: `${o.runId}.${o.role}-control.${deriveId(Date.now(), Math.random())}`, topics: [TOPICS.control], fromBeginning: true }),
      poll: o.poll ?? { maxRecords: 100, timeoutMs: 200 },
      ...(o.retryDelayMs !== undefined ? { retryDelayMs: o.retryDelayMs } : {}),
      onError: (err, where) => o.onError(err, where),
    },
  );
}


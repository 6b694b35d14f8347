// What the admin server needs from a run, as small interfaces: the main job, the `rlstream admin` command and
// tests each assemble an AdminContext from whatever implementations they hold (embedded or Kafka log, chDB or
// ClickHouse traces, a live replay manager or none), so the server never reaches into another role's internals.
import type { Registry } from 'prom-client';
import type { EventLog } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import type { Logger } from '../core/telemetry.ts';
import type { Control } from '../schemas/generated/types.ts';

export type RunStatus = 'running' | 'paused' | 'stopping' | 'stopped' | 'completed' | 'failed' | 'unknown';

export interface RunInfo {
  id: string;
  status: RunStatus;
  /** Milliseconds since the epoch; null when the run was only discovered from its events. */
  startedMs: number | null;
  /** The run's configuration with secrets already redacted (core/telemetry redact()). */
  config: Record<string, unknown>;
  /** Consumer groups of the run's roles, by role name (their lag is shown per partition). */
  consumerGroups: Record<string, { groupId: string; topics: string[] }>;
  /** Current staleness bound, when known (from config or the latest set_staleness Control event). */
  stalenessBound: number | null;
}

export interface RunRegistry {
  list(): RunInfo[];
  get(id: string): RunInfo | undefined;
  /**
   * Status of a run known only from its events, without Control events (default running). A process that
   * could open an embedded log holds its lock, so no run is writing it: its runs have ended.
   */
  readonly discoveredStatus?: RunStatus;
}

/** Limits the trace store enforces through ClickHouse settings (max_result_rows, max_result_bytes, max_execution_time). */
export interface QueryLimits {
  maxRows: number;
  maxBytes: number;
  timeoutMs: number;
}

export interface QueryColumn {
  name: string;
  type: string;
}

export interface QueryResult {
  columns: QueryColumn[];
  rows: Record<string, unknown>[];
  /** Engine statistics when the store reports them. */
  stats?: { rowsRead?: number; bytesRead?: number; elapsedMs?: number };
}

export interface NamedQueryParam {
  name: string;
  type: 'string' | 'int' | 'float' | 'bool';
  required: boolean;
  description: string;
}

export interface NamedQueryInfo {
  name: string;
  description: string;
  params: NamedQueryParam[];
}

/** A turn of a trajectory, as the trajectory viewer draws it. */
export interface TrajectoryTurn {
  index: number;
  role: string;
  text: string;
  tokenIds: number[];
  /** Decoded text of each token when the store has it (same length as tokenIds), else null. */
  tokenTexts: string[] | null;
  lossMask: number[];
  logprobs: number[];
  policyVersion: number;
  toolCalls: { id: string; name: string; argumentsJson: string }[];
}

/** What every view of a recorded tool call shows. */
export interface ToolCallFields {
  turnIndex: number;
  toolName: string;
  argumentsJson: string;
  status: string;
  resultText: string;
  latencyMs: number;
}

export interface TrajectoryToolCall extends ToolCallFields {
  callId: string;
  reward: number;
}

export interface TrajectoryDetail {
  trajectoryId: string;
  runId: string;
  groupId: string;
  agentName: string;
  dataSource: string;
  termination: string | null;
  reward: number | null;
  correct: boolean | null;
  /** The dataset split its row came from ('train', 'heldout', …); null when its start is not in the store. */
  split: string | null;
  /**
   * What the trainer did with it, from the train steps: 'trained' (in a step's trajectory_ids), 'dropped' (consumed
   * as too stale), or null when no step names it (a held-out evaluation, or not consumed yet). `step` is that step.
   */
  training: { outcome: 'trained' | 'dropped'; step: number } | null;
  promptText: string;
  promptTokenIds: number[];
  turns: TrajectoryTurn[];
  toolCalls: TrajectoryToolCall[];
}

export interface ToolCallRow extends ToolCallFields {
  time: number;
  runId: string;
  trajectoryId: string;
}

/** The subset of the trace store the admin server uses (core/traces implements it; see admin/traces-adapter.ts). */
export interface AdminTraceStore {
  readonly kind: string;
  /** Resolves when the store answers a trivial query; rejects otherwise (readiness). */
  ping(): Promise<void>;
  namedQueries(): NamedQueryInfo[];
  /** Throws RlstreamError INPUT_INVALID on an unknown name or bad parameters. */
  runNamed(name: string, params: Record<string, unknown>, limits: QueryLimits): Promise<QueryResult>;
  /** Runs untrusted SQL: checked on the engine's parse, then in the SQL sandbox (core/traces/sandbox/) with the limits. */
  queryReadonly(sql: string, limits: QueryLimits): Promise<QueryResult>;
  trajectory(trajectoryId: string): Promise<TrajectoryDetail | null>;
  toolCalls(filter: { runId?: string; limit: number; status?: string }): Promise<ToolCallRow[]>;
}

export interface ReplaySpec {
  /** What to recompute: a role whose output is derived from the log (reward, advantage, traces…). */
  target: string;
  runId: string | null;
  /** Replay records at or after this time (ms since the epoch); null for the beginning. */
  fromMs: number | null;
  toMs: number | null;
  /** Extra options for the target (e.g. a new reward function id). */
  options: Record<string, string>;
}

export type ReplayState = 'pending' | 'running' | 'completed' | 'cancelled' | 'failed';

export interface ReplayJobInfo {
  id: string;
  spec: ReplaySpec;
  state: ReplayState;
  startedMs: number;
  finishedMs: number | null;
  processed: number;
  /** Records to process when known (end offsets minus start offsets), else null. */
  total: number | null;
  error: string | null;
}

export interface ReplayManager {
  start(spec: ReplaySpec): Promise<ReplayJobInfo>;
  list(): ReplayJobInfo[];
  get(id: string): ReplayJobInfo | undefined;
  /** Cancels a running job; a finished job is returned unchanged. */
  cancel(id: string): Promise<ReplayJobInfo | undefined>;
}

export type ControlRequest = Pick<Control, 'run_id' | 'command' | 'staleness_bound' | 'reason' | 'issued_by'>;

export interface PublishedControl {
  eventId: string;
  partition: number;
  offset: number;
}

export interface AdminContext {
  log: EventLog;
  serde: EventSerde;
  /** null when the run has no trace store (trace routes answer ADM_ERR_UNAVAILABLE). */
  traces: AdminTraceStore | null;
  runs: RunRegistry;
  /** Publishes a Control event to TOPICS.control (core/… or admin/control.ts's publisher). */
  publishControl(request: ControlRequest): Promise<PublishedControl>;
  /** null when replay jobs are not available in this process. */
  replay: ReplayManager | null;
  /** The process's prom-client registry; /metrics serves it. */
  metrics: Registry;
  logger: Logger;
}

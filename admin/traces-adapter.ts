// Adapts core/traces' TraceStore (chDB or ClickHouse server) to the admin server's AdminTraceStore: limits in
// the admin's units, the trajectory viewer's shape assembled from the turns / tool_calls / trajectory_starts /
// rewards tables, and the recent tool calls. All values reach SQL through core/traces/sql.ts bind().
import { listNamedQueries, runNamed as runCoreNamed } from '../core/traces/queries.ts';
import { bind } from '../core/traces/sql.ts';
import type { QueryLimits as StoreLimits, QueryResult as StoreResult, Row, TraceStore } from '../core/traces/store.ts';
import type { AdminTraceStore, NamedQueryInfo, QueryLimits, QueryResult, ToolCallFields, ToolCallRow, TrajectoryDetail, TrajectoryTurn } from './context.ts';

/** Named queries (list + run); core/traces/queries.ts's catalogue unless another is given. */
export interface NamedQuerySource {
  list(): NamedQueryInfo[];
  run(store: TraceStore, name: string, params: Record<string, unknown>, limits: StoreLimits): Promise<QueryResult>;
}

const PARAM_TYPES: Record<string, 'string' | 'int' | 'float'> = { String: 'string', Int64: 'int', UInt64: 'int', Float64: 'float' };

const CORE_NAMED_QUERIES: NamedQuerySource = {
  list: () =>
    listNamedQueries().map((q) => ({
      name: q.name,
      description: q.description,
      params: q.params.map((p) => ({
        name: p.name,
        type: PARAM_TYPES[p.type] ?? 'string',
        required: p.default === undefined,
        description: p.default === undefined ? `${p.type}, required` : `${p.type}, default ${JSON.stringify(p.default)}`,
      })),
    })),
  run: async (store, name, params, limits) => adminResult(await runCoreNamed(store, name, params, limits)),
};

function adminResult(r: StoreResult): QueryResult {
  return { columns: r.columns, rows: r.rows, stats: { elapsedMs: r.elapsedMs } };
}

function storeLimits(l: QueryLimits): StoreLimits {
  // ClickHouse's max_execution_time is in whole seconds; round up so a 1.5 s budget is not cut to 1 s.
  return { maxRows: l.maxRows, maxBytes: l.maxBytes, maxSeconds: Math.max(1, Math.ceil(l.timeoutMs / 1000)), overflow: 'throw' };
}

const num = (v: unknown): number => (typeof v === 'number' ? v : Number(v));
const arr = <T>(v: unknown, f: (x: unknown) => T): T[] => (Array.isArray(v) ? v.map(f) : []);
const str = (v: unknown): string => (v === null || v === undefined ? '' : String(v));

/** ClickHouse renders DateTime64 as 'YYYY-MM-DD hh:mm:ss.mmm' (UTC here); ms since the epoch. */
function timeMs(v: unknown): number {
  if (typeof v === 'number') return v;
  const t = Date.parse(str(v).replace(' ', 'T') + 'Z');
  return Number.isFinite(t) ? t : 0;
}

/** The columns of a tool_calls row that every view of the call shows. */
function toolCallFields(c: Row): ToolCallFields {
  return {
    turnIndex: num(c['turn_index']),
    toolName: str(c['tool_name']),
    argumentsJson: str(c['arguments_json']),
    status: str(c['status']),
    resultText: str(c['result_text']),
    latencyMs: num(c['latency_ms']),
  };
}

/** Each token's text, for the dashboard's token chips (a tokenizer is the caller's; without one, ids only). */
export type TokenTexts = (ids: readonly number[]) => string[];

export function adminTraceStore(store: TraceStore, named: NamedQuerySource = CORE_NAMED_QUERIES, tokenTexts: TokenTexts | null = null): AdminTraceStore {
  const q = async (template: string, params: Record<string, unknown>) => (await store.query(bind(template, params))).rows;
  return {
    kind: store.kind,
    async ping() {
      await store.query('SELECT 1 AS ok');
    },
    namedQueries() {
      return named.list();
    },
    async runNamed(name, params, limits) {
      return named.run(store, name, params, storeLimits(limits));
    },
    async queryReadonly(sql, limits) {
      return adminResult(await store.queryReadonly(sql, storeLimits(limits)));
    },
    async trajectory(id): Promise<TrajectoryDetail | null> {
      const p = { id };
      const [starts, turns, calls, rewards, done, trained, dropped] = await Promise.all([
        q('SELECT * FROM trajectory_starts FINAL WHERE trajectory_id = {id:String} LIMIT 1', p),
        q('SELECT * FROM turns FINAL WHERE trajectory_id = {id:String} ORDER BY turn_index', p),
        q('SELECT * FROM tool_calls FINAL WHERE trajectory_id = {id:String} ORDER BY turn_index, call_id', p),
        q('SELECT score, correct FROM rewards FINAL WHERE trajectory_id = {id:String} ORDER BY time DESC LIMIT 1', p),
        q('SELECT termination FROM trajectories FINAL WHERE trajectory_id = {id:String} LIMIT 1', p),
        q('SELECT step FROM train_steps FINAL WHERE has(trajectory_ids, {id:String}) ORDER BY step LIMIT 1', p),
        q('SELECT step FROM train_steps FINAL WHERE has(dropped_trajectory_ids, {id:String}) ORDER BY step LIMIT 1', p),
      ]);
      const s = starts[0];
      const first = s ?? turns[0] ?? calls[0];
      if (!first) return null;
      const reward = rewards[0];
      return {
        trajectoryId: id,
        runId: str(first['run_id']),
        groupId: str(first['group_id']),
        agentName: str(s?.['agent_name']),
        dataSource: str(s?.['data_source']),
        termination: done[0] ? str(done[0]['termination']) : null,
        reward: reward ? num(reward['score']) : null,
        correct: reward && reward['correct'] !== null && reward['correct'] !== undefined ? num(reward['correct']) === 1 : null,
        split: s ? str(s['split']) : null,
        training: trained[0] ? { outcome: 'trained', step: num(trained[0]['step']) } : dropped[0] ? { outcome: 'dropped', step: num(dropped[0]['step']) } : null,
        promptText: arr(s?.['prompt_contents'], str).join('\n'),
        promptTokenIds: arr(s?.['prompt_token_ids'], num),
        turns: turns.map(
          (t): TrajectoryTurn => ({
            index: num(t['turn_index']),
            role: str(t['role']),
            text: str(t['text']),
            tokenIds: arr(t['token_ids'], num),
            tokenTexts: tokenTexts ? tokenTexts(arr(t['token_ids'], num)) : null,
            responseMask: arr(t['loss_mask'], num),
            logprobs: arr(t['logprobs'], num),
            policyVersion: num(t['policy_version']),
            toolCalls: arr(t['tool_call_ids'], str).map((cid, i) => ({
              id: cid,
              name: str((t['tool_call_names'] as unknown[] | undefined)?.[i]),
              argumentsJson: str((t['tool_call_arguments'] as unknown[] | undefined)?.[i]),
            })),
          }),
        ),
        toolCalls: calls.map((c) => ({ callId: str(c['call_id']), ...toolCallFields(c), reward: num(c['reward']) })),
      };
    },
    async toolCalls(filter): Promise<ToolCallRow[]> {
      const where: string[] = [];
      const params: Record<string, unknown> = { limit: filter.limit };
      if (filter.runId) {
        where.push('run_id = {run:String}');
        params['run'] = filter.runId;
      }
      if (filter.status) {
        where.push('status = {status:String}');
        params['status'] = filter.status;
      }
      const rows = await q(
        `SELECT time, run_id, trajectory_id, turn_index, tool_name, status, latency_ms, arguments_json, result_text FROM tool_calls FINAL ${where.length ? 'WHERE ' + where.join(' AND ') : ''} ORDER BY time DESC LIMIT {limit:UInt64}`,
        params,
      );
      return rows.map((r) => ({ time: timeMs(r['time']), runId: str(r['run_id']), trajectoryId: str(r['trajectory_id']), ...toolCallFields(r) }));
    },
  };
}

// One view of the runs: those the process was told about (ctx.runs, with their config) merged with those the
// log tail discovered from their events; the tail's Control events decide pause/stop status and bound.
import type { RunInfo } from '../context.ts';
import type { AdminState } from '../server.ts';

export interface RunView extends RunInfo {
  lastStep: number | null;
  lastPolicyVersion: number | null;
  lastEventMs: number | null;
}

export function runView(state: AdminState, runId: string): RunView | undefined {
  const known = state.ctx.runs.get(runId);
  const h = state.tail?.get(runId);
  if (!known && !h) return undefined;
  const base: RunInfo = known ?? { id: runId, status: 'unknown', startedMs: null, config: {}, consumerGroups: {}, stalenessBound: null };
  let status = base.status;
  // A finished run's registry status wins; otherwise the newest Control event says paused or stopping.
  if (h && h.controls.length > 0 && (status === 'running' || status === 'paused' || status === 'unknown')) status = h.status;
  if (h && !known && h.controls.length === 0) status = state.ctx.runs.discoveredStatus ?? 'running';
  return {
    ...base,
    status,
    startedMs: base.startedMs ?? h?.firstSeenMs ?? null,
    stalenessBound: h?.stalenessBound ?? base.stalenessBound,
    lastStep: h?.steps.at(-1)?.step ?? null,
    lastPolicyVersion: h?.versions.at(-1)?.policy_version ?? null,
    lastEventMs: h?.lastEventMs ?? null,
  };
}

export function listRuns(state: AdminState): RunView[] {
  const ids = new Set<string>(state.ctx.runs.list().map((r) => r.id));
  for (const h of state.tail?.list() ?? []) ids.add(h.runId);
  return [...ids].sort().map((id) => runView(state, id)!);
}

// The simplest RunRegistry: runs held in memory, added and updated by whoever starts them (the main job, the
// `rlstream admin` command, tests). Configs are redacted on the way in, so a secret can never be served.
import { redact } from '../core/telemetry.ts';
import type { RunInfo, RunRegistry, RunStatus } from './context.ts';

export class MemoryRunRegistry implements RunRegistry {
  private readonly runs = new Map<string, RunInfo>();

  constructor(readonly discoveredStatus: RunStatus = 'running') {}

  add(run: Partial<RunInfo> & { id: string }): RunInfo {
    const info: RunInfo = {
      status: 'running',
      startedMs: Date.now(),
      consumerGroups: {},
      stalenessBound: null,
      ...run,
      config: redact(run.config ?? {}) as Record<string, unknown>,
    };
    this.runs.set(info.id, info);
    return info;
  }

  update(id: string, patch: Partial<Omit<RunInfo, 'id'>>): void {
    const r = this.runs.get(id);
    if (!r) return;
    this.runs.set(id, { ...r, ...patch, ...(patch.config ? { config: redact(patch.config) as Record<string, unknown> } : {}) });
  }

  list(): RunInfo[] {
    return [...this.runs.values()];
  }

  get(id: string): RunInfo | undefined {
    return this.runs.get(id);
  }
}

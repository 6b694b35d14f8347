// Messages between the admin (or CLI) process and its SQL sandbox process (worker.ts), one JSON object a line
// on the child's fd 3. Nothing else crosses: the child starts with an empty environment and is told what to
// read here, so no secret of the parent can reach it by accident.

/** Where the sandbox reads trace data: a snapshot directory of a chDB store, or a ClickHouse server. */
export type SandboxTarget =
  | { kind: 'chdb' }
  /** readonlySetting: send readonly=1 with the query (false for a reader whose profile is read-only itself). */
  | { kind: 'server'; url: string; username?: string; password?: string; readonlySetting: boolean };

export type SandboxRequest =
  | { op: 'init'; target: SandboxTarget; dir: string }
  | { op: 'functions' }
  /** reformat: the tree is of formatQuery's rendering (what then runs), for a server of another version. */
  | { op: 'parse'; sql: string; reformat: boolean }
  | { op: 'run'; sql: string; database: string; settings: Record<string, string> };

export type ToSandbox = SandboxRequest & { id: number };

export type FromSandbox =
  | { id: number; ok: true; value: unknown }
  | { id: number; ok: false; error: string }
  | { id: 0; ok: true; value: 'ready' };

/** One row of system.functions: how the engine names a function and what it is an alias of. */
export interface FunctionInfo {
  name: string;
  aliasTo: string;
  caseInsensitive: boolean;
  isAggregate: boolean;
}

/** What the engine made of a text: its own formatting (proof of a single statement) and its syntax tree. */
export interface Parsed {
  formatted: string;
  ast: string;
}

// The run configuration: one YAML file for both shapes (embedded and distributed). The core sections are
// compiled here; each role compiles its own section (trainer, rollout, reward, ...) at start-up with the same
// rule: every error names the field. Unknown top-level sections are an error, so typos fail fast.
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { parse } from 'yaml';
import { RlstreamError } from './errors.ts';

export type LogConfig =
  | { kind: 'embedded'; dir: string }
  | { kind: 'kafka'; brokers: string[]; clientId: string; ssl: boolean; sasl: { mechanism: string; username: string; password: string } | null };

/** The trace sink's batch (traces.batch_rows, traces.batch_bytes); unset fields take the store's default. */
export interface TraceBatchConfig {
  maxRows?: number;
  maxBytes?: number;
}

export type TracesConfig =
  | { kind: 'chdb'; dir: string; batch: TraceBatchConfig }
  /** username and password: '' when not set (the URL's user:password@, else the server's default user). */
  | { kind: 'clickhouse'; url: string; username: string; password: string; database: string; batch: TraceBatchConfig }
  | { kind: 'none' };

export type RegistryConfig = { kind: 'embedded' } | { kind: 'http'; url: string };

export interface RunSection {
  id: string;
  /** Everything a run writes: log (embedded), checkpoints, weights, traces (chDB), plots. */
  dataDir: string;
  seed: number;
}

export interface RunConfig {
  /** Directory of the config file: relative paths in it resolve from here. */
  baseDir: string;
  run: RunSection;
  log: LogConfig;
  registry: RegistryConfig;
  traces: TracesConfig;
  /** Role sections, compiled by their roles. */
  sections: Record<string, unknown>;
}

const ROLE_SECTIONS = ['admin', 'model', 'task', 'sft', 'rollout', 'policy', 'reward', 'advantage', 'trainer', 'eval', 'tools'] as const;
const CORE_SECTIONS = ['run', 'log', 'registry', 'traces'] as const;

function fail(path: string, msg: string): never {
  throw new RlstreamError('CONFIG_INVALID', `${path} ${msg}`);
}

function mapping(v: unknown, path: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) fail(path, 'must be a mapping');
  return v as Record<string, unknown>;
}

function str(m: Record<string, unknown>, key: string, path: string, fallback?: string): string {
  const v = m[key] ?? fallback;
  if (typeof v !== 'string' || v.length === 0) fail(`${path}.${key}`, 'must be a non-empty string');
  return v;
}

function onlyKeys(m: Record<string, unknown>, keys: string[], path: string): void {
  for (const k of Object.keys(m)) if (!keys.includes(k)) fail(`${path}.${k}`, `is not a known field (known: ${keys.join(', ')})`);
}

const BATCH_KEYS = ['batch_rows', 'batch_bytes'];

function positiveInteger(m: Record<string, unknown>, key: string, path: string): number | undefined {
  const v = m[key];
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) fail(`${path}.${key}`, `must be a positive integer (got ${JSON.stringify(v)})`);
  return v;
}

function traceBatch(m: Record<string, unknown>): TraceBatchConfig {
  const maxRows = positiveInteger(m, 'batch_rows', 'traces');
  const maxBytes = positiveInteger(m, 'batch_bytes', 'traces');
  return { ...(maxRows === undefined ? {} : { maxRows }), ...(maxBytes === undefined ? {} : { maxBytes }) };
}

/** `${VAR}` in a string value is replaced by the environment variable, so secrets stay out of files. */
function env(value: string, path: string): string {
  return value.replace(/\$\{([A-Z0-9_]+)\}/g, (_, name: string) => {
    const v = process.env[name];
    if (v === undefined) fail(path, `refers to environment variable ${name}, which is not set`);
    return v;
  });
}

export function compileRunConfig(raw: unknown, baseDir: string): RunConfig {
  const top = mapping(raw, '(config)');
  onlyKeys(top, [...CORE_SECTIONS, ...ROLE_SECTIONS], '(config)');
  const abs = (p: string) => (isAbsolute(p) ? p : resolve(baseDir, p));

  const runM = mapping(top['run'], 'run');
  onlyKeys(runM, ['id', 'data_dir', 'seed'], 'run');
  const seed = runM['seed'] ?? 1;
  if (typeof seed !== 'number' || !Number.isInteger(seed)) fail('run.seed', 'must be an integer');
  const id = str(runM, 'id', 'run', 'run');
  if (!/^[A-Za-z0-9._-]+$/.test(id)) fail('run.id', 'may hold only letters, digits, ".", "_" and "-"');
  const run: RunSection = { id, dataDir: abs(str(runM, 'data_dir', 'run', '.rlstream/run')), seed };

  const logM = mapping(top['log'], 'log');
  const logKind = logM['kind'] ?? 'embedded';
  let log: LogConfig;
  if (logKind === 'embedded') {
    onlyKeys(logM, ['kind', 'dir'], 'log');
    log = { kind: 'embedded', dir: abs(typeof logM['dir'] === 'string' ? logM['dir'] : `${run.dataDir}/log`) };
  } else if (logKind === 'kafka') {
    onlyKeys(logM, ['kind', 'brokers', 'client_id', 'ssl', 'sasl'], 'log');
    const brokers = logM['brokers'];
    const list = typeof brokers === 'string' ? env(brokers, 'log.brokers').split(',') : brokers;
    if (!Array.isArray(list) || list.length === 0 || !list.every((b) => typeof b === 'string' && /^[^:\s]+:\d+$/.test(b))) fail('log.brokers', 'must be a list of host:port (or a comma-separated string)');
    const saslM = logM['sasl'] === undefined ? null : mapping(logM['sasl'], 'log.sasl');
    log = {
      kind: 'kafka',
      brokers: list as string[],
      clientId: typeof logM['client_id'] === 'string' ? logM['client_id'] : 'rlstream',
      ssl: logM['ssl'] === true,
      sasl: saslM
        ? { mechanism: str(saslM, 'mechanism', 'log.sasl'), username: env(str(saslM, 'username', 'log.sasl'), 'log.sasl.username'), password: env(str(saslM, 'password', 'log.sasl'), 'log.sasl.password') }
        : null,
    };
  } else fail('log.kind', `must be "embedded" or "kafka" (got ${JSON.stringify(logKind)})`);

  const regM = mapping(top['registry'], 'registry');
  const regKind = regM['kind'] ?? 'embedded';
  let registry: RegistryConfig;
  if (regKind === 'embedded') registry = { kind: 'embedded' };
  else if (regKind === 'http') registry = { kind: 'http', url: env(str(regM, 'url', 'registry'), 'registry.url') };
  else fail('registry.kind', 'must be "embedded" or "http"');

  const trM = mapping(top['traces'], 'traces');
  const trKind = trM['kind'] ?? 'chdb';
  let traces: TracesConfig;
  if (trKind === 'chdb') {
    onlyKeys(trM, ['kind', 'dir', ...BATCH_KEYS], 'traces');
    traces = { kind: 'chdb', dir: abs(typeof trM['dir'] === 'string' ? trM['dir'] : `${run.dataDir}/chdb`), batch: traceBatch(trM) };
  } else if (trKind === 'clickhouse') {
    onlyKeys(trM, ['kind', 'url', 'username', 'password', 'database', ...BATCH_KEYS], 'traces');
    traces = {
      kind: 'clickhouse',
      url: env(str(trM, 'url', 'traces'), 'traces.url'),
      username: typeof trM['username'] === 'string' ? env(trM['username'], 'traces.username') : '',
      password: typeof trM['password'] === 'string' ? env(trM['password'], 'traces.password') : '',
      database: typeof trM['database'] === 'string' ? trM['database'] : 'rlstream',
      batch: traceBatch(trM),
    };
  } else if (trKind === 'none') traces = { kind: 'none' };
  else fail('traces.kind', 'must be "chdb", "clickhouse" or "none"');

  const sections: Record<string, unknown> = {};
  for (const k of ROLE_SECTIONS) if (top[k] !== undefined) sections[k] = top[k];
  return Object.freeze({ baseDir, run, log, registry, traces, sections });
}

export function loadRunConfig(path: string, overrides: Record<string, unknown> = {}): RunConfig {
  let raw: unknown;
  try {
    raw = parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new RlstreamError('CONFIG_INVALID', `cannot read config ${path}: ${(err as Error).message}`, { cause: err });
  }
  return compileRunConfig(applyOverrides(raw, overrides), dirname(resolve(path)));
}

/** Dotted overrides from the command line (`--set trainer.max_steps=3`), applied before validation. */
export function applyOverrides(raw: unknown, overrides: Record<string, unknown>): unknown {
  const root = structuredClone(mapping(raw, '(config)'));
  for (const [dotted, value] of Object.entries(overrides)) {
    const parts = dotted.split('.');
    let node: Record<string, unknown> = root;
    for (const p of parts.slice(0, -1)) {
      const child = node[p];
      if (child === undefined || child === null) node[p] = {};
      else if (typeof child !== 'object' || Array.isArray(child)) fail(dotted, `cannot be set: ${p} is not a mapping`);
      node = node[p] as Record<string, unknown>;
    }
    node[parts[parts.length - 1]!] = value;
  }
  return root;
}

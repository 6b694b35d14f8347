// `rlstream query`: SQL over the traces (read-only, limited by ClickHouse settings), named queries for the
// common questions, and one trajectory rendered turn by turn. Which traces: see cli/traces-source.ts.
import type { Command } from 'commander';
import { RlstreamError } from '../../core/errors.ts';
import { numberOption } from '../options.ts';
import { listNamedQueries } from '../../core/traces/queries.ts';
import { AdminApiSource, openTraceSource, resolveTraces } from '../traces-source.ts';
import { renderTable, renderTrajectory } from '../../core/traces/render.ts';
import type { QueryResult } from '../../core/traces/store.ts';

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

function parseParams(pairs: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const eq = p.indexOf('=');
    if (eq <= 0) throw new RlstreamError('INPUT_INVALID', `--param wants k=v, got ${JSON.stringify(p)}`);
    out[p.slice(0, eq)] = p.slice(eq + 1);
  }
  return out;
}

function print(result: QueryResult, format: string): void {
  if (format === 'json') process.stdout.write(JSON.stringify(result.rows, null, 1) + '\n');
  else process.stdout.write(renderTable(result) + '\n');
}

export function register(program: Command): void {
  program
    .command('query')
    .description('query the traces: SQL (read-only), --named <name> [--param k=v], --list, --trajectory <id>')
    .argument('[sql]', 'a SELECT over the trace tables')
    .option('--format <format>', 'table or json', 'table')
    .option('--store <target>', 'a run directory, chdb:<dir> or a ClickHouse http(s) URL (#database suffix optional); default RLSTREAM_TRACES, CLICKHOUSE_URL, else the newest run under .rlstream/')
    .option('--named <name>', 'run a named query')
    .option('--param <k=v>', 'named query parameter (repeatable)', collect, [])
    .option('--list', 'list the named queries and their parameters')
    .option('--trajectory <id>', 'render one trajectory turn by turn')
    .option('--max-rows <n>', 'result row limit (enforced by ClickHouse)', numberOption('--max-rows', { integer: true, min: 1 }), 10000)
    .option('--max-seconds <n>', 'execution time limit (enforced by ClickHouse)', numberOption('--max-seconds', { min: 0.001 }), 30)
    .action(async (sql: string | undefined, o: { format: string; store?: string; named?: string; param: string[]; list?: boolean; trajectory?: string; maxRows: number; maxSeconds: number }) => {
      if (o.format !== 'table' && o.format !== 'json') throw new RlstreamError('INPUT_INVALID', `--format must be table or json, got ${o.format}`);
      if (o.list) {
        for (const q of listNamedQueries()) {
          const params = q.params.map((p) => `${p.name}:${p.type}${p.default !== undefined ? `=${JSON.stringify(p.default)}` : ' (required)'}`).join(', ');
          process.stdout.write(`${q.name}${params ? `  [${params}]` : ''}\n  ${q.description}\n`);
        }
        return;
      }
      const limits = { maxRows: o.maxRows, maxSeconds: o.maxSeconds, overflow: 'throw' as const };
      if (!o.trajectory && !o.named && !sql) throw new RlstreamError('INPUT_INVALID', 'give a SQL query, --named <name>, --list or --trajectory <id>');
      const resolved = resolveTraces(o.store);
      if (resolved.note) process.stderr.write(`rlstream query: ${resolved.note}\n`);
      const store = await openTraceSource(resolved);
      if (store instanceof AdminApiSource) process.stderr.write(`rlstream query: the run is live (its chDB store is locked): reading through ${store.target}\n`);
      try {
        if (o.trajectory) {
          const params = parseParams(o.param);
          process.stdout.write((await renderTrajectory(store, o.trajectory, params['run'] ? { run: params['run'] } : {})) + '\n');
        } else if (o.named) {
          print(await store.runNamed(o.named, parseParams(o.param), limits), o.format);
        } else if (sql) {
          print(await store.queryReadonly(sql, limits), o.format);
        } else {
          throw new RlstreamError('INPUT_INVALID', 'give a SQL query, --named <name>, --list or --trajectory <id>');
        }
      } finally {
        await store.close();
      }
    });
}

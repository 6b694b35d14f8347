// Versioned DDL migrations: infra/clickhouse/migrations/NNNN_name.sql (current ClickHouse) with an optional
// NNNN_name.compat-18.sql variant for ClickHouse 18.16. Applied in order at start-up; each applied version is
// recorded in schema_migrations, and every statement is written to be re-runnable (IF NOT EXISTS), so a crash
// half-way through a migration or two processes migrating at once leave a correct schema.
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createHash } from 'node:crypto';
import { RlstreamError } from '../errors.ts';
import { quoteString } from './sql.ts';
import type { Dialect, MigrationReport, QueryResult } from './store.ts';

const MIGRATIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'infra', 'clickhouse', 'migrations');

export interface Migration {
  version: number;
  name: string;
  file: string;
  statements: string[];
  checksum: string;
}

/** Split a migration file into statements: `;` at the end of a line ends one; `--` comment lines dropped. */
export function splitStatements(text: string): string[] {
  const lines = text.split('\n').filter((l) => !/^\s*--/.test(l));
  return lines
    .join('\n')
    .split(/;\s*(?:\n|$)/)
    .map((s) => s.trim())
    .filter((s) => s !== '');
}

/** The migrations for a dialect, in version order. */
export function loadMigrations(dialect: Dialect, dir = MIGRATIONS_DIR): Migration[] {
  const files = readdirSync(dir);
  const base = files.filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort();
  const seen = new Set<number>();
  return base.map((file) => {
    const version = Number(file.slice(0, 4));
    if (seen.has(version)) throw new RlstreamError('CONFIG_INVALID', `two migrations share version ${version} in ${dir}`);
    seen.add(version);
    const compat = file.replace(/\.sql$/, '.compat-18.sql');
    const chosen = dialect === 'compat-18' && files.includes(compat) ? compat : file;
    const text = readFileSync(join(dir, chosen), 'utf8');
    return {
      version,
      name: file.slice(5, -4),
      file: chosen,
      statements: splitStatements(text),
      checksum: createHash('sha256').update(text).digest('hex').slice(0, 16),
    };
  });
}

export interface MigrationTarget {
  dialect: Dialect;
  /** The database the migrations create their tables in. */
  database: string;
  exec(sql: string): Promise<void>;
  query(sql: string): Promise<QueryResult>;
}

// No DateTime64 and no LowCardinality here: the bookkeeping table is the same on every dialect.
const BOOKKEEPING = `CREATE TABLE IF NOT EXISTS schema_migrations (
  version UInt32, name String, file String, checksum String, dialect String, applied_at DateTime
) ENGINE = MergeTree ORDER BY version`;

/** The engine's own databases: a store may read them (migrate: false), never create its tables there. */
const ENGINE_DATABASES = new Set(['system', 'information_schema']);

export async function applyMigrations(target: MigrationTarget, dir = MIGRATIONS_DIR): Promise<MigrationReport> {
  if (ENGINE_DATABASES.has(target.database.toLowerCase())) {
    throw new RlstreamError('CONFIG_INVALID', `trace tables cannot go into ClickHouse's own database ${JSON.stringify(target.database)}: name another database`);
  }
  await target.exec(BOOKKEEPING);
  const done = new Set((await target.query('SELECT DISTINCT version FROM schema_migrations')).rows.map((r) => Number(r['version'])));
  const report: MigrationReport = { dialect: target.dialect, applied: [], skipped: [] };
  for (const m of loadMigrations(target.dialect, dir)) {
    const label = `${String(m.version).padStart(4, '0')}_${m.name}`;
    if (done.has(m.version)) {
      report.skipped.push(label);
      continue;
    }
    for (const stmt of m.statements) {
      try {
        await target.exec(stmt);
      } catch (err) {
        throw new RlstreamError('TRACE_STORE', `migration ${m.file} failed at: ${stmt.slice(0, 80)}…: ${(err as Error).message.split('\n')[0]}`, { cause: err });
      }
    }
    await target.exec(
      `INSERT INTO schema_migrations (version, name, file, checksum, dialect, applied_at) VALUES (${m.version}, ${quoteString(m.name)}, ${quoteString(m.file)}, ${quoteString(m.checksum)}, ${quoteString(target.dialect)}, now())`,
    );
    report.applied.push(label);
  }
  return report;
}

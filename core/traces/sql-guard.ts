// The guard in front of untrusted SQL (the admin SQL route, `rlstream query`, scripts): both stores'
// queryReadonly apply it before the engine sees the text, and the engine then runs it with readonly=1 and
// the limits as settings (core/traces/store.ts limitSettings). The engine refuses writes, DDL, SET, SETTINGS
// and most table functions by itself; the guard refuses what readonly=1 still lets through (checked on chDB
// 26.7 and ClickHouse 18.16):
// - the scalar `file(path)`: chDB runs as clickhouse-local, which skips the user_files_path check, so it reads
//   any file the process can (/etc/passwd, /proc/self/environ, a run's admin-url) and no setting turns it off;
// - other functions that reach outside the trace tables: table functions over files, URLs, other servers or
//   processes (refused again by name, in case an engine version allows one in readonly mode), server settings,
//   macros, dictionaries, disks;
// - `system.*` tables other than the few that hold no host detail (system.settings, disks, parts, tables and
//   processes show paths, settings and other sessions' queries);
// - `... INTO OUTFILE 'path'` (chDB writes the file on this host) and FORMAT clauses (the stores parse JSON);
// - any statement but SELECT / WITH / EXPLAIN / DESCRIBE / EXISTS / SHOW TABLES|COLUMNS|CREATE|DATABASES
//   (KILL QUERY is allowed in readonly mode and would stop the trace sink's inserts);
// - several statements in one text (chDB would run each).
// The text is tokenised the way ClickHouse's lexer reads it: literals and comments never trip a check, and a
// quoted identifier counts as the name it spells (`"file"('/etc/passwd')` is a call of file).
import { RlstreamError } from '../errors.ts';

type Token = { kind: 'word'; text: string; quoted: boolean } | { kind: 'punct'; text: string } | { kind: 'literal' };

/** Statements the route accepts, by their first word. */
const STATEMENTS = new Set(['select', 'with', 'explain', 'describe', 'desc', 'exists', 'show']);
/** First words of the other ClickHouse statements: each is refused rather than called a syntax error. */
const STATEMENT_VERBS = /^(insert|create|drop|alter|set|kill|system|truncate|rename|optimize|grant|revoke|use|detach|attach|exchange|undrop|delete|update|backup|restore|check|watch|move|begin|commit|rollback|replace|set_role|execute)$/i;
/** What may follow SHOW: the catalogue of the trace tables, nothing about sessions, settings or access. */
const SHOW_WHAT = new Set(['tables', 'columns', 'create', 'databases']);
/** What SHOW CREATE must not show: access entities. */
const SHOW_CREATE_NOT = /^(user|users|role|roles|quota|quotas|row|policy|policies|settings|profile|profiles)$/;

/** Functions refused by name (case-insensitive): they read files, URLs, other servers, processes or server state. */
const FUNCTIONS = new Set(
  [
    'file', 'fileCluster', 'filesystem', 'filesystemAvailable', 'filesystemCapacity', 'filesystemUnreserved',
    'url', 'urlCluster', 'gcs', 'oss', 'cosn', 'input', 'executable', 'eval', 'jdbc', 'odbc', 'mysql',
    'postgresql', 'sqlite', 'mongodb', 'redis', 'ytsaurus', 'dictionary', 'merge', 'remote', 'remoteSecure',
    'cluster', 'clusterAllReplicas', 'arrowstream', 'loop', 'catboostEvaluate', 'modelEvaluate', 'getSetting',
    'getSettingOrDefault', 'getServerSetting', 'getMergeTreeSetting', 'getMacro', 'getClientHTTPHeader',
    'getOSKernelVersion', 'getServerPort', 'joinGet', 'joinGetOrNull', 'fuzzQuery', 'fuzzJSON',
  ].map((n) => n.toLowerCase()),
);
/** Families of table functions over object stores, lakes and time-series servers. */
const FUNCTION_FAMILIES = /^(s3|hdfs|azure|iceberg|deltalake|hudi|paimon|prometheus|timeseries|mergetree|dictget|dicthas|dictisin)/i;
/** system tables that show no paths, settings, sessions or queries. */
const SYSTEM_TABLES = new Set(['one', 'numbers', 'numbers_mt', 'zeros', 'zeros_mt', 'columns', 'functions', 'table_functions', 'data_type_families', 'formats', 'time_zones']);
/** Words after which FORMAT is a column name (`SELECT format, …`) rather than a FORMAT clause. */
const BEFORE_FORMAT_COLUMN = new Set(['select', 'distinct', ',', '(', '.']);

class Refusal extends Error {}

/**
 * Why untrusted SQL may not run: 'refused' for what would reach outside the trace tables or change state,
 * 'unsupported' for clauses that are harmless but that the stores cannot answer (FORMAT: results are JSON).
 */
export interface SqlVerdict {
  kind: 'refused' | 'unsupported';
  why: string;
}

/** The tokens of a SQL text; throws Refusal on what cannot be read safely. */
function tokenize(sql: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < sql.length) {
    const c = sql[i]!;
    const next = sql[i + 1];
    if (/\s/.test(c)) {
      i++;
    } else if ((c === '-' && next === '-') || (c === '#' && (next === ' ' || next === '!'))) {
      const end = sql.indexOf('\n', i);
      i = end < 0 ? sql.length : end;
    } else if (c === '/' && next === '*') {
      const end = sql.indexOf('*/', i + 2);
      i = end < 0 ? sql.length : end + 2;
    } else if (c === "'" || c === '"' || c === '`') {
      let j = i + 1;
      let body = '';
      let escaped = false;
      for (; j < sql.length; j++) {
        const d = sql[j]!;
        if (d === '\\') {
          escaped = true;
          body += sql[j + 1] ?? '';
          j++;
        } else if (d === c && sql[j + 1] === c) {
          body += c;
          j++;
        } else if (d === c) {
          break;
        } else {
          body += d;
        }
      }
      if (j >= sql.length) throw new Refusal(`unterminated ${c === "'" ? 'string' : 'quoted name'}`);
      // A quoted name is the name it spells; escapes (\x66ile) could spell any name, so they are not read.
      if (c !== "'" && escaped) throw new Refusal('backslash escapes in a quoted name');
      out.push(c === "'" ? { kind: 'literal' } : { kind: 'word', text: body, quoted: true });
      i = j + 1;
    } else if (/[A-Za-z_\u0080-\uffff]/.test(c)) {
      let j = i + 1;
      while (j < sql.length && /[A-Za-z0-9_\u0080-\uffff]/.test(sql[j]!)) j++;
      out.push({ kind: 'word', text: sql.slice(i, j), quoted: false });
      i = j;
    } else if (/[0-9]/.test(c)) {
      // Only the number itself: letters after it are a word of their own, as ClickHouse's lexer reads them.
      const m = /^(0x[0-9a-f]+|0b[01]+|\d+(\.\d*)?(e[+-]?\d+)?)/i.exec(sql.slice(i, i + 400))!;
      out.push({ kind: 'literal' });
      i += m[0].length;
    } else {
      out.push({ kind: 'punct', text: c });
      i++;
    }
  }
  return out;
}

const lower = (t: Token | undefined): string => (t && t.kind !== 'literal' ? t.text.toLowerCase() : '');
const isKeyword = (t: Token | undefined, word: string): boolean => t?.kind === 'word' && !t.quoted && t.text.toLowerCase() === word;

function check(tokens: Token[]): SqlVerdict | null {
  const why = refusal(tokens);
  if (why) {
    // A word that starts no ClickHouse statement is a typo (400), not an attempt the route refuses (403).
    const verb = tokens.find((t) => !(t.kind === 'punct' && t.text === '('));
    if (why.startsWith('only ') && !(verb?.kind === 'word' && STATEMENT_VERBS.test(verb.text))) return { kind: 'unsupported', why };
    return { kind: 'refused', why };
  }
  for (let k = 0; k < tokens.length; k++) {
    const t = tokens[k]!;
    const next = tokens[k + 1];
    if (isKeyword(t, 'format') && next?.kind === 'word' && !BEFORE_FORMAT_COLUMN.has(lower(tokens[k - 1]))) {
      return { kind: 'unsupported', why: `FORMAT clauses are not accepted (results are always JSON), got FORMAT ${next.text}` };
    }
  }
  return null;
}

function refusal(tokens: Token[]): string | null {
  // One statement per request (a trailing semicolon is allowed): chDB would run each of several.
  const semi = tokens.findIndex((t) => t.kind === 'punct' && t.text === ';');
  if (semi >= 0 && semi < tokens.length - 1) return 'several statements in one query';
  let first = 0;
  while (tokens[first]?.kind === 'punct' && (tokens[first] as { text: string }).text === '(') first++;
  const verb = tokens[first];
  if (!verb || verb.kind !== 'word' || verb.quoted || !STATEMENTS.has(verb.text.toLowerCase())) {
    return `only SELECT, WITH, EXPLAIN, DESCRIBE, EXISTS and SHOW TABLES|COLUMNS|CREATE|DATABASES are accepted, not ${lower(verb).toUpperCase() || 'this'}`;
  }
  if (lower(verb) === 'show') {
    const at = lower(tokens[first + 1]) === 'full' ? first + 2 : first + 1;
    const what = lower(tokens[at]);
    if (!SHOW_WHAT.has(what) || (what === 'create' && SHOW_CREATE_NOT.test(lower(tokens[at + 1])))) {
      return `SHOW ${tokens.slice(first + 1, at + 2).map(lower).join(' ').toUpperCase()} shows more than the trace tables`;
    }
  }
  for (let k = 0; k < tokens.length; k++) {
    const t = tokens[k]!;
    if (t.kind !== 'word') continue;
    const name = t.text.toLowerCase();
    const next = tokens[k + 1];
    if (next?.kind === 'punct' && next.text === '(' && (FUNCTIONS.has(name) || FUNCTION_FAMILIES.test(name))) {
      return `function ${t.text}() reads outside the trace tables`;
    }
    if (name === 'system' && next?.kind === 'punct' && next.text === '.') {
      const table = lower(tokens[k + 2]);
      if (!SYSTEM_TABLES.has(table)) return `system.${table} is not readable here (only ${[...SYSTEM_TABLES].map((s) => `system.${s}`).join(', ')})`;
    }
    if (t.quoted) continue;
    if (name === 'into') return isKeyword(next, 'outfile') ? 'INTO OUTFILE writes a file' : 'INTO clauses are not accepted';
    if (name === 'kill') return 'KILL stops queries';
  }
  return null;
}

/** Why untrusted SQL must not run, or null when it may run (under readonly=1 and the limits). */
export function readonlySqlVerdict(sql: string): SqlVerdict | null {
  try {
    return check(tokenize(sql));
  } catch (err) {
    if (err instanceof Refusal) return { kind: 'refused', why: err.message };
    throw err;
  }
}

/** The reason of readonlySqlVerdict, or null. */
export function readonlySqlRefusal(sql: string): string | null {
  return readonlySqlVerdict(sql)?.why ?? null;
}

/** The SQL with string literals, quoted identifiers and comments replaced by spaces. */
export function blankLiteralsAndComments(sql: string): string {
  let out = '';
  let i = 0;
  while (i < sql.length) {
    const c = sql[i]!;
    const next = sql[i + 1];
    if (c === '-' && next === '-') {
      const end = sql.indexOf('\n', i);
      i = end < 0 ? sql.length : end;
      out += ' ';
    } else if (c === '/' && next === '*') {
      const end = sql.indexOf('*/', i + 2);
      i = end < 0 ? sql.length : end + 2;
      out += ' ';
    } else if (c === "'" || c === '"' || c === '`') {
      let j = i + 1;
      while (j < sql.length && sql[j] !== c) j += sql[j] === '\\' ? 2 : 1;
      i = j + 1;
      out += ' ';
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

/** Throws TRACE_STORE (as the engine's own read-only refusals do) for SQL the guard refuses. */
export function guardReadonlySql(sql: string): void {
  const why = readonlySqlRefusal(sql);
  if (why) throw new RlstreamError('TRACE_STORE', `read-only query refused: ${why}`);
}

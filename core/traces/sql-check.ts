// Layer 1 of untrusted SQL: the check of what the engine itself parsed. The sandbox's engine returns its own
// formatting of the text (formatQuery, which parses exactly one statement) and its syntax tree (EXPLAIN AST);
// this module reads that tree and allows, never denies:
// - node kinds: those of SELECT / UNION / INTERSECT / WITH / JOIN / ARRAY JOIN / window queries, EXPLAIN of
//   them, DESCRIBE, EXISTS, SHOW TABLES|COLUMNS|CREATE TABLE of the trace database; an unknown kind is refused
//   (SETTINGS is the kind `Set`, SET/USE/INSERT/KILL/SYSTEM … are statements of other kinds);
// - a SELECT's top node with anything but its one list of selects (INTO OUTFILE and FORMAT are extra children);
// - functions by canonical name from sql-functions.ts (aliases resolved with the engine's system.functions,
//   aggregate combinators taken off), with plain names only;
// - table functions: numbers/zeros with integer literals; tables: any unqualified name (a WITH name, or a table
//   of the trace database, where the query runs), `<trace db>.x`, and a few `system` tables that describe the
//   engine, not the host.
// The sandbox (sandbox/) runs the text only after this passed; it would hold if this had a hole.
import { RlstreamError } from '../errors.ts';
import { ALLOWED_FUNCTIONS } from './sql-functions.ts';
import type { FunctionInfo, Parsed } from './sandbox/protocol.ts';

export type FunctionCatalogue = ReadonlyMap<string, FunctionInfo>;

/**
 * A query refused before it ran: 'refused' for what reaches outside the trace tables or changes state (the
 * admin's 403), 'unsupported' for harmless clauses the stores cannot answer (FORMAT: results are JSON; 400).
 */
export class SqlRefusedError extends RlstreamError {
  constructor(
    readonly kind: 'refused' | 'unsupported',
    readonly why: string,
  ) {
    super('TRACE_STORE', `read-only query ${kind === 'refused' ? 'refused' : 'not supported'}: ${why}`);
  }
}

/** Node kinds of the trees the route answers; the comment of each says what it is. */
const NODE_KINDS = new Set([
  'SelectWithUnionQuery', 'SelectIntersectExceptQuery', 'SelectQuery', 'ExpressionList', 'Function', 'Identifier', 'Literal',
  'TablesInSelectQuery', 'TablesInSelectQueryElement', 'TableExpression', 'TableIdentifier', 'Subquery', 'TableJoin', 'ArrayJoin',
  'Asterisk', 'QualifiedAsterisk', 'ColumnsRegexpMatcher', 'ColumnsListMatcher', 'QualifiedColumnsRegexpMatcher', 'QualifiedColumnsListMatcher',
  'ColumnsTransformerList', 'ColumnsExceptTransformer', 'ColumnsReplaceTransformer', 'ColumnsReplaceTransformer::Replacement',
  'OrderByElement', 'WindowDefinition', 'WindowListElement', 'WithElement', 'SampleRatio', 'InterpolateElement',
  'Explain', 'DescribeQuery', 'ShowTables', 'ShowColumns', 'ShowCreateTableQuery', 'ExistsTableQuery',
]);
/** What may follow EXPLAIN (each explains a statement that is itself checked). */
const EXPLAIN_KINDS = new Set(['EXPLAIN', 'EXPLAIN AST', 'EXPLAIN SYNTAX', 'EXPLAIN PLAN', 'EXPLAIN PIPELINE', 'EXPLAIN ESTIMATE', 'EXPLAIN QUERY TREE']);
/** Table functions that read nothing: generators, with integer literal arguments (the row limits bound them). */
const TABLE_FUNCTIONS = new Set(['numbers', 'numbers_mt', 'zeros', 'zeros_mt']);
/** system tables that describe the engine, not the host, its settings, its sessions or other databases. */
export const SYSTEM_TABLES = new Set(['one', 'numbers', 'numbers_mt', 'zeros', 'zeros_mt', 'functions', 'table_functions', 'data_type_families', 'formats', 'time_zones']);
/** Functions whose second argument may be a table by name (`x IN db.table`). */
const IN_FUNCTIONS = /^(global)?(not)?(null)?in$/i;
/** Aggregate combinators (suffixes), tried longest first. */
const COMBINATORS = ['SimpleState', 'OrDefault', 'Resample', 'Distinct', 'ForEach', 'OrNull', 'ArgMin', 'ArgMax', 'Merge', 'State', 'Array', 'Map', 'If'];

const PLAIN = /^[A-Za-z_][A-Za-z0-9_]*$/;

interface Node {
  kind: string;
  /** The rest of the line: name, alias and child count as the engine printed them. */
  rest: string;
  children: Node[];
}

/** Undoes TabSeparated escaping (one tree line per row). */
function unescapeTsv(s: string): string {
  return s.replace(/\\(.)/g, (_m, c: string) => ({ n: '\n', t: '\t', r: '\r', b: '\b', f: '\f', '0': '\0' })[c] ?? c);
}

/** The tree of EXPLAIN AST's output (one space of indent per level). */
export function parseAstText(text: string): Node {
  const lines = text.split('\n').filter((l) => l !== '');
  const roots: Node[] = [];
  const stack: { depth: number; node: Node }[] = [];
  for (const raw of lines) {
    const depth = raw.length - raw.trimStart().length;
    const line = unescapeTsv(raw.slice(depth));
    const sp = line.indexOf(' ');
    const node: Node = { kind: sp < 0 ? line : line.slice(0, sp), rest: sp < 0 ? '' : line.slice(sp + 1), children: [] };
    while (stack.length && stack[stack.length - 1]!.depth >= depth) stack.pop();
    const parent = stack[stack.length - 1];
    if (parent) {
      if (depth !== parent.depth + 1) throw new SqlRefusedError('refused', 'the engine printed a tree this check cannot read');
      parent.node.children.push(node);
    } else {
      if (depth !== 0) throw new SqlRefusedError('refused', 'the engine printed a tree this check cannot read');
      roots.push(node);
    }
    stack.push({ depth, node });
  }
  if (roots.length !== 1) throw new SqlRefusedError('refused', `the engine printed ${roots.length} trees for one statement`);
  return roots[0]!;
}

/** `name[ (alias a)][ (children n)]` of a Function or TableIdentifier line; null when the name is not plain. */
function nameOf(rest: string, dotted: boolean): string | null {
  const m = /^(\S+)( \(alias .*\))?( \(children \d+\))?$/s.exec(rest);
  if (!m) return null;
  const name = m[1]!;
  const parts = name.split('.');
  if (parts.length > (dotted ? 2 : 1) || !parts.every((p) => PLAIN.test(p))) return null;
  return name;
}

class Checker {
  constructor(
    private readonly functions: FunctionCatalogue,
    private readonly database: string,
  ) {}

  private resolve(name: string): FunctionInfo | undefined {
    const exact = this.functions.get(name);
    if (exact) return exact;
    const lower = name.toLowerCase();
    for (const f of this.functions.values()) if (f.caseInsensitive && f.name.toLowerCase() === lower) return f;
    return undefined;
  }

  /** The canonical name of an allowed function, or null. */
  private allowed(name: string, depth = 0): boolean {
    if (name === 'lambda') return true;
    const info = this.resolve(name);
    if (info) return ALLOWED_FUNCTIONS.has(info.aliasTo || info.name);
    if (depth > 3) return false;
    // An aggregate with a combinator (sumIf, uniqArrayIf, …) is the aggregate it combines.
    for (const c of COMBINATORS) {
      if (name.length > c.length && name.endsWith(c)) {
        const base = name.slice(0, -c.length);
        const baseInfo = this.resolve(base);
        if (baseInfo ? baseInfo.isAggregate && ALLOWED_FUNCTIONS.has(baseInfo.aliasTo || baseInfo.name) : this.allowed(base, depth + 1)) return true;
      }
    }
    return false;
  }

  table(name: string | null): void {
    if (name === null) throw new SqlRefusedError('refused', 'a table name that is not a plain name');
    const dot = name.indexOf('.');
    if (dot < 0) return;
    const db = name.slice(0, dot);
    const table = name.slice(dot + 1);
    if (db === this.database) return;
    if (db === 'system' && SYSTEM_TABLES.has(table)) return;
    throw new SqlRefusedError('refused', `table ${name} is outside the trace database (readable: ${this.database}.*, ${[...SYSTEM_TABLES].map((t) => `system.${t}`).join(', ')})`);
  }

  node(n: Node, parent: Node | null): void {
    if (!NODE_KINDS.has(n.kind)) {
      if (n.kind === 'Set') throw new SqlRefusedError('refused', 'SETTINGS clauses are not accepted (the limits are fixed)');
      throw new SqlRefusedError('refused', `${n.kind} is not a statement or clause this route runs`);
    }
    switch (n.kind) {
      case 'SelectWithUnionQuery':
        // One child, the list of selects; INTO OUTFILE (a literal and options) and FORMAT (an identifier) are more.
        if (n.children.length !== 1) {
          const format = n.children.length === 2 && n.children[1]!.kind === 'Identifier';
          if (format) throw new SqlRefusedError('unsupported', `FORMAT clauses are not accepted (results are always JSON), got FORMAT ${n.children[1]!.rest}`);
          throw new SqlRefusedError('refused', 'INTO OUTFILE and other clauses after the query are not accepted');
        }
        break;
      case 'Function': {
        const name = nameOf(n.rest, false);
        if (name === null) throw new SqlRefusedError('refused', `a function whose name is not a plain name (${JSON.stringify(n.rest.slice(0, 80))})`);
        if (parent?.kind === 'TableExpression') {
          if (!TABLE_FUNCTIONS.has(name)) throw new SqlRefusedError('refused', `table function ${name}() is not allowed (only ${[...TABLE_FUNCTIONS].join(', ')})`);
          const args = n.children[0]?.children ?? [];
          if (!args.every((a) => a.kind === 'Literal' && /^U?Int\d*_\d+$/.test(a.rest))) throw new SqlRefusedError('refused', `table function ${name}() takes integer literals only`);
          return;
        }
        if (!this.allowed(name)) throw new SqlRefusedError('refused', `function ${name}() is not on the reviewed list of functions`);
        if (IN_FUNCTIONS.test(name)) {
          const right = n.children[0]?.children[1];
          if (right?.kind === 'Identifier') this.table(nameOf(right.rest, true));
        }
        break;
      }
      case 'TableIdentifier':
        this.table(nameOf(n.rest, true));
        break;
      case 'Explain':
        if (!EXPLAIN_KINDS.has(n.rest.replace(/ \(children \d+\)$/, ''))) throw new SqlRefusedError('refused', `${n.rest} is not accepted`);
        break;
    }
    for (const c of n.children) this.node(c, n);
  }
}

/** Statements checked on the engine's own formatting, which names what the tree does not show. */
function checkShow(root: Node, formatted: string, database: string, checker: Checker): void {
  const ident = '([A-Za-z_][A-Za-z0-9_]*)';
  const like = `( (NOT )?I?LIKE '[^'\\\\]*')?`;
  const patterns: Record<string, RegExp> = {
    ShowTables: new RegExp(`^SHOW TABLES( FROM ${database})?${like}$`),
    ShowColumns: new RegExp(`^SHOW COLUMNS FROM ${ident}( FROM ${ident})?${like}$`),
    ShowCreateTableQuery: new RegExp(`^SHOW CREATE TABLE (${ident}\\.)?${ident}$`),
    ExistsTableQuery: new RegExp(`^EXISTS TABLE (${ident}\\.)?${ident}$`),
  };
  const re = patterns[root.kind];
  if (!re) return;
  const m = re.exec(formatted);
  if (!m) throw new SqlRefusedError('refused', `only SHOW TABLES, SHOW COLUMNS, SHOW CREATE TABLE and EXISTS TABLE of the trace tables are accepted, not ${formatted.slice(0, 100)}`);
  if (root.kind === 'ShowColumns') checker.table(m[3] ? `${m[3]}.${m[1]}` : m[1]!);
  if (root.kind === 'ShowCreateTableQuery' || root.kind === 'ExistsTableQuery') checker.table(m[2] ? `${m[2]}.${m[3]}` : m[3]!);
}

/** Throws SqlRefusedError unless the parsed statement is allowed; see the module comment. */
export function checkParsed(parsed: Parsed, functions: FunctionCatalogue, database: string): void {
  const root = parseAstText(parsed.ast);
  const checker = new Checker(functions, database);
  if (!['SelectWithUnionQuery', 'Explain', 'DescribeQuery', 'ShowTables', 'ShowColumns', 'ShowCreateTableQuery', 'ExistsTableQuery'].includes(root.kind)) {
    throw new SqlRefusedError('refused', `only SELECT, WITH, EXPLAIN, DESCRIBE, EXISTS TABLE and SHOW TABLES|COLUMNS|CREATE TABLE are accepted, not ${root.kind}`);
  }
  checkShow(root, parsed.formatted.trim(), database, checker);
  checker.node(root, null);
}

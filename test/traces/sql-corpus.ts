// An adversarial corpus of untrusted SQL: spellings of forbidden queries, generated (every Unicode quote and
// space character ClickHouse's lexer accepts, comments, case, escapes, heredocs) and hand-written (aliases,
// WITH/lambda/arrayMap hiding a call, EXPLAIN/DESCRIBE around one, INTO OUTFILE, hidden semicolons, settings).
// Each entry must be refused or return only trace data (sql-corpus.test.ts, test/admin/sql.test.ts).

/** Quote pairs ClickHouse reads as quoted names (and, for the single ones, as strings). */
const QUOTES: [string, string][] = [['"', '"'], ['`', '`'], ['\u201c', '\u201d'], ['\u2018', '\u2019'], ['\u00ab', '\u00bb'], ['\u201e', '\u201c'], ['\uff02', '\uff02']];
/** White space between a name and its parenthesis: ASCII and every Unicode space a lexer might skip. */
const SPACES = ['\t', '\n', '\r', '\v', '\f', '\u0085', '\u00a0', '\u1680', '\u2000', '\u2001', '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009', '\u200a', '\u200b', '\u2028', '\u2029', '\u202f', '\u205f', '\u3000', '\ufeff'];
const COMMENTS = ['/**/', '/* x */', '/* /* */ */', "/* /* */ ' */", '--\n', '-- x\n', '#!\n', '# x\n'];
const CASES = ['file', 'FILE', 'File', 'fIlE'];

export interface Probe {
  sql: string;
  /** What it tries. */
  what: string;
}

/** The corpus; `secret` and `outfile` are paths the probes try to read and write. */
export function corpus(secret: string, outfile: (i: number) => string): Probe[] {
  const out: Probe[] = [];
  const call = (name: string) => `${name}('${secret}')`;
  for (const [open, close] of QUOTES) {
    out.push({ sql: `SELECT ${open}file${close}('${secret}')`, what: `file() quoted ${open}${close}` });
    out.push({ sql: `SELECT ${open}file${close} ('/proc/self/environ')`, what: `file() quoted ${open}${close} and a space` });
    out.push({ sql: `SELECT ${open}'${close} AS a, ${call('file')} -- '`, what: `a ${open}${close}-quoted text hiding a quote` });
    out.push({ sql: `SELECT * FROM ${open}system${close}.${open}settings${close}`, what: `system.settings quoted ${open}${close}` });
  }
  for (const [i, sp] of SPACES.entries()) {
    out.push({ sql: `SELECT file${sp}('${secret}')`, what: `file() after space U+${sp.codePointAt(0)!.toString(16)}` });
    out.push({ sql: `SELECT${sp}file('/proc/self/environ')${sp}`, what: `space U+${sp.codePointAt(0)!.toString(16)} around the call` });
    out.push({ sql: `SELECT * FROM system${sp}.settings`, what: `system.settings with U+${sp.codePointAt(0)!.toString(16)}` });
    out.push({ sql: `SELECT 1${sp}INTO${sp}OUTFILE '${outfile(1000 + i)}'`, what: `INTO OUTFILE with U+${sp.codePointAt(0)!.toString(16)}` });
  }
  for (const c of COMMENTS) {
    out.push({ sql: `SELECT file${c}('${secret}')`, what: `file() then the comment ${JSON.stringify(c)}` });
    out.push({ sql: `SELECT ${c} file('${secret}') -- '`, what: `the comment ${JSON.stringify(c)} then file()` });
    out.push({ sql: `SELECT 1 ${c} ; SELECT ${call('file')}`, what: `a second statement after ${JSON.stringify(c)}` });
  }
  for (const name of CASES) {
    out.push({ sql: `SELECT ${call(name)}`, what: `${name}()` });
    out.push({ sql: `SELECT * FROM ${name}('${secret}', 'LineAsString')`, what: `table function ${name}()` });
    out.push({ sql: `SELECT length(arrayJoin([${call(name)}]))`, what: `${name}() inside calls` });
  }
  for (const tag of ['', 't', 'abc', 'a_1']) {
    const h = `$${tag}$`;
    out.push({ sql: `SELECT ${h}'${h} AS a, ${call('file')} -- '`, what: `heredoc ${h} hiding a quote` });
    out.push({ sql: `SELECT ${h};${h} AS a; SELECT ${call('file')}`, what: `heredoc ${h} hiding a semicolon` });
    out.push({ sql: `SELECT a FROM (SELECT ${h}X${h} AS a, ${h}'${h} AS b) INTO OUTFILE '${outfile(2000 + tag.length)}' TRUNCATE FORMAT RawBLOB -- '`, what: `INTO OUTFILE behind heredoc ${h}` });
    out.push({ sql: `SELECT ${h}/*${h} AS a, ${call('file')} -- */`, what: `heredoc ${h} hiding a comment opener` });
  }
  for (const esc of ['fi\\x6ce', 'fi\\u006ce', 'f\\ile', 'fil\\145']) {
    out.push({ sql: `SELECT \`${esc}\`('${secret}')`, what: `escape ${esc} in a backquoted name` });
    out.push({ sql: `SELECT "${esc}"('${secret}')`, what: `escape ${esc} in a double-quoted name` });
  }
  const forbidden = [
    ['file', `'${secret}'`], ['file', "'/proc/self/environ'"], ['url', "'http://127.0.0.1:1/', 'CSV', 'a String'"], ['getSetting', "'max_memory_usage'"],
    ['getServerSetting', "'user_files_path'"], ['hostName', ''], ['getMacro', "'x'"], ['dictGet', "'d', 'a', 1"], ['joinGet', "'t', 'a', 1"],
    ['filesystemAvailable', ''], ['currentUser', ''], ['getSettingOrDefault', "'x', 1"], ['getClientHTTPHeader', "'x'"], ['uptime', ''], ['serverUUID', ''],
  ];
  for (const [fn, args] of forbidden) {
    const c = `${fn}(${args})`;
    out.push({ sql: `SELECT ${c}`, what: `${fn}()` });
    out.push({ sql: `WITH x -> ${c} AS f SELECT f(1)`, what: `${fn}() in a WITH lambda` });
    out.push({ sql: `SELECT arrayMap(x -> ${c}, [1])`, what: `${fn}() in arrayMap` });
    out.push({ sql: `WITH (SELECT ${c}) AS v SELECT v`, what: `${fn}() in a WITH scalar` });
    out.push({ sql: `SELECT * FROM (SELECT ${c} AS v) WHERE 1`, what: `${fn}() in a subquery` });
    out.push({ sql: `EXPLAIN SELECT ${c}`, what: `EXPLAIN around ${fn}()` });
    out.push({ sql: `EXPLAIN QUERY TREE SELECT ${c}`, what: `EXPLAIN QUERY TREE around ${fn}()` });
    out.push({ sql: `EXPLAIN SYNTAX SELECT ${c}`, what: `EXPLAIN SYNTAX around ${fn}()` });
    out.push({ sql: `DESCRIBE (SELECT ${c})`, what: `DESCRIBE around ${fn}()` });
    out.push({ sql: `SELECT 1 WHERE ${c} = ''`, what: `${fn}() in WHERE` });
    out.push({ sql: `SELECT count() FROM tool_calls GROUP BY ${c}`, what: `${fn}() in GROUP BY` });
    out.push({ sql: `SELECT 1 ORDER BY ${c}`, what: `${fn}() in ORDER BY` });
  }
  const hand: [string, string][] = [
    [`SELECT * FROM file('${secret}', 'LineAsString')`, 'file table function'],
    [`DESCRIBE file('${secret}', 'LineAsString')`, 'DESCRIBE of a file'],
    [`DESCRIBE TABLE file('/etc/passwd')`, 'DESCRIBE TABLE of a file'],
    [`SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'a String')`, 'url table function'],
    [`SELECT * FROM remote('127.0.0.1', system.one)`, 'remote table function'],
    [`SELECT * FROM executable('id', 'TSV', 'a String')`, 'executable table function'],
    [`SELECT * FROM merge('system', '.*')`, 'merge over system tables'],
    [`SELECT * FROM numbers(10) AS a, file('${secret}') AS b`, 'a file beside numbers'],
    [`SELECT * FROM numbers(toUInt64(length(file('${secret}'))))`, 'file() inside numbers()'],
    ['SELECT * FROM system.settings', 'system.settings'],
    ['SELECT * FROM system.processes', 'system.processes'],
    ['SELECT * FROM system.server_settings', 'system.server_settings'],
    ['SELECT * FROM system.disks', 'system.disks'],
    ['SELECT * FROM system.parts', 'system.parts'],
    ['SELECT * FROM system.databases', 'system.databases'],
    ['SELECT * FROM system.query_log', 'system.query_log'],
    ['SELECT * FROM system.tables', 'system.tables'],
    ['SELECT * FROM system.columns', 'system.columns (other databases)'],
    ['SELECT 1 IN system.settings', 'IN a system table by name'],
    ['SELECT name IN (SELECT name FROM system.settings) FROM system.one', 'IN a subquery of a system table'],
    ['SELECT * FROM information_schema.tables', 'information_schema'],
    ['SELECT * FROM default.x', 'another database'],
    ['SELECT * FROM `system.settings`', 'a backquoted dotted name'],
    ['SELECT * FROM "rlstream.x"."y"', 'a dotted database name'],
    ['SHOW DATABASES', 'SHOW DATABASES'],
    ['SHOW TABLES FROM system', 'SHOW TABLES of system'],
    ['SHOW PROCESSLIST', 'SHOW PROCESSLIST'],
    ['SHOW SETTINGS LIKE \'%\'', 'SHOW SETTINGS'],
    ['SHOW CREATE TABLE system.settings', 'SHOW CREATE of a system table'],
    ['SHOW CREATE USER default', 'SHOW CREATE USER'],
    ['SHOW GRANTS', 'SHOW GRANTS'],
    ['SHOW USERS', 'SHOW USERS'],
    ['SHOW COLUMNS FROM settings FROM system', 'SHOW COLUMNS of a system table'],
    ['EXISTS TABLE system.settings', 'EXISTS of a system table'],
    ['SELECT 1 SETTINGS readonly = 0', 'SETTINGS readonly'],
    ['SELECT 1 SETTINGS max_memory_usage = 0', 'SETTINGS lifting the memory limit'],
    ['EXPLAIN json = 1 SELECT 1', 'EXPLAIN with settings'],
    ['SET readonly = 0', 'SET'],
    ['USE system', 'USE'],
    ['KILL QUERY WHERE 1', 'KILL QUERY'],
    ['SYSTEM DROP DNS CACHE', 'SYSTEM'],
    ['SYSTEM SHUTDOWN', 'SYSTEM SHUTDOWN'],
    ["INSERT INTO tool_calls (run_id) VALUES ('x')", 'INSERT'],
    [`INSERT INTO FUNCTION file('${outfile(3000)}', 'CSV') SELECT 1`, 'INSERT INTO FUNCTION file'],
    ['CREATE TABLE evil (a Int8) ENGINE = Memory', 'CREATE TABLE'],
    ['CREATE FUNCTION evil AS x -> x', 'CREATE FUNCTION'],
    ['CREATE TEMPORARY TABLE evil (a Int8)', 'temporary table'],
    ['DROP TABLE tool_calls', 'DROP'],
    ['TRUNCATE TABLE tool_calls', 'TRUNCATE'],
    ['ALTER TABLE tool_calls DELETE WHERE 1', 'ALTER DELETE'],
    ['OPTIMIZE TABLE tool_calls FINAL', 'OPTIMIZE'],
    ['RENAME TABLE tool_calls TO evil', 'RENAME'],
    ['GRANT ALL ON *.* TO default', 'GRANT'],
    ['BACKUP TABLE tool_calls TO File(\'/tmp/x\')', 'BACKUP'],
    ['SELECT 1; SELECT 2', 'two statements'],
    ['SELECT 1;;', 'empty statements'],
    ["SELECT ';'; SELECT 2", 'a semicolon in a string, then a statement'],
    [`SELECT 1 INTO OUTFILE '${outfile(3001)}'`, 'INTO OUTFILE'],
    [`SELECT 1 INTO OUTFILE '${outfile(3002)}' APPEND`, 'INTO OUTFILE APPEND'],
    [`SELECT 1 INTO OUTFILE '${outfile(3003)}' AND STDOUT`, 'INTO OUTFILE AND STDOUT'],
    [`SELECT 1 INTO OUTFILE '${outfile(3004)}' COMPRESSION 'gzip'`, 'INTO OUTFILE compressed'],
    [`(SELECT 1) INTO OUTFILE '${outfile(3005)}'`, 'INTO OUTFILE after parentheses'],
    [`SELECT 1 UNION ALL SELECT 2 INTO OUTFILE '${outfile(3006)}'`, 'INTO OUTFILE after a UNION'],
    ['SELECT 1 FORMAT TSV', 'FORMAT'],
    ['SELECT * APPLY(file) FROM (SELECT \'/etc/passwd\' AS p)', 'APPLY of file'],
    ['SELECT * APPLY(x -> file(x)) FROM (SELECT \'/etc/passwd\' AS p)', 'APPLY of a lambda'],
    ['SELECT arrayReduce(\'file\', [\'/etc/passwd\'])', 'arrayReduce by name'],
    ['SELECT initializeAggregation(\'file\', \'/etc/passwd\')', 'initializeAggregation by name'],
    ['SELECT {x:String}', 'a query parameter'],
    ['SELECT evalMLMethod(1)', 'evalMLMethod'],
    ['SELECT naiveBayesClassifier(\'m\', \'x\')', 'a model by name'],
    ['SELECT generateSerialID(\'x\')', 'Keeper'],
    ['SELECT getOSKernelVersion()', 'the host kernel'],
    ['SELECT * FROM generateRandom(\'a String\')', 'generateRandom'],
    ['SELECT * FROM numbers(1, file(\'/etc/passwd\'))', 'numbers with a call argument'],
    ['SELECT * FROM zeros(length(\'x\'))', 'zeros with a call argument'],
    ['SELECT * FROM s3(\'http://127.0.0.1:1/x\')', 's3'],
    ['SELECT * FROM dictionary(\'d\')', 'dictionary'],
    ['SELECT * FROM cluster(\'default\', system.one)', 'cluster'],
    ['SELECT * FROM loop(numbers(1))', 'loop'],
    ['SELECT * FROM view(SELECT file(\'/etc/passwd\'))', 'view table function'],
    ['SELECT * FROM viewExplain(\'EXPLAIN\', \'\', (SELECT 1))', 'viewExplain'],
    ['SELECT * FROM input(\'a String\')', 'input'],
    ['SELECT * FROM format(CSV, \'a\')', 'format table function'],
    ['SELECT joinGetOrNull(\'tool_calls\', \'status\', 1)', 'joinGetOrNull'],
    ['SELECT hasColumnInTable(\'system\', \'settings\', \'name\')', 'hasColumnInTable'],
    ['SELECT "sumIf"(1, 1), "FILE"(\'x\')', 'a case-insensitive alias'],
    ['SELECT fileIf(\'/etc/passwd\', 1)', 'a combinator on file'],
  ];
  for (const [sql, what] of hand) out.push({ sql, what });
  // Some generated spellings coincide (a comment that is also a space); each is tried once.
  const seen = new Set<string>();
  return out.filter((p) => !seen.has(p.sql) && seen.add(p.sql));
}

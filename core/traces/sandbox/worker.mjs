// The SQL sandbox process. It holds no secret (spawned with an empty environment, as an unprivileged user, in
// its own mount, PID and network namespaces where bubblewrap is installed: spawn.ts) and does three things
// for its parent: parses a text with the engine (formatQuery proves a single statement, EXPLAIN AST gives the
// tree the parent checks), lists the engine's functions, and runs a text the parent has checked: on chDB over
// a snapshot of the trace store (snapshot.ts), or on a ClickHouse server over HTTP. It imports nothing outside
// this directory but chdb, so the sandbox needs only this directory and node_modules. Plain JavaScript: the
// sandbox runs node alone, with no TypeScript loader (whose compiler is a binary of its own); the messages are
// typed in protocol.ts.
/* global fetch */
import { Socket } from 'node:net';
import { Buffer } from 'node:buffer';
import process from 'node:process';
import { URL, URLSearchParams } from 'node:url';
import { Session, drainPending } from 'chdb';

const channel = new Socket({ fd: 3, readable: true, writable: true });
/** @type {{ kind: 'chdb' } | { kind: 'server', url: string, username?: string, password?: string, readonlySetting: boolean }} */
let target = { kind: 'chdb' };
let dir = '';
/** chDB connections on `dir`, one per set of settings (a connection's settings are fixed when it opens). */
/** @type {Map<string, Session>} */
const sessions = new Map();

/** @param {object} m */
function send(m) {
  channel.write(JSON.stringify(m) + '\n');
}

/** A ClickHouse string literal of `text` (the same escaping as core/traces/sql.ts quoteString). */
/** @param {string} text */
function literal(text) {
  return "'" + text.replace(/\\/g, '\\\\').replace(/'/g, "\\'") + "'";
}

/** @param {Record<string, string>} settings */
function session(settings) {
  const key = JSON.stringify(settings);
  let s = sessions.get(key);
  if (!s) {
    s = new Session(dir, { connectionArgs: ['--readonly=1', ...Object.entries(settings).map(([k, v]) => `--${k}=${v}`)] });
    sessions.set(key, s);
  }
  return s;
}

async function closeSessions() {
  for (const s of sessions.values()) s.close();
  sessions.clear();
  await drainPending();
}

/** @param {string} sql @param {string} format @param {Record<string, string>} [settings] @returns {Promise<string>} */
async function text(sql, format, settings = {}) {
  // A connection is kept after a failed statement: closing and reopening one on the same directory failed
  // for every later query of the process ("Failed to create connection"), and a failed statement leaves no
  // output behind when the text holds one statement (formatQuery proved that first).
  return (await session(settings).queryAsync(sql, { format })).text();
}

/** @param {string} sql @param {boolean} reformat */
async function parse(sql, reformat) {
  // formatQuery parses exactly one statement from a literal (no way out of the literal): a text with a second
  // statement anywhere fails here, before EXPLAIN AST sees it.
  const formatted = (await text(`SELECT formatQuery(${literal(sql)})`, 'TabSeparatedRaw')).replace(/\n$/, '');
  // reformat (a server of another version runs it): the tree is of the engine's own rendering, which is then
  // the text that runs, so comments, heredocs and quote characters that the other version's lexer could read
  // differently never reach it.
  const ast = await text(`EXPLAIN AST ${reformat ? formatted : sql}`, 'TabSeparated');
  return { formatted, ast };
}

async function functions() {
  const out = await text('SELECT name, alias_to, case_insensitive, is_aggregate FROM system.functions', 'JSONCompact');
  const rows = JSON.parse(out).data;
  return rows.map((/** @type {[string, string, number, number]} */ [name, aliasTo, ci, agg]) => ({ name, aliasTo, caseInsensitive: Number(ci) === 1, isAggregate: Number(agg) === 1 }));
}

/** @param {{ url: string, username?: string, password?: string, readonlySetting: boolean }} t @param {string} sql @param {string} database @param {Record<string, string>} settings */
async function runOnServer(t, sql, database, settings) {
  const url = new URL(t.url);
  url.username = '';
  url.password = '';
  const params = new URLSearchParams({ database, default_format: 'JSON', output_format_json_quote_64bit_integers: '0', ...settings, ...(t.readonlySetting ? { readonly: '1' } : {}) });
  /** @type {Record<string, string>} */
  const headers = {};
  if (t.username !== undefined) headers['authorization'] = 'Basic ' + Buffer.from(`${t.username}:${t.password ?? ''}`).toString('base64');
  const res = await fetch(`${url.origin}/?${params}`, { method: 'POST', body: sql, headers });
  const body = await res.text();
  if (!res.ok) throw new Error(body.trim() || `HTTP ${res.status}`);
  return body;
}

/** @param {{ op: string } & Record<string, any>} m */
async function handle(m) {
  switch (m.op) {
    case 'init':
      target = m.target;
      dir = m.dir;
      return null;
    case 'functions':
      return functions();
    case 'parse':
      return parse(m.sql, m.reformat === true);
    case 'run':
      if (target.kind === 'server') return runOnServer(target, m.sql, m.database, m.settings);
      // USE is a session's state; the text itself cannot name another database unchecked.
      await text(`USE \`${m.database.replace(/`/g, '')}\``, 'TabSeparated', m.settings);
      return text(m.sql, 'JSON', m.settings);
  }
}

let buffered = '';
let chain = Promise.resolve();
channel.setEncoding('utf8');
channel.on('data', (/** @type {string} */ chunk) => {
  buffered += chunk;
  let nl;
  while ((nl = buffered.indexOf('\n')) >= 0) {
    const line = buffered.slice(0, nl);
    buffered = buffered.slice(nl + 1);
    const m = JSON.parse(line);
    chain = chain.then(async () => {
      try {
        send({ id: m.id, ok: true, value: await handle(m) });
      } catch (err) {
        send({ id: m.id, ok: false, error: err instanceof Error ? err.message : String(err) });
      }
    });
  }
});
// The parent's end closing is the only way this process is told to stop.
channel.on('end', () => {
  void closeSessions().finally(() => process.exit(0));
});
send({ id: 0, ok: true, value: 'ready' });

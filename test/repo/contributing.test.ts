// docs/contributing.md names files, functions, types and registries: each must be there, as named, in the code.
// A rename or a move that leaves the page behind fails here, naming the stale reference.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';

const ROOT = join(import.meta.dirname, '../..');
const DOC = 'docs/contributing.md';
const text = readFileSync(join(ROOT, DOC), 'utf8').replace(/```[\s\S]*?```/g, (block) => block.replace(/^/gm, ''));
const files = execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' }).split('\0').filter(Boolean);
const code = files.filter((f) => /\.(ts|js|mjs|cpp|h|cu)$/.test(f) && !f.startsWith('node_modules/'));
const source = new Map(code.map((f) => [f, readFileSync(join(ROOT, f), 'utf8')]));
const allSource = [...source.values()].join('\n');
const TOP = new Set(files.map((f) => f.split('/')[0]!));

/** Every `span` of the page (inline code), with the text before it on its line. */
const spans = [...text.matchAll(/`([^`\n]+)`/g)].map((m) => ({ span: m[1]!, before: text.slice(Math.max(0, m.index - 60), m.index) }));

/** A declaration of `name` anywhere in the code: a function, class, interface, type, const or method. */
function declared(name: string): boolean {
  const n = name.replace(/[$]/g, '\\$');
  return new RegExp(`(?:function\\*?|class|interface|type|enum|const|let|var|struct)\\s+${n}\\b|^\\s+(?:async\\s+|static\\s+|readonly\\s+|private\\s+)*${n}\\s*[(<:]`, 'm').test(allSource);
}

test(`${DOC}: every repository path it names exists`, () => {
  const paths = new Set<string>();
  for (const { span } of spans) {
    for (const word of span.split(/\s+/)) {
      const p = word.replace(/[),;:]+$/, '');
      if (!p.includes('/') || p.startsWith('./') || p.startsWith('/') || /[<>*[\]{}]/.test(p)) continue;
      if (TOP.has(p.split('/')[0]!)) paths.add(p);
    }
  }
  assert.ok(paths.size > 40, `only ${paths.size} paths found`);
  const missing = [...paths].filter((p) => !existsSync(join(ROOT, p)));
  assert.deepEqual(missing, []);
});

test(`${DOC}: every bare file name it names is a file of the repository`, () => {
  const names = spans.map((s) => s.span).filter((s) => /^[\w.-]+\.(ts|cpp|h|cu|yaml|py)$/.test(s));
  assert.ok(names.length >= 3);
  const all = new Set(files.map((f) => basename(f)));
  assert.deepEqual(names.filter((n) => !all.has(n)), []);
});

test(`${DOC}: every function and registration call it shows calls something the code declares`, () => {
  // Fastify's own API (the route plugin pattern the page describes) is not this repository's to declare.
  const FRAMEWORK = new Set(['app', 'inject']);
  const calls = spans.map((s) => /^([A-Za-z_$][\w$]*)(?:\.([A-Za-z_$][\w$]*))?\(/.exec(s.span)).filter((m): m is RegExpExecArray => m !== null);
  assert.ok(calls.length >= 8, `only ${calls.length} calls found`);
  const bad: string[] = [];
  for (const m of calls) {
    const [whole, first, method] = m;
    if (FRAMEWORK.has(first!)) continue;
    if (!declared(first!)) bad.push(`${whole}: ${first} is declared nowhere`);
    if (method && !new RegExp(`\\b${method}\\s*[(<]`).test(allSource)) bad.push(`${whole}: no method ${method}`);
  }
  assert.deepEqual(bad, []);
});

test(`${DOC}: every type it names (PascalCase) is declared`, () => {
  const types = spans.map((s) => s.span).filter((s) => /^[A-Z][a-z]\w*$/.test(s));
  assert.ok(types.length >= 10, `only ${types.length} types found`);
  assert.deepEqual(types.filter((t) => !declared(t)), []);
});

test(`${DOC}: every registry it names ("the \`x\` registry", "registered in \`file\` (\`x\`)") is a registry of that file`, () => {
  const named: { registry: string; file: string | null }[] = [];
  for (const m of text.matchAll(/the `([a-zA-Z]+)` registry(?: in `([^`]+)`)?/g)) named.push({ registry: m[1]!, file: m[2] ?? null });
  for (const m of text.matchAll(/registered in `([^`]+)` \(`([a-zA-Z]+)`/g)) named.push({ registry: m[2]!, file: m[1]! });
  // app.register is Fastify's (the route plugin pattern), not a registry of this repository.
  for (const m of text.matchAll(/`([a-zA-Z]+)\.register\(/g)) if (m[1] !== 'app') named.push({ registry: m[1]!, file: null });
  assert.ok(named.length >= 6, `only ${named.length} registries found`);
  const bad: string[] = [];
  for (const { registry, file } of named) {
    const decl = new RegExp(`export const ${registry}\\b[^=]*=\\s*(?:new Registry|new \\w*Registry|registry\\()`);
    const where = file ? [file] : [...source.keys()];
    if (!where.some((f) => decl.test(source.get(f) ?? ''))) bad.push(`${registry}${file ? ` in ${file}` : ''}`);
  }
  assert.deepEqual(bad, []);
});

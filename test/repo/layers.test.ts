// The layers hold: the lowest layer (core/) loads only the native codecs, never the model's TypeScript, and the
// benchmarks share code with the tests through testkit/, never by importing test files.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');

function tsFiles(dir: string): string[] {
  return readdirSync(join(ROOT, dir)).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(join(ROOT, path)).isDirectory()) return tsFiles(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** The repository paths a file imports at run time (type-only imports are erased and do not count). */
function runtimeImports(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const specs = [...text.matchAll(/^\s*(?:import|export)\s+(?!type\b)[^;]*?from\s+'(\.{1,2}\/[^']+)'/gm), ...text.matchAll(/import\('(\.{1,2}\/[^']+)'\)/g)];
  return specs.map((m) => relative(ROOT, resolve(ROOT, dirname(file), m[1]!)));
}

test('core/ loads native/ only through its codecs and the addon, never the model', () => {
  const bad = tsFiles('core').flatMap((f) => runtimeImports(f).filter((p) => p.startsWith('native/') && !['native/codecs.ts', 'native/addon.ts'].includes(p)).map((p) => `${f} → ${p}`));
  assert.deepEqual(bad, []);
});

test('bench/ imports nothing from test/ (shared helpers live in testkit/)', () => {
  const bad = tsFiles('bench').flatMap((f) => runtimeImports(f).filter((p) => p.startsWith('test/')).map((p) => `${f} → ${p}`));
  assert.deepEqual(bad, []);
});

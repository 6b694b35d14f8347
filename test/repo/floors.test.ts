// The floors hold (lint/floors.js): ESLint's rule `rlstream/floors` reports every import a floor may not make,
// in every form (static, type-only, export-from, import() of a literal, roundabout paths), and lets the allowed
// ones pass; independently of ESLint, the repository's import graph as TypeScript's own parser reads it breaks
// no floor either, so a rule switched off (or an eslint-disable) is still caught.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ESLint } from 'eslint';
import ts from 'typescript';
import { FLOORS, floorOf, violation } from '../../lint/floors.js';

const ROOT = resolve(import.meta.dirname, '../..');
const eslint = new ESLint({ cwd: ROOT });
const RULE = 'rlstream/floors';

/** The floors rule's messages for `code` as if it were the file at `path` (repository-relative). */
async function reported(path: string, code: string, options: { ruleOff?: boolean } = {}): Promise<string[]> {
  const linter = options.ruleOff ? new ESLint({ cwd: ROOT, overrideConfig: { rules: { [RULE]: 'off' } } }) : eslint;
  const [result] = await linter.lintText(code, { filePath: join(ROOT, path) });
  return result!.messages.filter((m) => m.ruleId === RULE || m.fatal).map((m) => (m.fatal ? `FATAL ${m.message}` : m.message));
}

/** The module specifiers of `code` as TypeScript parses them (imports, export-from, import() of literals). */
function tsImports(code: string): string[] {
  return ts.preProcessFile(code, true, true).importedFiles.map((f) => f.fileName);
}

const BAD: [string, string, RegExp][] = [
  ['producers/tools/probe.ts', "import { gsm8kScore } from '../../consumers/reward/stage.ts';", /producers may not import consumers\/reward\/stage\.ts/],
  ['producers/tools/probe.ts', "import type { TrainSample } from '../../consumers/trainer/batch.ts';\nexport type T = TrainSample;", /producers may not import consumers\/trainer\/batch\.ts/],
  ['producers/serve/probe.ts', "export * from '../../admin/server.ts';", /producers may not import admin\/server\.ts/],
  ['producers/probe.ts', "export { main } from '../cli/main.ts';", /producers may not import cli\/main\.ts/],
  ['producers/agent/probe.ts', "export async function f() { return import('../../consumers/trainer/trainer.ts'); }", /producers may not import consumers\/trainer\/trainer\.ts/],
  ['producers/agent/probe.ts', 'export async function f() { return import(`../../consumers/reward/stage.ts`); }', /producers may not import consumers\/reward\/stage\.ts/],
  ['producers/agent/probe.ts', "import '../../producers/../consumers/reward/stage.ts';", /producers may not import consumers\/reward\/stage\.ts/],
  ['consumers/reward/probe.ts', "import { sampleFromEvent } from '../trainer/batch.ts';", /consumers\/reward may not import consumers\/trainer\/batch\.ts/],
  ['consumers/trainer/probe.ts', "import { composeReward } from '../reward/shaping.ts';", /consumers\/trainer may not import consumers\/reward\/shaping\.ts/],
  ['consumers/critic/probe.ts', "import '../../core/errors.ts';", /consumers\/critic is no floor/],
  ['core/probe.ts', "import { loadRunConfig } from '../cli/config/run-config.ts';", /core may not import cli\/config\/run-config\.ts/],
  ['core/traces/probe.ts', "import type { Model } from '../../native/model.ts';\nexport type M = Model;", /core may not import native\/model\.ts/],
  ['core/tasks/probe.ts', "import { TOPICS } from '../../producers/worker.ts';", /core may not import producers\/worker\.ts/],
  ['schemas/probe.ts', "import { RlstreamError } from '../core/errors.ts';", /schemas may not import core\/errors\.ts/],
  ['bench/probe.ts', "import { x } from '../test/log/conformance.ts';", /bench may not import test\/log\/conformance\.ts/],
  ['admin/probe.ts', "import { RewardConsumer } from '../consumers/reward/consumer.ts';", /admin may not import consumers\/reward\/consumer\.ts/],
  ['examples/calculator/probe.ts', "import { loadRunConfig } from '../../cli/config/run-config.ts';", /examples may not import cli\/config\/run-config\.ts/],
  ['producers/probe.ts', "import '../../elsewhere/x.ts';", /outside the repository/],
];

const GOOD: [string, string][] = [
  ['producers/tools/probe.ts', "import { extractGsm8kAnswer } from '../../core/tasks/gsm8k.ts';\nimport { readFileSync } from 'node:fs';\nimport { Type } from '@sinclair/typebox';\nimport { ToolSet } from '../tool-set.ts';"],
  ['producers/serve/probe.ts', "import { TokenStore } from '../../core/auth/tokens.ts';"],
  ['core/log/probe.ts', "import { frameChecksum } from '../../native/codecs.ts';"],
  ['consumers/replay/probe.ts', "import { rewardTrajectory } from '../reward/stage.ts';\nimport { TraceIngest } from '../traces/ingest.ts';"],
  ['cli/probe.ts', "import '../consumers/trainer/trainer.ts';\nimport '../producers/worker.ts';\nimport '../admin/server.ts';\nimport '../examples/index.ts';"],
  // Paths that cannot be read statically are not the floors' business (user modules are loaded so).
  ['producers/probe.ts', 'export async function f(p: string) { return import(p); }'],
  // test/ is no floor: tests import what they test.
  ['test/probe.test.ts', "import '../consumers/trainer/trainer.ts';\nimport '../producers/worker.ts';"],
];

test('a floor importing what lint/floors.js does not allow is reported by eslint, in every form of import', async () => {
  for (const [path, code, expected] of BAD) {
    const messages = await reported(path, code);
    assert.equal(messages.length, 1, `${path}: ${code}\n→ ${JSON.stringify(messages)}`);
    assert.match(messages[0]!, expected, `${path}: ${code}`);
  }
});

test('allowed imports (below, within the floor, packages, non-literal paths, test/) are not reported', async () => {
  for (const [path, code] of GOOD) assert.deepEqual(await reported(path, code), [], `${path}: ${code}`);
});

test('generated: every pair of floors at several depths, the rule agrees with the table', async () => {
  const floors = Object.keys(FLOORS);
  const fileIn = (floor: string, depth: number) => `${floor}/${Array.from({ length: depth }, (_, i) => `d${i}`).join('/')}${depth ? '/' : ''}probe.ts`;
  let checked = 0;
  for (const source of floors) {
    for (const target of floors) {
      for (const [ds, dt] of [[0, 0], [1, 2], [3, 0]] as const) {
        const from = fileIn(source, ds);
        const to = fileIn(target, dt);
        const spec = `${'../'.repeat(from.split('/').length - 1)}${to}`;
        const allowed = source === target || FLOORS[source]!.includes(target);
        const messages = await reported(from, `import '${spec}';`);
        assert.equal(messages.length, allowed ? 0 : 1, `${from} → ${to}: ${JSON.stringify(messages)}`);
        checked++;
      }
    }
  }
  assert.equal(checked, floors.length * floors.length * 3);
});

function repositoryFiles(): string[] {
  return execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' })
    .split('\0')
    .filter((f) => /\.(ts|mts|js|mjs)$/.test(f) && floorOf(f) !== null);
}

test("the repository's import graph, as TypeScript parses it, breaks no floor (the check beside ESLint's)", () => {
  const files = repositoryFiles();
  assert.ok(files.length > 300, `only ${files.length} files found`);
  const bad = files.flatMap((f) => tsImports(readFileSync(join(ROOT, f), 'utf8')).flatMap((spec) => {
    const why = violation(f, spec);
    return why ? [`${f}: ${why}`] : [];
  }));
  assert.deepEqual(bad, []);
});

test('with the ESLint rule switched off, the TypeScript-parsed check still catches a violation', async () => {
  const [path, code] = BAD[0]!;
  assert.deepEqual(await reported(path, code, { ruleOff: true }), [], 'the rule is off');
  const caught = tsImports(code).map((spec) => violation(path, spec)).filter(Boolean);
  assert.equal(caught.length, 1);
  assert.match(caught[0]!, /producers may not import consumers\/reward\/stage\.ts/);
});

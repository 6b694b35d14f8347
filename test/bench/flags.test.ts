// The benchmarks' one flag parser (bench/flags.ts) and the benches that declare their flags with it: values are
// checked by kind, an unknown or bad flag fails naming it and the bench's flag list, a replaced flag names its
// replacement, declared positional sizes are checked like flags; and every bench, run as `npm run bench` runs it,
// stops at a bogus flag with one line naming it and exit 2, before any work.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { bool, choice, FlagError, int, ints, names, parseFlags, replaced } from '../../bench/flags.ts';
import { parseOptions as asyncOptions } from '../../bench/async.ts';
import { parseOptions as parityOptions } from '../../bench/async-parity.ts';
import { parseOptions as tracesOptions } from '../../bench/traces.ts';

const FLAGS = { steps: int(1), bounds: ints(0), keep: bool, device: choice(['cpu', 'cuda'] as const), settings: names(['a', 'b']), old: replaced('use --steps') };

test('parseFlags: each kind, both value forms, and absent flags left out', () => {
  const { values, positional } = parseFlags(['--steps', '3', '--bounds=0,2,4', '--keep', '--device', 'cuda', '--settings', 'b,a'], FLAGS);
  assert.deepEqual(values, { steps: 3, bounds: [0, 2, 4], keep: true, device: 'cuda', settings: ['b', 'a'] });
  assert.deepEqual(positional, {});
  assert.deepEqual(parseFlags([], FLAGS).values, {});
});

test('parseFlags: a bad, unknown, valueless or replaced flag fails with its name', () => {
  assert.throws(() => parseFlags(['--steps', '0'], FLAGS), /--steps must be an integer >= 1 \(got "0"\)/);
  assert.throws(() => parseFlags(['--steps', '2.5'], FLAGS), /--steps must be an integer/);
  assert.throws(() => parseFlags(['--bounds', '0,x'], FLAGS), /--bounds must be an integer >= 0 \(got "x"\)/);
  assert.throws(() => parseFlags(['--device', 'gpu'], FLAGS), /--device must be one of cpu, cuda/);
  assert.throws(() => parseFlags(['--settings', 'c'], FLAGS), /--settings: unknown "c" \(known: a, b\)/);
  assert.throws(() => parseFlags(['--stpes', '3'], FLAGS), /Unknown option '--stpes' \(flags: --steps N --bounds N,N,… --keep --device cpu\|cuda --settings a,b,…\)/);
  assert.throws(() => parseFlags(['--steps'], FLAGS), /--steps <value>' argument missing/);
  assert.throws(() => parseFlags(['8'], FLAGS), /Unexpected argument '8'/);
  assert.throws(() => parseFlags(['--old', '3'], FLAGS), /--old is no longer taken: use --steps/);
});

test('parseFlags: declared positional sizes are checked like flags, one past them is refused; every failure is a FlagError', () => {
  const positionals = [['records', int(1)], ['batch', int(1)]] as const;
  assert.deepEqual(parseFlags(['500', '--rounds', '2', '10', '--quick'], { rounds: int(1), quick: bool }, { positionals }), { values: { rounds: 2, quick: true }, positional: { records: 500, batch: 10 } });
  assert.throws(() => parseFlags(['1', '2', '3'], {}, { positionals }), /Unexpected argument '3' \(flags: \[records\] \[batch\]\)/);
  assert.throws(() => parseFlags(['0'], {}, { positionals }), /records must be an integer >= 1 \(got "0"\)/);
  assert.throws(() => parseFlags(['--rounds'], { rounds: int(1) }), /--rounds <value>' argument missing/);
  for (const bad of [['--bogus'], ['--steps', 'x'], ['7'], ['--old', '1'], ['--steps']]) assert.throws(() => parseFlags(bad, FLAGS), FlagError, bad.join(' '));
  assert.throws(() => parseFlags(['--n', '300'], { n: int(1, 256) }), /--n must be an integer in 1\.\.256 \(got "300"\)/);
});

/** Benchmarks that `npm run bench -- <name>` runs: the files of bench/ exporting main(). */
function benches(): string[] {
  const dir = join(import.meta.dirname, '..', '..', 'bench');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.ts') && f !== 'main.ts' && /export async function main\(/.test(readFileSync(join(dir, f), 'utf8')))
    .map((f) => f.slice(0, -3))
    .sort();
}

function bench(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(import.meta.dirname, '..', '..', 'bench', 'main.ts'), ...args], { env: { ...process.env, KAFKA_BROKERS: '' } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
}

test('every benchmark stops at an unknown flag or a stray argument: one line naming it, exit 2, no stack trace, nothing run', { timeout: 600_000 }, async () => {
  const names = benches();
  for (const expected of ['serve', 'pipeline', 'log-kafka', 'log', 'consumers', 'native', 'policy', 'rollout', 'serde', 'traces', 'async', 'async-parity']) assert.ok(names.includes(expected), expected);
  // --bogus for every bench; a stray argument past the declared sizes for one bench of each kind (sizes, none).
  const cases = [...names.map((name) => [name, '--bogus']), ...['log', 'pipeline', 'serve', 'rollout'].map((name) => [name, '--quick', '99', '98', '97'])];
  // Three at a time: each is a Node start and the bench's imports.
  const results: { args: string[]; r: Awaited<ReturnType<typeof bench>> }[] = [];
  for (let i = 0; i < cases.length; i += 3) results.push(...(await Promise.all(cases.slice(i, i + 3).map(async (args) => ({ args, r: await bench(args) })))));
  for (const { args, r } of results) {
    const what = args.join(' ');
    assert.equal(r.code, 2, `${what}: exit ${r.code}\n${r.stderr}`);
    const lines = r.stderr.trim().split('\n');
    assert.equal(lines.length, 1, `${what}: one line\n${r.stderr}`);
    assert.match(lines[0]!, args[1] === '--bogus' ? new RegExp(`^bench ${args[0]}: Unknown option '--bogus' \\(flags: `) : new RegExp(`^bench ${args[0]}: Unexpected argument '9\\d' \\(flags: `), what);
    assert.doesNotMatch(r.stdout, /report:/, `${what}: no report written`);
  }
});

test('async and async-parity read the main job flags alike, with their own defaults and --quick sizes', () => {
  const size = ['--steps', '3', '--groups', '4', '--n', '2', '--heldout', '50', '--bounds', '0,2', '--sync-threads', '2', '--async-threads', '1', '--mode-timeout', '60', '--keep'];
  for (const parse of [asyncOptions, parityOptions]) {
    const o = parse(size);
    assert.deepEqual([o.steps, o.groups, o.n, o.heldout, o.bounds, o.syncThreads, o.asyncThreads, o.modeTimeoutS, o.keep], [3, 4, 2, 50, [0, 2], 2, 1, 60, true]);
    assert.throws(() => parse(['--n', '1']), /--n must be an integer >= 2/);
    assert.throws(() => parse(['--setps', '3']), /Unknown option '--setps'/);
  }
  assert.deepEqual([asyncOptions([]).steps, asyncOptions([]).rounds, asyncOptions(['--quick']).rounds, asyncOptions(['--quick', '--rounds', '1']).rounds], [20, 3, 2, 1]);
  assert.equal(asyncOptions(['--device', 'cuda']).device, 'cuda');
  assert.deepEqual(parityOptions(['--seeds', '4,5', '--settings', 'ppo,gspo']).seeds, [4, 5]);
  assert.deepEqual(parityOptions(['--quick']).seeds, [1]);
  // The seeds are its rounds: --rounds would be silently meaningless.
  assert.throws(() => parityOptions(['--rounds', '3']), /--rounds is no longer taken: .*--seeds/);
});

test("traces: the README's flags keep working, --sink-runs is the older name of --rounds", () => {
  const o = tracesOptions(['--targets', 'server', '--turns', '20000', '--sink-turns', '200000', '--sink-runs', '1', '--engine-turns', '0', '--kafka-sink', 'false']);
  assert.deepEqual([o.targets, o.turns, o.sinkTurns, o.rounds, o.engineTurns, o.kafkaSink], [['server'], 20000, 200000, 1, 0, false]);
  assert.equal(tracesOptions(['--rounds', '2', '--kafka-sink', 'false']).rounds, 2);
  assert.throws(() => tracesOptions(['--rounds', '2', '--sink-runs', '3']), /--sink-runs is the older name of --rounds/);
  assert.throws(() => tracesOptions(['--targets', 'mysql']), /--targets: unknown "mysql"/);
  assert.throws(() => tracesOptions(['--kafka-sink', 'yes']), /--kafka-sink must be one of true, false/);
});

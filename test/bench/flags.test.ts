// The benchmarks' one flag parser (bench/flags.ts) and the benches that declare their flags with it: values are
// checked by kind, an unknown or bad flag fails naming it and the bench's flag list, a replaced flag names its
// replacement, and pass-through keeps another reader's arguments in order.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bool, choice, commonFlags, int, ints, names, parseFlags, replaced } from '../../bench/flags.ts';
import { parseOptions as asyncOptions } from '../../bench/async.ts';
import { parseOptions as parityOptions } from '../../bench/async-parity.ts';
import { parseOptions as tracesOptions } from '../../bench/traces.ts';

const FLAGS = { steps: int(1), bounds: ints(0), keep: bool, device: choice(['cpu', 'cuda'] as const), settings: names(['a', 'b']), old: replaced('use --steps') };

test('parseFlags: each kind, both value forms, and absent flags left out', () => {
  const { values, rest } = parseFlags(['--steps', '3', '--bounds=0,2,4', '--keep', '--device', 'cuda', '--settings', 'b,a'], FLAGS);
  assert.deepEqual(values, { steps: 3, bounds: [0, 2, 4], keep: true, device: 'cuda', settings: ['b', 'a'] });
  assert.deepEqual(rest, []);
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

test('commonFlags: --quick and --rounds taken, everything else passed through in order', () => {
  assert.deepEqual(commonFlags(['500', '--rounds', '2', '--no-memory', '--quick']), { quick: true, rounds: 2, rest: ['500', '--no-memory'] });
  assert.deepEqual(commonFlags(['--threads', '4'], 9), { quick: false, rounds: 9, rest: ['--threads', '4'] });
  assert.throws(() => commonFlags(['--rounds', '0']), /--rounds must be an integer >= 1/);
  assert.throws(() => commonFlags(['--rounds']), /--rounds needs a value/);
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

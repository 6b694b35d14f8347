import { test } from 'node:test';
import assert from 'node:assert/strict';
import { numberOption } from '../../cli/options.ts';

test('numberOption accepts finite numbers and names the option when it refuses one', () => {
  assert.equal(numberOption('--score')('0.5'), 0.5);
  assert.equal(numberOption('--n', { integer: true, min: 1 })('12'), 12);
  assert.throws(() => numberOption('--score')('abc'), /--score must be a number, got "abc"/);
  assert.throws(() => numberOption('--score')(' '), /--score must be a number/);
  assert.throws(() => numberOption('--score')('Infinity'), /--score must be a number/);
  assert.throws(() => numberOption('--n', { integer: true })('1.5'), /--n must be an integer, got "1.5"/);
  assert.throws(() => numberOption('--n', { min: 1 })('0'), /--n must be at least 1, got 0/);
});

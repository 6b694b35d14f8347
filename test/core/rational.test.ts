// core/rational.ts: reduced, sign-normalised rationals and exact decimal parsing, shared by the calculator tool
// and the numeric reward.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { gcd, parseDecimal, rational } from '../../core/rational.ts';

test('rationals are reduced with the sign on the numerator, so equal values have equal fields', () => {
  assert.deepEqual(rational(6n, -4n), { num: -3n, den: 2n });
  assert.deepEqual(rational(0n, 5n), { num: 0n, den: 1n });
  assert.equal(gcd(-12n, 18n), 6n);
});

test('decimal literals parse exactly, exponents within the bound', () => {
  assert.deepEqual(parseDecimal('0.25'), { num: 1n, den: 4n });
  assert.deepEqual(parseDecimal('-18.50'), { num: -37n, den: 2n });
  assert.deepEqual(parseDecimal('.5'), { num: 1n, den: 2n });
  assert.deepEqual(parseDecimal('1e3'), { num: 1000n, den: 1n });
  assert.deepEqual(parseDecimal('25E-2'), { num: 1n, den: 4n });
  assert.deepEqual(parseDecimal('7.'), { num: 7n, den: 1n });
  for (const bad of ['', '.', '-', '1,000', '1e', 'abc', '1.2.3']) assert.equal(parseDecimal(bad), null, bad);
  assert.equal(parseDecimal('1e301'), null);
  assert.equal(parseDecimal('1e5', 4), null);
});

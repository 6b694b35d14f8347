// Exact rationals on BigInt, for the places where float rounding must not decide a result: the calculator
// tool's arithmetic and the numeric reward's comparisons. A Rational is always reduced with a positive
// denominator, so two equal values have equal fields.

export interface Rational {
  num: bigint;
  den: bigint;
}

export function gcd(a: bigint, b: bigint): bigint {
  a = a < 0n ? -a : a;
  b = b < 0n ? -b : b;
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

/** num/den reduced, the sign on the numerator. The caller rules out den = 0. */
export function rational(num: bigint, den: bigint): Rational {
  if (den < 0n) [num, den] = [-num, -den];
  const g = gcd(num, den) || 1n;
  return { num: num / g, den: den / g };
}

const DECIMAL = /^([+-])?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;

/**
 * A decimal literal ("18", "-0.25", ".5", "1e3") as an exact rational; null when the text is not one or its
 * exponent is beyond ±maxExponent (which bounds the BigInt a hostile input can make).
 */
export function parseDecimal(text: string, maxExponent = 300): Rational | null {
  const m = DECIMAL.exec(text);
  if (!m || (m[2] === '' && (m[3] ?? '') === '')) return null;
  const frac = m[3] ?? '';
  const exp = Number(m[4] ?? 0);
  if (Math.abs(exp) > maxExponent) return null;
  let num = BigInt((m[2] || '0') + frac) * (m[1] === '-' ? -1n : 1n);
  let den = 10n ** BigInt(frac.length);
  if (exp > 0) num *= 10n ** BigInt(exp);
  else if (exp < 0) den *= 10n ** BigInt(-exp);
  return rational(num, den);
}

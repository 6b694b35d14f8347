// The calculator tool: arithmetic expressions parsed by jsep into an AST and evaluated by walking it.
// Only numbers, + - * / % ^, parentheses, unary minus and a few whitelisted functions are understood;
// anything else (names, member access, strings, calls of other functions) is refused. Never eval.
// Arithmetic is exact on rationals (BigInt numerator/denominator), so 0.1+0.2 is 0.3 and 48/2 is 24;
// only irrational results (sqrt of a non-square, fractional powers) fall back to floating point.
import jsep from 'jsep';
import { RlstreamError } from '../../core/errors.ts';
import { parseDecimal, rational } from '../../core/rational.ts';
import type { ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { StatefulTool, type ToolResult } from './types.ts';

// jsep's `^` is bitwise xor; here it is the power operator: tighter than * and right-associative.
jsep.removeBinaryOp('^');
jsep.addBinaryOp('^', 11, true);
jsep.addBinaryOp('**', 11, true);

const MAX_INPUT = 500;
const MAX_EXPONENT = 1000n;
const MAX_DIGITS = 400;

/** An exact rational (den > 0, reduced) or an inexact float. */
type Num = { exact: true; num: bigint; den: bigint } | { exact: false; value: number };

function rat(num: bigint, den: bigint): Num {
  if (den === 0n) throw calcError('division by zero');
  const r = { exact: true as const, ...rational(num, den) };
  if (r.num.toString().length > MAX_DIGITS || r.den.toString().length > MAX_DIGITS) throw calcError('result is too large');
  return r;
}

function float(value: number): Num {
  if (!Number.isFinite(value)) throw calcError('result is not a finite number');
  return { exact: false, value };
}

function toFloat(n: Num): number {
  return n.exact ? Number(n.num) / Number(n.den) : n.value;
}

function isInt(n: Num): n is { exact: true; num: bigint; den: bigint } {
  return n.exact && n.den === 1n;
}

function calcError(message: string): RlstreamError {
  return new RlstreamError('TOOL_INVALID_ARGS', message);
}

/** A decimal literal to an exact rational ("0.25" → 1/4, "1e3" → 1000). */
function literal(raw: string): Num {
  const r = parseDecimal(raw);
  // jsep has already read the literal as a number, so an unreadable one here has an exponent past the bound.
  if (r === null) throw calcError(`not a number, or an exponent too large: ${raw}`);
  return rat(r.num, r.den);
}

function add(a: Num, b: Num, sign: 1n | -1n): Num {
  if (a.exact && b.exact) return rat(a.num * b.den + sign * b.num * a.den, a.den * b.den);
  return float(toFloat(a) + Number(sign) * toFloat(b));
}

function mul(a: Num, b: Num): Num {
  if (a.exact && b.exact) return rat(a.num * b.num, a.den * b.den);
  return float(toFloat(a) * toFloat(b));
}

function div(a: Num, b: Num): Num {
  if (a.exact && b.exact) {
    if (b.num === 0n) throw calcError('division by zero');
    return rat(a.num * b.den, a.den * b.num);
  }
  if (toFloat(b) === 0) throw calcError('division by zero');
  return float(toFloat(a) / toFloat(b));
}

function mod(a: Num, b: Num): Num {
  if (a.exact && b.exact) {
    if (b.num === 0n) throw calcError('modulo by zero');
    // a - b*trunc(a/b) on rationals: the sign follows the dividend, like JavaScript's %.
    const q = (a.num * b.den) / (a.den * b.num);
    return add(a, mul(b, rat(q, 1n)), -1n);
  }
  return float(toFloat(a) % toFloat(b));
}

function pow(a: Num, b: Num): Num {
  if (a.exact && isInt(b) && (b.num < 0n ? -b.num : b.num) <= MAX_EXPONENT) {
    const e = b.num < 0n ? -b.num : b.num;
    if (b.num < 0n && a.num === 0n) throw calcError('division by zero');
    const r = rat(a.num ** e, a.den ** e);
    return b.num < 0n && r.exact ? rat(r.den, r.num) : r;
  }
  return float(Math.pow(toFloat(a), toFloat(b)));
}

function isqrt(n: bigint): bigint {
  if (n < 2n) return n;
  let x = BigInt(Math.floor(Math.sqrt(Number(n))));
  while (x * x > n) x--;
  while ((x + 1n) * (x + 1n) <= n) x++;
  return x;
}

function sqrt(a: Num): Num {
  if (toFloat(a) < 0) throw calcError('square root of a negative number');
  if (a.exact) {
    const rn = isqrt(a.num);
    const rd = isqrt(a.den);
    if (rn * rn === a.num && rd * rd === a.den) return rat(rn, rd);
  }
  return float(Math.sqrt(toFloat(a)));
}

function floorNum(a: Num): Num {
  if (!a.exact) return float(Math.floor(a.value));
  const q = a.num / a.den;
  return rat(a.num < 0n && q * a.den !== a.num ? q - 1n : q, 1n);
}

function neg(a: Num): Num {
  return a.exact ? rat(-a.num, a.den) : float(-a.value);
}

function cmp(a: Num, b: Num): number {
  if (a.exact && b.exact) {
    const d = a.num * b.den - b.num * a.den;
    return d < 0n ? -1 : d > 0n ? 1 : 0;
  }
  return Math.sign(toFloat(a) - toFloat(b));
}

const FUNCTIONS: Record<string, { arity: [number, number]; fn: (args: Num[]) => Num }> = {
  sqrt: { arity: [1, 1], fn: ([a]) => sqrt(a!) },
  abs: { arity: [1, 1], fn: ([a]) => (cmp(a!, rat(0n, 1n)) < 0 ? neg(a!) : a!) },
  floor: { arity: [1, 1], fn: ([a]) => floorNum(a!) },
  ceil: { arity: [1, 1], fn: ([a]) => neg(floorNum(neg(a!))) },
  round: { arity: [1, 1], fn: ([a]) => floorNum(add(a!, rat(1n, 2n), 1n)) },
  min: { arity: [1, 16], fn: (args) => args.reduce((m, x) => (cmp(x, m) < 0 ? x : m)) },
  max: { arity: [1, 16], fn: (args) => args.reduce((m, x) => (cmp(x, m) > 0 ? x : m)) },
};

function evaluate(node: jsep.Expression): Num {
  switch (node.type) {
    case 'Literal': {
      const raw = (node as jsep.Literal).raw;
      if (typeof (node as jsep.Literal).value !== 'number') throw calcError(`only numbers are allowed, not ${raw}`);
      return literal(raw);
    }
    case 'UnaryExpression': {
      const u = node as jsep.UnaryExpression;
      if (u.operator === '-') return neg(evaluate(u.argument));
      if (u.operator === '+') return evaluate(u.argument);
      throw calcError(`operator ${u.operator} is not allowed`);
    }
    case 'BinaryExpression': {
      const b = node as jsep.BinaryExpression;
      // jsep binds unary minus tighter than any binary operator; in arithmetic -2^2 is -(2^2).
      if ((b.operator === '^' || b.operator === '**') && b.left.type === 'UnaryExpression') {
        const u = b.left as jsep.UnaryExpression;
        if (u.operator === '-' || u.operator === '+') {
          const p = pow(evaluate(u.argument), evaluate(b.right));
          return u.operator === '-' ? neg(p) : p;
        }
      }
      const l = evaluate(b.left);
      const r = evaluate(b.right);
      switch (b.operator) {
        case '+':
          return add(l, r, 1n);
        case '-':
          return add(l, r, -1n);
        case '*':
          return mul(l, r);
        case '/':
          return div(l, r);
        case '%':
          return mod(l, r);
        case '^':
        case '**':
          return pow(l, r);
        default:
          throw calcError(`operator ${b.operator} is not allowed`);
      }
    }
    case 'CallExpression': {
      const c = node as jsep.CallExpression;
      if (c.callee.type !== 'Identifier') throw calcError('only calls of sqrt, abs, floor, ceil, round, min, max are allowed');
      const name = (c.callee as jsep.Identifier).name;
      const f = Object.hasOwn(FUNCTIONS, name) ? FUNCTIONS[name] : undefined;
      if (!f) throw calcError(`unknown function ${name}; allowed: ${Object.keys(FUNCTIONS).join(', ')}`);
      if (c.arguments.length < f.arity[0] || c.arguments.length > f.arity[1]) throw calcError(`${name} takes ${f.arity[0] === f.arity[1] ? f.arity[0] : `${f.arity[0]} to ${f.arity[1]}`} argument(s)`);
      return f.fn(c.arguments.map(evaluate));
    }
    case 'Identifier':
      throw calcError(`unknown name ${(node as jsep.Identifier).name}: only numbers and operators are allowed`);
    default:
      throw calcError(`${node.type} is not allowed in an arithmetic expression`);
  }
}

/** Exact results print exactly (integers, terminating decimals); others with 12 significant digits. */
function formatNumber(n: Num): string {
  if (n.exact) {
    if (n.den === 1n) return n.num.toString();
    let den = n.den;
    let twos = 0;
    let fives = 0;
    while (den % 2n === 0n) {
      den /= 2n;
      twos++;
    }
    while (den % 5n === 0n) {
      den /= 5n;
      fives++;
    }
    const digits = Math.max(twos, fives);
    if (den === 1n && digits <= 20) {
      const scaled = (n.num * 10n ** BigInt(digits)) / n.den;
      const neg = scaled < 0n;
      const s = (neg ? -scaled : scaled).toString().padStart(digits + 1, '0');
      const out = `${s.slice(0, s.length - digits)}.${s.slice(s.length - digits)}`.replace(/\.?0+$/, '');
      return neg ? `-${out}` : out;
    }
    return formatFloat(Number(n.num) / Number(n.den));
  }
  return formatFloat(n.value);
}

function formatFloat(v: number): string {
  if (Number.isInteger(v) && Math.abs(v) < 1e21) return String(v);
  return String(Number(v.toPrecision(12)));
}

/** Normalise how people write numbers: 1,000 → 1000, × → *, ÷ → /. */
function normalise(expr: string): string {
  return expr.replace(/(\d),(?=\d{3}(?!\d))/g, '$1').replace(/×/g, '*').replace(/÷/g, '/').replace(/−/g, '-');
}

/** Evaluate an arithmetic expression; throws RlstreamError TOOL_INVALID_ARGS with the reason. */
export function calculate(expression: string): string {
  if (expression.length > MAX_INPUT) throw calcError(`expression longer than ${MAX_INPUT} characters`);
  const text = normalise(expression).trim();
  if (text === '') throw calcError('empty expression');
  let ast: jsep.Expression;
  try {
    ast = jsep(text);
  } catch (cause) {
    throw new RlstreamError('TOOL_INVALID_ARGS', `cannot parse expression: ${(cause as Error).message}`, { cause });
  }
  return formatNumber(evaluate(ast));
}

export const CALCULATOR_SCHEMA: ChatTool = {
  type: 'function',
  function: {
    name: 'calculator',
    description: 'Evaluate an arithmetic expression exactly. Supports + - * / % ^, parentheses and sqrt, abs, floor, ceil, round, min, max.',
    parameters: {
      type: 'object',
      properties: { expression: { type: 'string', description: 'The expression, e.g. "(48 + 24) / 3"' } },
      required: ['expression'],
      additionalProperties: false,
    },
  },
};

interface CalculatorState {
  calls: number;
}

/** The calculator as a tool. Errors in the expression are answered to the model (status error). */
export class CalculatorTool extends StatefulTool<CalculatorState> {
  readonly schema: ChatTool;

  constructor(name = 'calculator') {
    super();
    this.schema = { ...CALCULATOR_SCHEMA, function: { ...CALCULATOR_SCHEMA.function, name } };
  }

  protected initialState(): CalculatorState {
    return { calls: 0 };
  }

  execute(instanceId: string, args: Record<string, unknown>): ToolResult {
    const st = this.state(instanceId);
    if (st) st.calls++;
    try {
      return { text: calculate(String(args['expression'])) };
    } catch (err) {
      return { text: `Error: ${(err as Error).message}`, isError: true };
    }
  }
}

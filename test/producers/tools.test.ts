// Tools: the calculator (exact arithmetic, refusing code), the ToolSet lifecycle with JSON-schema
// validation, timeouts and unknown tools, the YAML tool config, and MCP tools against a real MCP server
// process (stdio and streamable HTTP).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { once } from 'node:events';
import { describe, test } from 'node:test';
import { calculate, CalculatorTool } from '../../producers/tools/calculator.ts';
import { toolSetFromYaml } from '../../producers/tools/config.ts';
import { McpConnection } from '../../producers/tools/mcp.ts';
import { ToolSet } from '../../producers/tools/tool-set.ts';
import { StatefulTool, type ToolResult } from '../../producers/tools/types.ts';
import type { ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';
import { REPO } from './helpers.ts';
import { tempDir } from '../../testkit/events.ts';

const FIXTURE = join(REPO, 'test', 'producers', 'fixtures', 'mcp-server.ts');
const TSX = join(REPO, 'node_modules', '.bin', 'tsx');

describe('calculator', () => {
  test('exact arithmetic, sensible formatting', () => {
    assert.equal(calculate('0.1 + 0.2'), '0.3');
    assert.equal(calculate('48/2'), '24');
    assert.equal(calculate('12/60'), '0.2');
    assert.equal(calculate('0.2*50'), '10');
    assert.equal(calculate('1,200 * 3'), '3600');
    assert.equal(calculate('2^3^2'), '512');
    assert.equal(calculate('-2^2'), '-4');
    assert.equal(calculate('(3 + 4) * -2'), '-14');
    assert.equal(calculate('7 % 3'), '1');
    assert.equal(calculate('1/8'), '0.125');
    assert.equal(calculate('10/3'), '3.33333333333');
    assert.equal(calculate('sqrt(144) + abs(-3) + max(1, 5, 2)'), '20');
    assert.equal(calculate('2^64'), '18446744073709551616');
    assert.equal(calculate('99999999999999999 + 1'), '100000000000000000');
  });

  test('refuses code-like input and bad arithmetic', () => {
    for (const bad of ['process.exit(1)', 'constructor', 'require("fs")', '"a" + 1', 'x = 1', '[1,2]', 'this', 'eval("1")', 'Math.PI', '1 ? 2 : 3', '() => 1', 'a.b.c', '1 << 2', '1 == 1']) {
      assert.throws(() => calculate(bad), /not allowed|unknown|cannot parse|only/, bad);
    }
    assert.throws(() => calculate('1/0'), /division by zero/);
    assert.throws(() => calculate(''), /empty/);
    assert.throws(() => calculate('9'.repeat(600)), /longer than/);
    assert.throws(() => calculate('10^10000'), /too large|finite/);
  });
});

class Counter extends StatefulTool<{ base: number; calls: number }> {
  readonly schema: ChatTool = {
    type: 'function',
    function: { name: 'counter', description: 'adds', parameters: { type: 'object', properties: { by: { type: 'integer', minimum: 1 } }, required: ['by'], additionalProperties: false } },
  };
  released: string[] = [];
  protected initialState(kw: Record<string, unknown>) {
    return { base: Number(kw['base'] ?? 0), calls: 0 };
  }
  execute(id: string, args: Record<string, unknown>): ToolResult {
    const st = this.state(id)!;
    st.calls++;
    st.base += args['by'] as number;
    return { text: String(st.base), reward: 0.1, metrics: { calls: st.calls } };
  }
  calcReward(id: string): number {
    return this.state(id)!.base;
  }
  override release(id: string): void {
    this.released.push(id);
    super.release(id);
  }
}

const sleeper = {
  schema: { type: 'function' as const, function: { name: 'sleep', parameters: { type: 'object', properties: { ms: { type: 'number' } } } } },
  create() {},
  release() {},
  async execute(_id: string, args: Record<string, unknown>, ctx: { signal: AbortSignal }): Promise<ToolResult> {
    await new Promise((r, j) => {
      const t = setTimeout(r, args['ms'] as number);
      ctx.signal.addEventListener('abort', () => (clearTimeout(t), j(new Error('aborted'))));
    });
    return { text: 'slept' };
  },
};

describe('ToolSet', () => {
  test('lifecycle: create with create_kwargs, execute, calcReward, release', async () => {
    const counter = new Counter();
    const set = new ToolSet().add(counter);
    const s = set.session('traj-1', { counter: { create_kwargs: { base: 10 } } });
    const r1 = await s.call('counter', '{"by": 2}');
    assert.deepEqual([r1.status, r1.text, r1.reward, r1.metrics], ['ok', '12', 0.1, { calls: 1 }]);
    assert.equal((await s.call('counter', '{"by": 3}')).text, '15');
    assert.deepEqual(await s.finish(), [{ tool: 'counter', reward: 15 }]);
    assert.deepEqual(counter.released, ['traj-1:counter']);
  });

  test('invalid arguments never reach the tool: status invalid_args with the reason', async () => {
    const counter = new Counter();
    const s = new ToolSet().add(counter).session('t');
    const bad = await s.call('counter', '{"by": 0}');
    assert.equal(bad.status, 'invalid_args');
    assert.match(bad.text, /\/by must be >= 1/);
    assert.equal((await s.call('counter', '{"by": 1, "x": 2}')).status, 'invalid_args');
    assert.equal((await s.call('counter', '{"by": ')).status, 'invalid_args');
    assert.equal((await s.call('counter', '{}')).status, 'invalid_args');
    assert.equal((await new ToolSet().add(new CalculatorTool()).session('t').call('calculator', '{"expression": 5}')).status, 'invalid_args');
  });

  test('timeout per call, unknown tool, errors in the tool', async () => {
    const set = new ToolSet({ defaultTimeoutMs: 50 }).add(sleeper).add(new CalculatorTool());
    const s = set.session('t');
    const slow = await s.call('sleep', '{"ms": 5000}');
    assert.equal(slow.status, 'timeout');
    assert.ok(slow.latencyMs < 1000);
    assert.equal((await s.call('sleep', '{"ms": 1}')).status, 'ok');
    const unknown = await s.call('python', '{}');
    assert.equal(unknown.status, 'unknown_tool');
    assert.match(unknown.text, /Available tools: sleep, calculator/);
    const err = await s.call('calculator', '{"expression": "process.exit()"}');
    assert.equal(err.status, 'error');
    assert.match(err.text, /^Error: /);
  });

  test('YAML config: built-in, schema override, module tool, bad entries named', async () => {
    const dir = tempDir('tools');
    writeFileSync(
      join(dir, 'echo.ts'),
      `export default class Echo { constructor(c) { this.prefix = c.prefix ?? ''; this.schema = { type: 'function', function: { name: 'echo', parameters: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] } } }; }
       create() {} release() {} execute(_id, args) { return { text: this.prefix + args.text }; } }\n`,
    );
    const set = await toolSetFromYaml(
      `tools:
  - class_name: calculator
    config: { timeout_ms: 1000 }
    tool_schema:
      type: function
      function:
        name: calc
        description: arithmetic
        parameters: { type: object, properties: { expression: { type: string } }, required: [expression] }
  - class_name: ./echo.ts
    config: { prefix: "> " }
`,
      { baseDir: dir },
    );
    assert.deepEqual(set.names(), ['calc', 'echo']);
    const s = set.session('t');
    assert.equal((await s.call('calc', '{"expression": "6*7"}')).text, '42');
    assert.equal((await s.call('echo', '{"text": "hi"}')).text, '> hi');
    await assert.rejects(toolSetFromYaml('tools:\n  - config: {}\n'), /tools\[0\]\.class_name must be a non-empty string/);
    await assert.rejects(toolSetFromYaml('tools:\n  - class_name: calculator\n    config: { timeout_ms: -1 }\n'), /tools\[0\]\.config\.timeout_ms must be a positive number/);
    await assert.rejects(toolSetFromYaml('tools:\n  - class_name: mcp\n    config: { transport: pigeon }\n'), /tools\[0\]\.config\.transport must be stdio or http/);
    await assert.rejects(toolSetFromYaml('tools: [', {}), /not valid YAML/);
  });
});

describe('MCP tools (real MCP server process)', () => {
  test('stdio: list, call, tool error, invalid args, through the YAML config', async () => {
    const set = await toolSetFromYaml(`tools:\n  - class_name: mcp\n    config: { transport: stdio, command: ${JSON.stringify(TSX)}, args: [${JSON.stringify(FIXTURE)}], timeout_ms: 20000 }\n`);
    try {
      assert.deepEqual(set.names().sort(), ['add', 'shout']);
      const s = set.session('t');
      const [sum, loud, empty, bad] = await Promise.all([
        s.call('add', '{"a": 2, "b": 40}'),
        s.call('shout', '{"text": "hi"}'),
        s.call('shout', '{"text": ""}'),
        s.call('add', '{"a": "two"}'),
      ]);
      assert.deepEqual([sum.status, sum.text], ['ok', '42']);
      assert.deepEqual([loud.status, loud.text], ['ok', 'HI']);
      assert.deepEqual([empty.status, empty.text], ['error', 'nothing to shout']);
      assert.equal(bad.status, 'invalid_args');
      assert.equal(set.schemas().find((x) => x.function.name === 'add')!.function.description, 'Add two numbers');
    } finally {
      await set.close();
    }
  });

  test('streamable HTTP', async () => {
    const child = spawn(TSX, [FIXTURE, '--http'], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      const [chunk] = (await once(child.stdout, 'data')) as [Buffer];
      const url = chunk.toString().trim();
      const conn = await McpConnection.connect({ transport: 'http', url }, { include: ['add'] });
      try {
        assert.deepEqual(conn.tools.map((t) => t.schema.function.name), ['add']);
        const set = new ToolSet();
        for (const t of conn.tools) set.add(t);
        const r = await set.session('t').call('add', '{"a": 0.5, "b": 0.25}');
        assert.deepEqual([r.status, r.text], ['ok', '0.75']);
      } finally {
        await conn.close();
      }
    } finally {
      child.kill('SIGTERM');
    }
  });
});

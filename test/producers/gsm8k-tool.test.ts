// verl's GSM8K tool as rlstream runs it: verl's tool YAML read as it is (class names mapped, unknown ones
// refused), calc_gsm8k_reward's reply text and step rewards as verl.tools.gsm8k_tool.Gsm8kTool gives them,
// the row's tools_kwargs reaching the tool's create step, and the example task reading verl's Parquet rows.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import '../../examples/gsm8k-tool/index.ts';
import { GSM8K_TOOL_YAML } from '../../examples/gsm8k-tool/index.ts';
import { readParquetRows } from '../../producers/dataset/files.ts';
import { tasks } from '../../producers/tasks.ts';
import { toolParser } from '../../producers/agent/tool-parser.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { loadToolConfig, toolSetFromYaml } from '../../producers/tools/config.ts';
import { Gsm8kTool, pyRepr, pyStr } from '../../producers/tools/gsm8k.ts';
import { REPO } from './helpers.ts';

const python = spawnSync('python3', ['--version']).status === 0;

describe("verl's tool YAML", () => {
  test('gsm8k_tool_config.yaml loads as it is: the class maps to calc_gsm8k_reward with the YAML schema', async () => {
    const set = await loadToolConfig(GSM8K_TOOL_YAML);
    assert.deepEqual(set.names(), ['calc_gsm8k_reward']);
    const [schema] = set.schemas();
    assert.match(schema!.function.description ?? '', /1\.0 if parsed answer is correct/);
    assert.deepEqual(schema!.function.parameters?.['required'], ['answer']);
    await set.close();
  });

  test('an unknown verl class is refused naming the field, the classes that map and the way out', async () => {
    const yaml = 'tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n  - class_name: "verl.tools.search_tool.SearchTool"\n    config: {}\n';
    await assert.rejects(toolSetFromYaml(yaml), (err: Error) => {
      assert.match(err.message, /tools\[1\]\.class_name: no rlstream tool for "verl\.tools\.search_tool\.SearchTool"/);
      assert.match(err.message, /verl\.tools\.gsm8k_tool\.Gsm8kTool/);
      assert.match(err.message, /class_name: \.\/my_tool\.ts/);
      return true;
    });
  });
});

describe('calc_gsm8k_reward behaves as verl Gsm8kTool', () => {
  test('reply text and step rewards over a trajectory: -0.05 unless the score improves', async () => {
    const set = await loadToolConfig(GSM8K_TOOL_YAML);
    const session = set.session('t1', { calc_gsm8k_reward: { create_kwargs: { ground_truth: '72' } } });
    const calls: [string, string, number][] = [
      ['{"answer": "71"}', "Current parsed answer='71' reward=0.0", -0.05], // not above the initial 0.0
      ['{"answer": "72"}', "Current parsed answer='72' reward=1.0", 0],
      ['{"answer": "#### 72"}', "Current parsed answer='#### 72' reward=1.0", -0.05], // no improvement
      ['{"answer": 72}', "Current parsed answer='72' reward=1.0", -0.05], // str() of a number, no schema refusal
      ['{"answer": "no idea"}', "Current parsed answer='no idea' reward=0", -0.05], // no number: compute_score's int 0
      ['{}', "Current parsed answer='' reward=0", -0.05],
      ['{"answer": "it\'s 72"}', `Current parsed answer="it's 72" reward=1.0`, 0], // Python's repr picks double quotes
    ];
    for (const [args, text, reward] of calls) {
      const out = await session.call('calc_gsm8k_reward', args);
      assert.equal(out.status, 'ok', args);
      assert.equal(out.text, text, args);
      assert.equal(out.reward, reward, args);
    }
    const bad = await session.call('calc_gsm8k_reward', '{"answer": ');
    assert.equal(bad.status, 'invalid_args'); // verl's loop: json.loads fails, reward 0
    assert.equal(bad.reward, 0);
    // No final reward of its own: verl's ToolAgentLoop keeps only the step rewards.
    assert.deepEqual(await session.finish(), []);
    await set.close();
  });

  test('the ground truth comes from the row through create_kwargs, one instance per trajectory', async () => {
    const set = await loadToolConfig(GSM8K_TOOL_YAML);
    const a = set.session('a', { calc_gsm8k_reward: { create_kwargs: { ground_truth: '5' } } });
    const b = set.session('b', { calc_gsm8k_reward: { create_kwargs: { ground_truth: '6' } } });
    assert.equal((await a.call('calc_gsm8k_reward', '{"answer": "5"}')).text, "Current parsed answer='5' reward=1.0");
    assert.equal((await b.call('calc_gsm8k_reward', '{"answer": "5"}')).text, "Current parsed answer='5' reward=0.0");
    await Promise.all([a.finish(), b.finish()]);
    await set.close();
  });

  test("a non-object argument is an error the model reads, as verl's loop reports the exception", () => {
    const tool = new Gsm8kTool();
    tool.create('i', { ground_truth: '1' });
    const r = tool.execute('i', [1, 2] as unknown as Record<string, unknown>);
    assert.equal(r.isError, true);
    assert.equal(r.reward, 0);
  });

  test("pyRepr / pyStr agree with Python's repr() and str()", { skip: !python && 'python3 is not installed' }, () => {
    const strings = ['72', "it's", 'say "hi"', `both ' and "`, 'a\\b', 'line\nbreak\ttab\r', '\x07bell\x7f', 'café 😀', '\u2028sep\u00a0nbsp', '\u200bzw'];
    const values: unknown[] = [72, 7.5, -3, true, false, null, [1, 'a'], { k: 'v', n: [true] }];
    const script = 'import json,sys\nd=json.load(sys.stdin)\nprint(json.dumps([repr(s) for s in d["s"]] + [str(v) for v in d["v"]]))';
    const r = spawnSync('python3', ['-c', script], { input: JSON.stringify({ s: strings, v: values }), encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual([...strings.map(pyRepr), ...values.map(pyStr)], JSON.parse(r.stdout) as string[]);
  });
});

describe('the gsm8k-tool task', () => {
  test("reads verl's Parquet rows as they are: agent_name, tools_kwargs, the reward under openai/gsm8k", async () => {
    const task = tasks.get('gsm8k-tool').create({ tool_config: GSM8K_TOOL_YAML }, { seed: 1, baseDir: REPO, dataset: { train: null, heldout: null, loader: null } });
    const rows = [];
    for await (const row of task.trainRows(0)) rows.push(row);
    const direct = [];
    for await (const row of readParquetRows(join(REPO, 'examples', 'gsm8k-tool', 'data', 'train.parquet'))) direct.push(row);
    assert.deepEqual(rows, direct);
    assert.ok(rows.length >= 30);
    for (const row of rows) {
      assert.equal(row.agent_name, 'tool_agent');
      assert.equal(row.extra_info?.tools_kwargs?.['calc_gsm8k_reward']?.create_kwargs?.['ground_truth'], row.reward_model.ground_truth);
    }
    const held = await task.heldoutRows(5);
    assert.equal(held.length, 5);
    assert.equal(held[0]!.extra_info?.split, 'test');
    const reward = task.rewards!['openai/gsm8k']!;
    assert.deepEqual(await reward('openai/gsm8k', 'so #### 72', '72', {}), { score: 1, correct: true });
    assert.deepEqual(await reward('openai/gsm8k', 'so 72', '72', {}), { score: 0, correct: false }); // strict: needs "#### "
  });

  test('SFT demonstrations teach the protocol: a call the parser reads, verl\'s reply (not trained on), the answer', async () => {
    const tok = ChatTokenizer.load(join(REPO, 'examples', 'calculator', 'tokenizer'));
    const task = tasks.get('gsm8k-tool').create({ tool_config: GSM8K_TOOL_YAML }, { seed: 1, baseDir: REPO, dataset: { train: null, heldout: null, loader: null } });
    const [demo] = await task.sftExamples!(tok, { problems: 1, seed: 1, options: {} });
    assert.ok(demo);
    assert.equal(demo.tokens.length, demo.responseMask.length);
    const trained = tok.decode(demo.tokens.filter((_, i) => demo.responseMask[i] === 1));
    const parsed = toolParser('hermes')!.parse(trained.split('<|im_end|>')[0]!);
    assert.deepEqual(parsed.calls.map((c) => [c.name, JSON.parse(c.argumentsJson)]), [['calc_gsm8k_reward', { answer: '72' }]]);
    assert.match(trained, /#### 72<\|im_end\|>$/);
    const observed = tok.decode(demo.tokens.filter((_, i) => demo.responseMask[i] === 0));
    assert.match(observed, /Current parsed answer='72' reward=1\.0/);
    assert.doesNotMatch(trained, /Current parsed/);
  });
});

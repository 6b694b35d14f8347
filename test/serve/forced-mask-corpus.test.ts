// The forced prefix of tool_choice (required / a named function) is never trained on, and nothing the policy sampled
// is lost from training: over a generated corpus of tool sets, choices, tool-call formats (every parser that can be
// forced), real tokenizers, token budgets that cut inside and after the prefix, and stop strings that may end the turn
// inside the forced text, the recorded turn has mask 0, log-prob 0 and version -1 on exactly the forced tokens it
// holds (a prefix of the forced ids) and mask 1 with the backend's log-prob and version on every sampled token. The
// chain is the one a serve session builds: forcePrefix, then stopAt, then the trajectory recorder.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { rng } from '../../core/random.ts';
import { ScriptedBackend } from '../../producers/backends/scripted.ts';
import type { GenerateResult, LlmBackend } from '../../producers/backends/types.ts';
import { TrajectoryRecorder } from '../../producers/agent/recorder.ts';
import { toolParser, toolParserNames } from '../../producers/agent/tool-parser.ts';
import { forcedCallIds, forcePrefix, type ToolChoice } from '../../producers/serve/constrain.ts';
import { stopAt } from '../../producers/serve/session.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { TurnCompleted } from '../../schemas/generated/types.ts';
import { qwen3 } from '../producers/helpers.ts';

const REPO = join(import.meta.dirname, '..', '..');
const LLAMA = ChatTokenizer.load(join(REPO, 'node_modules', '@lenml', 'tokenizer-llama3_1', 'models'), join(REPO, 'test', 'producers', 'fixtures', 'templates', 'llama3_1-instruct.jinja'));
const TOKENIZERS = { qwen3: qwen3(), llama3_1: LLAMA };
const CASES = 400;
const LOGPROB = -0.5;
const VERSION = 7;

function identifier(rand: () => number): string {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz_0123456789';
  const n = 1 + Math.floor(rand() * 12);
  let s = 'abcdefghijklmnopqrstuvwxyz'[Math.floor(rand() * 26)]!;
  for (let i = 1; i < n; i++) s += alphabet[Math.floor(rand() * alphabet.length)]!;
  return s;
}

test('forced tool-call prefixes: mask 0 on exactly the forced tokens kept, mask 1 on every sampled one (generated corpus)', { timeout: 120_000 }, async () => {
  const rand = rng(49);
  const parsers = toolParserNames().map((n) => toolParser(n)!).filter((p) => p.callPrefix !== undefined);
  assert.ok(parsers.length >= 3, `every family's format that can be forced: ${parsers.map((p) => p.name).join(', ')}`);
  const seen = { cutInPrefix: 0, stoppedInPrefix: 0, sampledAfter: 0 };
  for (let c = 0; c < CASES; c++) {
    const parser = parsers[c % parsers.length]!;
    const [tokName, tok] = Object.entries(TOKENIZERS)[Math.floor(rand() * 2)]!;
    const tools = [...new Set(Array.from({ length: 1 + Math.floor(rand() * 4) }, () => identifier(rand)))];
    const choice: ToolChoice = rand() < 0.5 ? 'required' : { name: tools[Math.floor(rand() * tools.length)]! };
    const forced = forcedCallIds(choice, tools, parser, tok)!;
    // What the policy writes after the prefix: arguments, sometimes with text that holds the stop string.
    const rest = `{"x": ${Math.floor(rand() * 1000)}}}${rand() < 0.3 ? ' STOP more' : ''}`;
    const backend = new ScriptedBackend({ tokenizer: tok, script: () => rest, logprob: LOGPROB });
    await backend.updatePolicy({ version: VERSION } as never);
    const maxNew = 1 + Math.floor(rand() * (forced.length + 12));
    // A stop string drawn from the forced text itself (so the turn may end inside the prefix), or one only the
    // policy's text holds, or none.
    const prefixText = tok.decode(forced);
    const r = rand();
    const stops = r < 0.3 && prefixText.length > 2 ? [prefixText.slice(1 + Math.floor(rand() * (prefixText.length - 1)), prefixText.length).slice(0, 3)] : r < 0.6 ? ['STOP'] : [];
    let chain: LlmBackend = forcePrefix(backend, forced);
    if (stops.length > 0) chain = stopAt(chain, stops, tok);
    const what = `case ${c}: ${parser.name} on ${tokName}, tools ${JSON.stringify(tools)}, choice ${JSON.stringify(choice)}, max ${maxNew}, stops ${JSON.stringify(stops)}`;
    const gen: GenerateResult = await chain.generate({ requestId: `r${c}`, promptIds: tok.encode('hello'), sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: maxNew, seed: null, stop_token_ids: [] } } as never);

    const turns: TurnCompleted[] = [];
    const rec = new TrajectoryRecorder(
      { runId: 'corpus', trajectoryId: `t${c}`, groupId: `g${c}`, sampleIndex: 0, groupSize: 1, agentName: 'serve', dataSource: 'corpus', dataset: { name: 'corpus', split: 'train', index: c } as never, groundTruth: '', extraInfoJson: '{}' },
      tok.encode('hello'),
      tok,
      { turn: (e) => turns.push(e), toolCall: () => {} },
    );
    rec.addAssistant(gen, tok.decode(gen.tokenIds, { skipSpecialTokens: true }), [], null);

    const kept = gen.forced ?? 0;
    const n = gen.tokenIds.length;
    assert.ok(n <= maxNew, `${what}: ${n} tokens within max_new_tokens`);
    assert.ok(kept <= forced.length && kept <= n, `${what}: forced ${kept} of ${forced.length}, ${n} tokens`);
    assert.deepEqual(gen.tokenIds.slice(0, kept), forced.slice(0, kept), `${what}: the forced tokens lead the turn`);
    // Every token before the prefix ended is a forced one: a turn cut inside the prefix is all forced.
    assert.equal(kept, Math.min(n, forced.length), `${what}: every prefix token the turn holds counts as forced`);
    const mask = gen.tokenIds.map((_, i) => (i < kept ? 0 : 1));
    assert.deepEqual(rec.responseMask, mask, `${what}: response_mask`);
    assert.deepEqual(turns[0]!.response_mask, mask, `${what}: the TurnCompleted's response_mask`);
    assert.deepEqual(rec.logprobs, gen.tokenIds.map((_, i) => (i < kept ? 0 : LOGPROB)), `${what}: log-probs`);
    assert.deepEqual(rec.versions, gen.tokenIds.map((_, i) => (i < kept ? -1 : VERSION)), `${what}: versions`);
    assert.equal(turns[0]!.policy_version, n > kept ? VERSION : -1, `${what}: the turn's version is the sampled tokens'`);
    if (maxNew < forced.length) seen.cutInPrefix++;
    if (stops.length > 0 && gen.finishReason === 'stop' && n < Math.min(maxNew, forced.length)) seen.stoppedInPrefix++;
    if (n > kept) seen.sampledAfter++;
  }
  // The corpus reached every region it is meant to: cut by the budget inside the prefix, ended by a stop string
  // inside it, and sampled tokens after it.
  assert.ok(seen.cutInPrefix >= 20 && seen.stoppedInPrefix >= 10 && seen.sampledAfter >= 100, JSON.stringify(seen));
  process.stderr.write(`# forced-mask corpus: ${CASES} cases ${JSON.stringify(seen)}\n`);
});

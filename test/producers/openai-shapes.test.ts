// The openai backend's reading of the answer shapes that llama.cpp cannot show: vLLM's token_ids and
// "token_id:N" tokens, and a text-only server whose ids are re-derived with the tokenizer (the re-derivation's
// mismatch counted, and the turn's total log-prob kept). The llama.cpp shape is covered against the real
// server in openai-llama.test.ts; these are parser inputs written by hand, named as such.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { idsFromChoice, openAiCompletionBody, rederive } from '../../producers/backends/openai.ts';
import { qwen3 } from './helpers.ts';

const E = 'http://server/v1/completions';

describe('openai backend: where the sampled token ids are read from', () => {
  test('choices[0].token_ids (vLLM return_token_ids, SGLang) with token_logprobs', () => {
    assert.deepEqual(idsFromChoice(E, { token_ids: [5, 6], logprobs: { tokens: ['a', 'b'], token_logprobs: [-0.5, -1] } }), { tokenIds: [5, 6], logprobs: [-0.5, -1] });
  });

  test('logprobs.content[].id (llama.cpp) and "token_id:N" (vLLM)', () => {
    assert.deepEqual(idsFromChoice(E, { logprobs: { content: [{ id: 9, token: 'x', logprob: -0.25 }] } }), { tokenIds: [9], logprobs: [-0.25] });
    assert.deepEqual(idsFromChoice(E, { logprobs: { tokens: ['token_id:3', 'token_id:4'], token_logprobs: [-1, null] } }), { tokenIds: [3, 4], logprobs: [-1, 0] });
  });

  test('no ids: null (re-derive); ids without matching log-probs: a bad response', () => {
    assert.equal(idsFromChoice(E, { text: 'hi', logprobs: { tokens: ['h', 'i'], token_logprobs: [-1, -1] } }), null);
    assert.throws(() => idsFromChoice(E, { token_ids: [1, 2], logprobs: { token_logprobs: [-1] } }), /2 token ids but 1 log-probs/);
    assert.throws(() => idsFromChoice(E, { token_ids: [1] }), /no log-probs/);
  });

  test('re-derived ids: same count keeps the log-probs; a different count is a mismatch that keeps the total', () => {
    const tok = qwen3();
    const text = 'The answer is 42.';
    const ids = tok.encode(text);
    const pieces = ids.map((id) => tok.decode([id]));
    const same = rederive(text, pieces, pieces.map((_, i) => -0.1 * (i + 1)), tok);
    assert.equal(same.mismatch, false);
    assert.deepEqual(same.tokenIds, ids);
    // A server that split the text into characters: one log-prob per character.
    const chars = [...text];
    const lps = chars.map(() => -0.2);
    const r = rederive(text, chars, lps, tok);
    assert.equal(r.mismatch, true);
    assert.deepEqual(r.tokenIds, ids);
    assert.equal(r.logprobs.length, ids.length);
    assert.ok(Math.abs(r.logprobs.reduce((a, b) => a + b, 0) - lps.reduce((a, b) => a + b, 0)) < 1e-9);
    // Each token gets the log-probs of the characters it spans.
    assert.ok(Math.abs(r.logprobs[0]! - -0.2 * pieces[0]!.length) < 1e-9);
  });

  test('request: the prompt as token ids, logprobs 1, extensions and extra_body', () => {
    const body = openAiCompletionBody('m', [1, 2, 3], { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 8, seed: null, stop_token_ids: [2] }, { grammar: 'root ::= "x"' });
    assert.deepEqual(body['prompt'], [1, 2, 3]);
    assert.equal(body['logprobs'], 1);
    assert.equal(body['max_tokens'], 8);
    assert.equal('top_k' in body, false);
    assert.equal('seed' in body, false);
    assert.equal(body['grammar'], 'root ::= "x"');
  });
});

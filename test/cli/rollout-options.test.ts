// The run's rollout options (cli/run/roles.ts rolloutOptions): the compiled `rollout` section completed with the
// trainer's staleness gate, the task's dataset name and the model directory's defaults, on a real run context
// (the calculator example's config, an embedded log in a temporary directory, a tokenizer directory with a
// generation_config.json of its own).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { openRunContext } from '../../cli/run/context.ts';
import { loadTokenizer, rolloutOptions } from '../../cli/run/roles.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { SAMPLING_FALLBACK } from '../../producers/options.ts';

const EXAMPLE = join(import.meta.dirname, '..', '..', 'examples', 'calculator');

async function optionsFor(overrides: Record<string, unknown>, generationConfig: Record<string, unknown> | null) {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-rollout-options-'));
  try {
    const tokenizerDir = join(dir, 'tokenizer');
    cpSync(join(EXAMPLE, 'tokenizer'), tokenizerDir, { recursive: true });
    if (generationConfig) writeFileSync(join(tokenizerDir, 'generation_config.json'), JSON.stringify(generationConfig));
    const config = loadRunConfig(join(EXAMPLE, 'config.yaml'), { 'log.dir': join(dir, 'log'), 'model.tokenizer': tokenizerDir, ...overrides });
    const ctx = await openRunContext(config, silentLogger);
    try {
      const tokenizer = loadTokenizer({ tokenizerDir, chatTemplate: config.model.chatTemplate });
      return { options: rolloutOptions(ctx, tokenizer), eos: tokenizer.eosTokenId, config };
    } finally {
      await ctx.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("the staleness gate is the trainer's, the dataset the task's, the sampling the section's, then the model's, then the fallback", async () => {
  const { options: o, eos, config } = await optionsFor({ 'trainer.staleness_bound': 3, 'trainer.groups_per_step': 5, 'rollout.sampling.top_k': 0 }, { eos_token_id: [4, 5], temperature: 0.6, top_p: 0.95, top_k: 20 });
  assert.deepEqual([o.stalenessBound, o.groupsPerStep], [3, 5]);
  assert.equal(o.datasetName, 'calculator');
  // config.yaml sets temperature 1.0 and the override top_k 0: they win over generation_config.json; top_p is the model's.
  assert.deepEqual([o.sampling.temperature, o.sampling.top_p, o.sampling.top_k], [1, 0.95, 0]);
  assert.equal(o.sampling.max_new_tokens, config.rollout.responseLength);
  assert.deepEqual(o.sampling.stop_token_ids, [...new Set([...(eos !== null ? [eos] : []), 4, 5])]);
  // The example's model is qwen2: the hermes format.
  assert.equal(o.toolParser, 'hermes');
  assert.deepEqual([o.n, o.maxAssistantTurns, o.defaultAgent, o.epochs], [8, 3, 'tool_agent', null]);
  assert.ok(Object.isFrozen(o) && Object.isFrozen(o.sampling));
});

test('without generation_config.json the fallback fills what the section leaves null; the chat template, else the model family, picks the parser', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-rollout-family-'));
  try {
    const model = JSON.parse(readFileSync(join(EXAMPLE, 'model.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(dir, 'model.json'), JSON.stringify({ ...model, model_type: 'mistral', architectures: ['MistralForCausalLM'], attention_bias: false }));
    const { options: o } = await optionsFor({ 'rollout.sampling.temperature': null, 'model.config': join(dir, 'model.json') }, null);
    assert.deepEqual([o.sampling.temperature, o.sampling.top_p, o.sampling.top_k], [SAMPLING_FALLBACK.temperature, SAMPLING_FALLBACK.top_p, SAMPLING_FALLBACK.top_k]);
    // the example's template writes Hermes <tool_call> blocks, so a mistral under it still parses those
    assert.equal(o.toolParser, 'hermes');
    // a template that spells no format's marker: the family's format
    writeFileSync(join(dir, 'plain.jinja'), '{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}');
    const family = await optionsFor({ 'model.config': join(dir, 'model.json'), 'model.chat_template': join(dir, 'plain.jinja') }, null);
    assert.equal(family.options.toolParser, 'mistral');
    const named = await optionsFor({ 'rollout.tool_parser': 'hermes', 'model.config': join(dir, 'model.json'), 'model.chat_template': join(dir, 'plain.jinja') }, null);
    assert.equal(named.options.toolParser, 'hermes');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

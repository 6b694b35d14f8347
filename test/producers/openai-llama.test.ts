// The `openai` backend against a real inference server: llama.cpp's server running SmolLM2-135M-Instruct
// (built and fetched by infra/setup.sh). GSM8K rows in verl's format go through the tool agent with verl's
// calc_gsm8k_reward tool. A llama.cpp grammar (passed through backend.extra_body) makes the small model write a
// tool call every turn, well-formed or (second grammar) malformed; the tokens, their log-probs and how the model
// split the call into tokens are its own. Then the server is killed mid-rollout, and two servers share sessions.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import '../../examples/gsm8k-tool/index.ts';
import { GSM8K_TOOL_YAML } from '../../examples/gsm8k-tool/index.ts';
import { compileValue } from '../../core/config/validate.ts';
import { jsonLogger, silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { backends } from '../../producers/backends/registry.ts';
import type { ServerManager } from '../../producers/backends/server-manager.ts';
import type { GenerateRequest, GenerateResult, LlmBackend } from '../../producers/backends/types.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import { tasks } from '../../producers/tasks.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import type { Trajectory } from '../../schemas/generated/types.ts';
import { embeddedLog, readTopic, REPO, rolloutOptionsFor, type TestLog } from './helpers.ts';
import { llamaServerMissing, smolTokenizer, smolTokenizerDir, startLlamaServer, type LlamaServer } from './llama-server.ts';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import type { RunContext } from '../../cli/run/context.ts';
import { resolvePlugins } from '../../cli/run/plugins.ts';
import { createBackend, createWorker } from '../../cli/run/roles.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const missing = llamaServerMissing();
const CALL = '"<tool_call>\\n{\\"name\\": \\"calc_gsm8k_reward\\", \\"arguments\\": {\\"answer\\": ';
/** A call with a quoted number as the answer: valid JSON. */
const VALID_CALL = `root ::= ${CALL}\\"" [0-9]{1,4} "\\"}}\\n</tool_call>"`;
/** The closing braces left out: the parser must record it as an invalid call. */
const MALFORMED_CALL = `root ::= ${CALL}" [0-9]{1,4} "\\n</tool_call>"`;

async function openaiBackend(urls: string[], extra: Record<string, unknown> = {}): Promise<ServerManager> {
  const plugin = backends.get('openai');
  const options = compileValue(plugin.options, { urls, health_interval_ms: 0, ...extra }, 'backend');
  return (await plugin.create(options, { configJson: '', initWeights: '', tokenizerDir: '', baseDir: REPO, interrupt: 'next_turn', logger: silentLogger })) as ServerManager;
}

async function gsm8kRows(n: number): Promise<DatasetRow[]> {
  const task = tasks.get('gsm8k-tool').create({ tool_config: GSM8K_TOOL_YAML }, { seed: 1, baseDir: REPO, dataset: { train: null, heldout: null, loader: null } });
  const rows: DatasetRow[] = [];
  for await (const row of task.trainRows(0)) {
    rows.push(row);
    if (rows.length >= n) break;
  }
  return rows;
}

async function rollout(t: TestLog, backend: LlmBackend, rows: DatasetRow[], runId: string, options: { turns?: number } = {}): Promise<{ trajs: Trajectory[]; worker: RolloutWorker }> {
  const worker = new RolloutWorker(
    { runId, log: t.log, serde: t.serde, backend, tokenizer: smolTokenizer(), tools: await loadToolConfig(GSM8K_TOOL_YAML), followPolicy: false, logger: process.env['RLSTREAM_TEST_DEBUG'] ? jsonLogger({ level: 'debug' }) : silentLogger },
    rolloutOptionsFor({ staleness_bound: null, max_assistant_turns: options.turns ?? 3, max_user_turns: 3, response_length: 400, tokenization_check: 'ignore_strippable', tokenization_check_every: 1 }),
  );
  const trajs = await worker.evaluate(rows, { split: 'test', sampling: { max_new_tokens: 64, seed: 7 } });
  return { trajs, worker };
}

/** Token-level consistency of one trajectory with the chat template and with itself. */
function checkTokens(traj: Trajectory, row: DatasetRow): void {
  const tok = smolTokenizer();
  assert.deepEqual(traj.prompt_ids, tok.apply(row.prompt, { tools: [], addGenerationPrompt: true }).slice(0, traj.prompt_ids.length));
  assert.equal(traj.response_ids.length, traj.response_mask.length);
  assert.equal(traj.response_ids.length, traj.response_logprobs.length);
  for (let k = 0; k < traj.turn_roles.length; k++) {
    const [from, to] = [traj.turn_offsets[k]!, traj.turn_offsets[k + 1] ?? traj.response_ids.length];
    const mask = traj.turn_roles[k] === 'assistant' ? 1 : 0;
    assert.ok(traj.response_mask.slice(from, to).every((m) => m === mask), `turn ${k} (${traj.turn_roles[k]}) mask`);
    const lps = traj.response_logprobs.slice(from, to);
    if (mask === 1) assert.ok(lps.every((x) => Number.isFinite(x) && x <= 0), `turn ${k}: sampled tokens have log-probs <= 0`);
    else {
      assert.ok(lps.every((x) => x === 0), `turn ${k}: observation tokens carry no log-prob`);
      // The observation is the template's tool turn around verl's reply text, led by the newline the template
      // writes after <|im_end|> when the turn before stopped at it.
      assert.match(tok.decode(traj.response_ids.slice(from, to)), /^\n?<\|im_start\|>tool\n/);
    }
  }
}

describe('openai backend → llama.cpp server (SmolLM2-135M-Instruct)', { skip: missing ?? false }, () => {
  let server: LlamaServer;
  let t: TestLog;
  before(async () => {
    server = await startLlamaServer({ slots: 2 });
    t = await embeddedLog();
  });
  after(async () => {
    await server?.stop();
    await t?.cleanup();
  });

  test('multi-turn GSM8K tool rollouts: real tokens and log-probs, parsed calls, verl tool replies and step rewards', async () => {
    const rows = await gsm8kRows(2);
    const backend = await openaiBackend([server.url], { extra_body: { grammar: VALID_CALL } });
    const { trajs, worker } = await rollout(t, backend, rows, 'llama-valid');
    const snap = worker.snapshot();
    await worker.stop();
    assert.equal(trajs.length, 2);
    for (const [i, traj] of trajs.entries()) {
      assert.notEqual(traj.termination, 'error');
      assert.deepEqual(traj.turn_roles, ['assistant', 'tool', 'assistant', 'tool', 'assistant']);
      // The third turn's call is not run: the turn limit ends the loop first (as in verl's ToolAgentLoop).
      assert.equal(traj.num_tool_calls, 2);
      assert.equal(traj.termination, 'max_turns');
      assert.equal(traj.num_invalid_tool_calls, 0);
      // verl's Gsm8kTool: 0 only for a submission that raised the score, else -0.05.
      assert.ok(traj.tool_rewards.every((r) => r === 0 || r === -0.05));
      const tok = smolTokenizer();
      const toolText = tok.decode(traj.response_ids.slice(traj.turn_offsets[1]!, traj.turn_offsets[2]!));
      assert.match(toolText, /Current parsed answer='\d+' reward=(0\.0|1\.0)/);
      checkTokens(traj, rows[i]!);
    }
    // The check re-tokenizes the whole conversation after each tool turn. The only differences allowed are the
    // model's own: where it spelled a text in other tokens than the tokenizer would (it may: "<tool_cal" + "l>"),
    // every later check differs. Anything else (template, delta rendering, ids lost or shifted) would add more.
    const tok = smolTokenizer();
    let expected = 0;
    for (const traj of trajs) {
      let offCanonical = false;
      for (let k = 0; k < traj.turn_roles.length; k++) {
        const ids = traj.response_ids.slice(traj.turn_offsets[k]!, traj.turn_offsets[k + 1] ?? traj.response_ids.length);
        if (traj.turn_roles[k] === 'assistant') {
          const body = ids[ids.length - 1] !== undefined && tok.isSpecial(ids[ids.length - 1]!) ? ids.slice(0, -1) : ids;
          if (tok.encode(tok.decode(body)).join() !== body.join()) offCanonical = true;
        } else if (offCanonical) expected++;
      }
    }
    assert.equal(snap.counters['tokenization_mismatches'] ?? 0, expected, 'every re-tokenization difference is the model\'s own spelling');
    assert.equal(snap.counters['retokenized_turns'] ?? 0, 0, 'llama.cpp returns token ids: nothing re-derived');
  });

  test('alternatives (topLogprobs) are the server\'s own: the greedy token is the best alternative at its log-prob, k of them, most probable first', async () => {
    const backend = await openaiBackend([server.url]);
    assert.equal(backend.maxTopLogprobs, 20);
    const tok = smolTokenizer();
    const promptIds = tok.encode('The capital of France is');
    const greedy = await backend.generate({ requestId: 'alt-0', promptIds, sampling: { temperature: 0, top_p: 1, top_k: 0, max_new_tokens: 8, seed: 1, stop_token_ids: [] }, topLogprobs: 4 });
    assert.equal(greedy.topLogprobs!.length, greedy.tokenIds.length);
    for (const [i, alts] of greedy.topLogprobs!.entries()) {
      assert.equal(alts.length, 4);
      for (let j = 1; j < alts.length; j++) assert.ok(alts[j]!.logprob <= alts[j - 1]!.logprob);
      assert.ok(alts.reduce((m, a) => m + Math.exp(a.logprob), 0) <= 1 + 1e-5);
      // Greedy: the token taken is the most probable one, with the log-prob the server reported for it.
      assert.equal(alts[0]!.token, greedy.tokenIds[i], `token ${i}`);
      assert.ok(Math.abs(alts[0]!.logprob - greedy.logprobs[i]!) < 1e-6);
    }
    // Sampled: the sampled token is among its alternatives whenever it is at least as likely as the last of them.
    const sampled = await backend.generate({ requestId: 'alt-1', promptIds, sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 16, seed: 7, stop_token_ids: [] }, topLogprobs: 20 });
    for (const [i, alts] of sampled.topLogprobs!.entries()) {
      assert.equal(alts.length, 20);
      if (sampled.logprobs[i]! > alts[19]!.logprob + 1e-6) assert.ok(alts.some((a) => a.token === sampled.tokenIds[i] && Math.abs(a.logprob - sampled.logprobs[i]!) < 1e-6), `token ${i}`);
    }
    // Without asking, none.
    assert.equal((await backend.generate({ requestId: 'alt-2', promptIds, sampling: { temperature: 0, top_p: 1, top_k: 0, max_new_tokens: 2, seed: 1, stop_token_ids: [] } })).topLogprobs, undefined);
    await backend.close();
  });

  test('a malformed call from the model is recorded as invalid and the trajectory goes on', async () => {
    const rows = await gsm8kRows(1);
    const backend = await openaiBackend([server.url], { extra_body: { grammar: MALFORMED_CALL } });
    const { trajs, worker } = await rollout(t, backend, rows, 'llama-malformed', { turns: 2 });
    await worker.stop();
    const [traj] = trajs;
    assert.ok(traj);
    assert.equal(traj.num_tool_calls, 0);
    assert.ok(traj.num_invalid_tool_calls >= 1);
    assert.deepEqual(traj.turn_roles, ['assistant', 'tool', 'assistant']);
    assert.equal(traj.termination, 'max_turns');
    checkTokens(traj, rows[0]!);
  });

  test('the server killed mid-rollout: retries, then a clear failure counted, every trajectory published whole', async () => {
    const victim = await startLlamaServer({ slots: 2 });
    const rows = await gsm8kRows(2);
    const manager = await openaiBackend([victim.url], { extra_body: { grammar: VALID_CALL }, max_retries: 2 });
    let killed = false;
    // The kill comes after the first answer: later turns (and the other trajectory's) meet a dead server.
    const backend: LlmBackend = Object.assign(Object.create(manager) as LlmBackend, {
      async generate(req: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
        const out = await manager.generate(req, signal);
        if (!killed) {
          killed = true;
          victim.kill();
        }
        return out;
      },
    });
    try {
      const { trajs, worker } = await rollout(t, backend, rows, 'llama-killed');
      const snap = worker.snapshot();
      await worker.stop();
      assert.ok(killed);
      assert.equal(trajs.length, 2);
      assert.ok(trajs.every((x) => x.termination === 'error'));
      assert.equal(snap.counters['trajectory_errors'], 2);
      const [stats] = manager.stats();
      assert.ok(stats!.failures >= 3, `each failed call was tried 3 times (failures: ${stats!.failures})`);
      // Published whole: each trajectory's events end with its TrajectoryCompleted, and its turns add up.
      const ofRun = (e: { event: { value: unknown } }) => JSON.stringify(e.event.value).includes('"llama-killed"');
      const events = await readTopic(t, TOPICS.rolloutEvents, snap.eventsPublished, 20_000, ofRun);
      assert.equal(events.length, snap.eventsPublished);
      const completed = events.filter((e) => e.event.name === 'TrajectoryCompleted');
      assert.equal(completed.length, 2);
      assert.equal(events.filter((e) => e.event.name === 'TrajectoryStarted').length, 2);
      for (const traj of trajs) checkTokens(traj, rows[trajs.indexOf(traj)]!);
    } finally {
      await victim.stop();
    }
  });

  test('two servers: sessions spread by least in flight, every later turn goes where the first went', async () => {
    const second = await startLlamaServer({ slots: 2 });
    try {
      const rows = await gsm8kRows(4);
      const manager = await openaiBackend([server.url, second.url], { extra_body: { grammar: VALID_CALL } });
      const routes = new Map<string, string[]>();
      const backend: LlmBackend = Object.assign(Object.create(manager) as LlmBackend, {
        async generate(req: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
          const out = await manager.generate(req, signal);
          routes.set(req.sessionId!, [...(routes.get(req.sessionId!) ?? []), out.server]);
          return out;
        },
      });
      const { trajs, worker } = await rollout(t, backend, rows, 'llama-sticky', { turns: 2 });
      await worker.stop();
      assert.equal(trajs.length, 4);
      assert.ok(trajs.every((x) => x.termination !== 'error'));
      for (const [session, servers] of routes) {
        assert.equal(servers.length, 2, `${session}: two turns`);
        assert.equal(new Set(servers).size, 1, `${session}: both turns on one server`);
      }
      const used = new Set([...routes.values()].map((s) => s[0]));
      assert.deepEqual([...used].sort(), [server.url, second.url].sort(), 'the four sessions started concurrently are spread over both servers');
    } finally {
      await second.stop();
    }
  });

  test('examples/gsm8k-tool/config.yaml with backend: openai rolls out through the server', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'rlstream-gsm8k-openai-'));
    const config = loadRunConfig(join(REPO, 'examples', 'gsm8k-tool', 'config.yaml'), {
      'run.data_dir': dataDir,
      backend: { name: 'openai', urls: [server.url], health_interval_ms: 0, extra_body: { grammar: VALID_CALL } },
      // The served model's tokenizer (the example's default is the built-in policy's).
      'model.tokenizer': smolTokenizerDir(),
    });
    // The run's own plug-ins and role factories, over this test's log (the roles need no more of the context).
    const ctx = { config, plugins: await resolvePlugins(config), log: t.log, serde: t.serde, logger: silentLogger } as unknown as RunContext;
    try {
      const backend = await createBackend(ctx);
      assert.equal(backend.name, 'openai');
      const worker = await createWorker(ctx, 'cfg-openai', backend, smolTokenizer(), { followPolicy: false });
      const rows = await ctx.plugins.task.heldoutRows(1);
      const [traj] = await worker.evaluate(rows, { sampling: { max_new_tokens: 64 } });
      await worker.stop();
      assert.ok(traj);
      assert.equal(traj.agent_name, 'tool_agent'); // from the row
      assert.notEqual(traj.termination, 'error');
      assert.ok(traj.num_tool_calls >= 1, `tool calls: ${traj.num_tool_calls} (${traj.termination}: ${traj.response_text})`);
      assert.equal(traj.turn_roles[1], 'tool');
      checkTokens(traj, rows[0]!);
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

// SGLang and vLLM clients and the server manager against FAKE inference servers: small node:http servers
// that answer with the documented request/response shapes (real SGLang and vLLM need GPUs and cannot run
// here). Covers request shapes, token/log-prob parsing, retries on 5xx, stickiness, a server marked
// down then up by health checks, and weight sync (vLLM's reload_weights, SGLang's update_weights_from_disk).
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, test } from 'node:test';
import { Value } from '@sinclair/typebox/value';
import { isRlstreamError } from '../../core/errors.ts';
import { parseSafetensors, writeSafetensors } from '../../core/weights/safetensors.ts';
import { loraMetadata } from '../../native/lora.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { backends } from '../../producers/backends/registry.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { ServerManager } from '../../producers/backends/server-manager.ts';
import { SglangServer } from '../../producers/backends/sglang.ts';
import type { PolicyUpdate } from '../../producers/backends/types.ts';
import { VllmServer } from '../../producers/backends/vllm.ts';

const SAMPLING: SamplingParams = { temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 3, seed: 7, stop_token_ids: [2] };

interface Fake {
  url: string;
  bodies: Record<string, unknown>[];
  /** Every POST in order: its path and raw body ('' when none). */
  posts: { path: string; body: string }[];
  /** Answer POSTs to this path with 500 while set (a weight reload that fails on the server). */
  failPath: string | undefined;
  /** Status codes to answer the next generate calls with (then 200s). */
  failNext: number[];
  healthy: boolean;
  /** Delay generate answers (ms). */
  delayMs: number;
  server: Server;
}

async function fakeServer(kind: 'sglang' | 'vllm'): Promise<Fake> {
  const fake: Fake = { url: '', bodies: [], posts: [], failPath: undefined, failNext: [], healthy: true, delayMs: 0, server: undefined as unknown as Server };
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const json = (code: number, body: unknown) => {
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.url === '/health') return json(fake.healthy ? 200 : 503, {});
    if (req.url === '/v1/models') return json(200, { object: 'list', data: [{ id: 'fake-model', object: 'model' }] });
    const raw = Buffer.concat(chunks).toString();
    fake.posts.push({ path: req.url ?? '', body: raw });
    if (req.url === fake.failPath) return json(500, { error: 'fake reload failure' });
    // vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1): /collective_rpc answers {results: [one per
    // worker]} (null for methods returning None), /reset_prefix_cache an empty 200.
    if (kind === 'vllm' && req.url === '/collective_rpc') return json(200, { results: [null] });
    if (kind === 'vllm' && req.url === '/reset_prefix_cache') {
      res.writeHead(200);
      return res.end();
    }
    if (kind === 'sglang' && req.url === '/update_weights_from_disk') return json(200, { success: true, message: 'Succeeded to update model weights.' });
    // LoRA endpoints: vLLM answers in plain text (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), SGLang in JSON
    if (kind === 'vllm' && (req.url === '/v1/load_lora_adapter' || req.url === '/v1/unload_lora_adapter')) {
      res.writeHead(200, { 'content-type': 'text/plain' });
      return res.end(`Success: LoRA adapter '${(JSON.parse(raw) as { lora_name: string }).lora_name}' ${req.url.includes('unload') ? 'removed' : 'added'} successfully.`);
    }
    if (kind === 'sglang' && (req.url === '/load_lora_adapter' || req.url === '/unload_lora_adapter')) return json(200, { success: true, error_message: null, loaded_adapters: {} });
    const body = JSON.parse(raw || '{}') as Record<string, unknown>;
    fake.bodies.push(body);
    if (fake.delayMs > 0) await new Promise((r) => setTimeout(r, fake.delayMs));
    const fail = fake.failNext.shift();
    if (fail !== undefined) return json(fail, { error: 'fake failure' });
    if (kind === 'sglang' && req.url === '/generate') {
      const ids = body['input_ids'] as number[];
      const last = ids[ids.length - 1]!;
      // Three tokens continuing the prompt, log-probs as [logprob, token_id, text] triples.
      return json(200, {
        text: 'abc',
        output_ids: [last + 1, last + 2, last + 3],
        meta_info: {
          id: body['rid'],
          finish_reason: { type: 'length', length: 3 },
          prompt_tokens: ids.length,
          completion_tokens: 3,
          cached_tokens: 0,
          output_token_logprobs: [[-0.1, last + 1, null], [-0.2, last + 2, null], [-0.3, last + 3, null]],
        },
      });
    }
    if (kind === 'vllm' && req.url === '/v1/completions') {
      const ids = body['prompt'] as number[];
      const last = ids[ids.length - 1]!;
      return json(200, {
        id: 'cmpl-1',
        object: 'text_completion',
        created: 0,
        model: body['model'],
        choices: [
          {
            index: 0,
            text: 'ab',
            logprobs: { text_offset: [0, 1], token_logprobs: [-0.5, -0.05], tokens: [`token_id:${last + 10}`, 'token_id:2'], top_logprobs: [{ [`token_id:${last + 10}`]: -0.5 }, { 'token_id:2': -0.05 }] },
            finish_reason: 'stop',
            stop_reason: 2,
          },
        ],
        usage: { prompt_tokens: ids.length, completion_tokens: 2, total_tokens: ids.length + 2 },
      });
    }
    json(404, { error: 'not found' });
  };
  fake.server = createServer((req, res) => void handle(req, res));
  await new Promise<void>((r) => fake.server.listen(0, '127.0.0.1', r));
  fake.url = `http://127.0.0.1:${(fake.server.address() as AddressInfo).port}`;
  return fake;
}

const servers: Fake[] = [];
after(async () => {
  for (const s of servers) await new Promise((r) => s.server.close(r));
});
async function fake(kind: 'sglang' | 'vllm'): Promise<Fake> {
  const f = await fakeServer(kind);
  servers.push(f);
  return f;
}

// A model's config.json as a policy version carries it (servers loading a version need its architectures).
const MODEL_CONFIG = JSON.stringify({ architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, intermediate_size: 16, vocab_size: 32, max_position_embeddings: 64, rope_theta: 10000, rms_norm_eps: 1e-6, tie_word_embeddings: true });

describe('SGLang /generate client (fake server)', () => {
  test('request shape and parsed tokens, log-probs, finish reason', async () => {
    const f = await fake('sglang');
    const out = await new SglangServer(f.url).generate({ requestId: 'r1', promptIds: [5, 6, 7], sampling: SAMPLING });
    assert.deepEqual(out, { tokenIds: [8, 9, 10], logprobs: [-0.1, -0.2, -0.3], finishReason: 'length' });
    const body = f.bodies[0]!;
    assert.deepEqual(body['input_ids'], [5, 6, 7]);
    assert.equal(body['return_logprob'], true);
    assert.equal(body['rid'], 'r1');
    const sp = body['sampling_params'] as Record<string, unknown>;
    assert.equal(sp['max_new_tokens'], 3);
    assert.equal(sp['temperature'], 0.7);
    assert.equal(sp['top_k'], -1, 'top_k 0 (off) is sent as SGLang\'s -1');
    assert.deepEqual(sp['stop_token_ids'], [2]);
    assert.equal(sp['sampling_seed'], 7);
  });

  test('4xx is a bad request (not retried), 5xx is unavailable (retriable)', async () => {
    const f = await fake('sglang');
    f.failNext = [400];
    await assert.rejects(new SglangServer(f.url).generate({ requestId: 'r', promptIds: [1], sampling: SAMPLING }), (e) => isRlstreamError(e, 'BACKEND_BAD_REQUEST') && !e.retriable);
    f.failNext = [503];
    await assert.rejects(new SglangServer(f.url).generate({ requestId: 'r', promptIds: [1], sampling: SAMPLING }), (e) => isRlstreamError(e, 'BACKEND_UNAVAILABLE') && e.retriable);
    await assert.rejects(new SglangServer('http://127.0.0.1:1').generate({ requestId: 'r', promptIds: [1], sampling: SAMPLING }), (e) => isRlstreamError(e, 'BACKEND_UNAVAILABLE'));
  });
});

describe('vLLM /v1/completions client (fake server)', () => {
  test('token-id prompt, return_tokens_as_token_ids, "token_id:N" parsing', async () => {
    const f = await fake('vllm');
    const out = await new VllmServer(f.url).generate({ requestId: 'r1', promptIds: [40, 41], sampling: SAMPLING });
    assert.deepEqual(out, { tokenIds: [51, 2], logprobs: [-0.5, -0.05], finishReason: 'stop' });
    const body = f.bodies[0]!;
    assert.equal(body['model'], 'fake-model', 'model name asked from /v1/models');
    assert.deepEqual(body['prompt'], [40, 41]);
    assert.equal(body['return_tokens_as_token_ids'], true);
    assert.equal(body['max_tokens'], 3);
    assert.equal(body['seed'], 7);
    assert.ok(typeof body['logprobs'] === 'number');
  });
});

describe("vLLM weight sync: reload_weights through /collective_rpc (fake vLLM server)", () => {
  const req = (id: string) => ({ requestId: id, sessionId: 's', promptIds: [1, 2], sampling: SAMPLING });
  let n = 0;
  const stores: string[] = [];
  after(() => {
    for (const d of stores) rmSync(d, { recursive: true, force: true });
  });
  /** A published version as the trainer's store holds it: <sha>.safetensors among other versions. */
  function publish(version: number): PolicyUpdate {
    const store = mkdtempSync(join(tmpdir(), 'rlstream-vllm-sync-'));
    stores.push(store);
    const weightsPath = join(store, `${'ab'.repeat(31)}${String(n++).padStart(2, '0')}.safetensors`);
    writeFileSync(weightsPath, `weights of version ${version}`);
    writeFileSync(join(store, `${'cd'.repeat(32)}.safetensors`), 'another kept version');
    return { version, weightsPath, configJson: MODEL_CONFIG };
  }

  test("update_config -> reload_weights -> reset_prefix_cache, then tokens carry the new version", async () => {
    const f = await fake('vllm');
    const m = new ServerManager([new VllmServer(f.url, { model: 'fake-model', weightSync: 'reload_weights' })], { healthIntervalMs: 0 });
    assert.deepEqual((await m.generate(req('1'))).policyVersions, [0, 0]);
    const update = publish(4);
    f.posts.length = 0;
    await m.updatePolicy(update);
    const dir = join(dirname(update.weightsPath), 'served', 'v4');
    assert.deepEqual(
      f.posts.map((p) => [p.path, p.body === '' ? null : JSON.parse(p.body)]),
      [
        ['/collective_rpc', { method: 'update_config', args: [{ model_config: { model: dir } }] }],
        ['/collective_rpc', { method: 'reload_weights' }],
        ['/reset_prefix_cache', null],
      ],
    );
    // The directory vLLM reads holds this version only, as a Hugging Face model directory.
    assert.deepEqual(readdirSync(dir).sort(), ['config.json', 'model.safetensors']);
    assert.equal(readFileSync(join(dir, 'model.safetensors'), 'utf8'), 'weights of version 4');
    // the model's config.json with every key kept, the weights' dtype added (the one directory writer's output)
    assert.deepEqual(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')), { ...JSON.parse(update.configJson), torch_dtype: 'float32' });
    assert.equal(m.currentPolicyVersion(), 4);
    assert.deepEqual((await m.generate(req('2'))).policyVersions, [4, 4]);
    // The next version's directory replaces this one.
    const next = { ...update, version: 5 };
    await m.updatePolicy(next);
    assert.deepEqual(readdirSync(join(dirname(update.weightsPath), 'served')), ['v5']);
    await m.close();
  });

  test('a failed reload keeps the old version and is reported; the other server moves on', async () => {
    const a = await fake('vllm');
    const b = await fake('vllm');
    const m = new ServerManager([new VllmServer(a.url, { model: 'fake-model', weightSync: 'reload_weights' }), new VllmServer(b.url, { model: 'fake-model', weightSync: 'reload_weights' })], { healthIntervalMs: 0 });
    await m.updatePolicy(publish(1));
    b.failPath = '/collective_rpc';
    b.posts.length = 0;
    await assert.rejects(m.updatePolicy(publish(2)), (e) => isRlstreamError(e, 'BACKEND_UNAVAILABLE') && /policy version 2 reached 1 of 2 servers/.test(e.message) && /reload_weights of policy version 2 .* failed at \/collective_rpc/.test(e.message));
    assert.deepEqual(b.posts.map((p) => p.path), ['/collective_rpc'], 'nothing after the failed step, no prefix-cache reset');
    assert.equal(m.currentPolicyVersion(), 1);
    // Each server's tokens carry the version of that server's weights.
    m.markDown(b.url);
    const onA = await m.generate({ ...req('a'), sessionId: 'on-a' });
    m.markUp(b.url);
    m.markDown(a.url);
    const onB = { ...req('b'), sessionId: 'on-b' };
    const fromB = await m.generate(onB);
    m.markUp(a.url);
    assert.deepEqual([onA.server, onA.policyVersions], [a.url, [2, 2]]);
    assert.deepEqual([fromB.server, fromB.policyVersions], [b.url, [1, 1]]);
    // The next version reaches the server that failed.
    b.failPath = undefined;
    await m.updatePolicy(publish(3));
    assert.equal(m.currentPolicyVersion(), 3);
    assert.deepEqual((await m.generate(onB)).policyVersions, [3, 3]);
    await m.close();
  });

  test('a server without VLLM_SERVER_DEV_MODE (404) is named in the error', async () => {
    const f = await fake('sglang'); // answers 404 to vLLM's development endpoints, as vLLM does without dev mode
    const s = new VllmServer(f.url, { model: 'fake-model', weightSync: 'reload_weights' });
    await assert.rejects(s.updateWeights(publish(1)), (e) => isRlstreamError(e, 'BACKEND_BAD_REQUEST') && /VLLM_SERVER_DEV_MODE=1/.test(e.message));
  });

  test('backend config { name: vllm, weight_sync: reload_weights } reaches the servers', async () => {
    const f = await fake('vllm');
    const plugin = backends.get('vllm');
    const options = Value.Default(plugin.options, { urls: [f.url], model: 'fake-model', weight_sync: 'reload_weights', health_interval_ms: 0 });
    assert.ok(Value.Check(plugin.options, options));
    assert.ok(!Value.Check(plugin.options, { ...(options as object), weight_sync: 'reload' }), 'an unknown weight_sync is refused');
    const backend = await plugin.create(options as never, { configJson: '{}', initWeights: '', tokenizerDir: '', baseDir: '.', interrupt: 'next_turn', logger: silentLogger });
    await backend.updatePolicy?.(publish(6));
    assert.deepEqual(f.posts.map((p) => p.path), ['/collective_rpc', '/collective_rpc', '/reset_prefix_cache']);
    assert.equal(backend.currentPolicyVersion(), 6);
    await backend.close();
  });

  test("weight_sync 'none' sends nothing and only relabels", async () => {
    const f = await fake('vllm');
    const m = new ServerManager([new VllmServer(f.url, { model: 'fake-model' })], { healthIntervalMs: 0 });
    await m.updatePolicy(publish(2));
    assert.deepEqual(f.posts, []);
    assert.equal(m.currentPolicyVersion(), 2);
    await m.close();
  });
});

describe('SGLang weight sync (fake SGLang server)', () => {
  test('update_weights_from_disk gets a directory holding only this version', async () => {
    const f = await fake('sglang');
    const store = mkdtempSync(join(tmpdir(), 'rlstream-sglang-sync-'));
    const weightsPath = join(store, `${'ef'.repeat(32)}.safetensors`);
    writeFileSync(weightsPath, 'v7');
    writeFileSync(join(store, `${'12'.repeat(32)}.safetensors`), 'another kept version');
    await new SglangServer(f.url, { weightSync: 'update_weights_from_disk' }).updateWeights({ version: 7, weightsPath, configJson: MODEL_CONFIG });
    assert.deepEqual(f.posts.map((p) => [p.path, JSON.parse(p.body)]), [['/update_weights_from_disk', { model_path: join(store, 'served', 'v7') }]]);
    assert.deepEqual(readdirSync(join(store, 'served', 'v7')).sort(), ['config.json', 'model.safetensors']);
    rmSync(store, { recursive: true, force: true });
  });
});

describe('ServerManager', () => {
  const req = (id: string, session: string) => ({ requestId: id, sessionId: session, promptIds: [1, 2], sampling: SAMPLING });

  test('retries 5xx with backoff and succeeds', async () => {
    const f = await fake('sglang');
    f.failNext = [503, 502];
    const m = new ServerManager([new SglangServer(f.url)], { backoffBaseMs: 5, healthIntervalMs: 0, failuresToMarkDown: 10 });
    const out = await m.generate(req('a', 's1'));
    assert.deepEqual(out.tokenIds, [3, 4, 5]);
    assert.equal(f.bodies.length, 3);
    assert.equal(out.server, f.url);
    assert.deepEqual(out.policyVersions, [0, 0, 0]);
    await m.close();
  });

  test('gives up after maxRetries with BACKEND_UNAVAILABLE', async () => {
    const f = await fake('sglang');
    f.failNext = [500, 500, 500];
    const m = new ServerManager([new SglangServer(f.url)], { backoffBaseMs: 1, maxRetries: 2, healthIntervalMs: 0, failuresToMarkDown: 10 });
    await assert.rejects(m.generate(req('a', 's1')), (e) => isRlstreamError(e, 'BACKEND_UNAVAILABLE') && /after 3 attempts/.test(e.message));
    await m.close();
  });

  test('least in-flight for new sessions, sticky afterwards', async () => {
    const a = await fake('sglang');
    const b = await fake('sglang');
    a.delayMs = 50;
    const m = new ServerManager([new SglangServer(a.url), new SglangServer(b.url)], { healthIntervalMs: 0 });
    // s1 takes a (both idle, first wins); while it is in flight s2 goes to the less loaded b.
    const p1 = m.generate(req('1', 's1'));
    const p2 = m.generate(req('2', 's2'));
    assert.equal((await p1).server, a.url);
    assert.equal((await p2).server, b.url);
    // Later turns stick, even when the other server is idler.
    a.delayMs = 0;
    b.delayMs = 50;
    const slow = m.generate(req('x', 's9'));
    assert.equal(m.routeOf('s9'), a.url, 'new session went to the idle server');
    for (let i = 0; i < 3; i++) assert.equal((await m.generate(req(`1-${i}`, 's1'))).server, a.url);
    await slow;
    assert.equal((await m.generate(req('2b', 's2'))).server, b.url);
    m.releaseSession('s1');
    assert.equal(m.routeOf('s1'), undefined);
    await m.close();
  });

  test('per-server concurrency cap queues calls', async () => {
    const a = await fake('sglang');
    a.delayMs = 30;
    const m = new ServerManager([new SglangServer(a.url)], { maxConcurrencyPerServer: 2, healthIntervalMs: 0 });
    const ps = [1, 2, 3, 4, 5].map((i) => m.generate(req(String(i), `s${i}`)));
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(m.stats()[0]!.inflight, 2);
    await Promise.all(ps);
    assert.equal(a.bodies.length, 5);
    await m.close();
  });

  test('a failing server is marked down (its sessions move), and up again by the health check', async () => {
    const a = await fake('sglang');
    const b = await fake('sglang');
    const m = new ServerManager([new SglangServer(a.url), new SglangServer(b.url)], { backoffBaseMs: 1, failuresToMarkDown: 1, healthIntervalMs: 0 });
    assert.equal((await m.generate(req('1', 'sa'))).server, a.url);
    a.failNext = [503];
    a.healthy = false;
    const moved = await m.generate(req('2', 'sa'));
    assert.equal(moved.server, b.url, 'retried on the other server');
    assert.equal(m.stats().find((s) => s.address === a.url)!.up, false);
    assert.equal(m.routeOf('sa'), b.url, 'the session now sticks to b');
    await m.checkHealth();
    assert.equal(m.stats().find((s) => s.address === a.url)!.up, false, 'still unhealthy');
    a.healthy = true;
    await m.checkHealth();
    assert.equal(m.stats().find((s) => s.address === a.url)!.up, true, 'marked up by the health check');
    assert.equal((await m.generate(req('3', 'new-session'))).server, a.url);
    await m.close();
  });

  test('all servers down: BACKEND_UNAVAILABLE after retries', async () => {
    const a = await fake('vllm');
    const m = new ServerManager([new VllmServer(a.url, { model: 'fake-model' })], { backoffBaseMs: 1, maxRetries: 1, healthIntervalMs: 0 });
    m.markDown(a.url);
    await assert.rejects(m.generate(req('1', 's')), (e) => isRlstreamError(e, 'BACKEND_UNAVAILABLE'));
    m.markUp(a.url);
    assert.deepEqual((await m.generate(req('2', 's'))).tokenIds, [12, 2]);
    await m.updatePolicy({ version: 3, weightsPath: '/nonexistent', configJson: '{}' });
    assert.equal(m.currentPolicyVersion(), 3);
    assert.deepEqual((await m.generate(req('3', 's'))).policyVersions, [3, 3]);
    await m.close();
  });
});

describe('LoRA versions on inference servers: the PEFT adapter directory through their LoRA endpoints (fake servers)', () => {
  const stores: string[] = [];
  after(() => {
    for (const d of stores) rmSync(d, { recursive: true, force: true });
  });
  /** A version published as adapters (trainer.lora): the adapter file in the store beside version 0's weights. */
  async function publishAdapter(version: number): Promise<PolicyUpdate> {
    const store = mkdtempSync(join(tmpdir(), 'rlstream-lora-sync-'));
    stores.push(store);
    const base = join(store, `${'cd'.repeat(32)}.safetensors`);
    writeFileSync(base, 'version 0 weights');
    const path = join(store, `${'ef'.repeat(31)}${String(version).padStart(2, '0')}.safetensors`);
    const A = { shape: [2, 8], data: Float32Array.from({ length: 16 }, (_, i) => i / 16 + version) };
    const B = { shape: [8, 2], data: Float32Array.from({ length: 16 }, (_, i) => -i / 8) };
    await writeSafetensors(path, [['model.layers.0.self_attn.q_proj.lora_A.weight', A], ['model.layers.0.self_attn.q_proj.lora_B.weight', B]], { ...loraMetadata({ rank: 2, alpha: 4, targets: ['q_proj'], dropout: 0, seed: 0 }), base_uri: base, base_checksum: 'cd'.repeat(32) });
    return { version, weightsPath: path, configJson: MODEL_CONFIG, adapter: { path, baseWeightsPath: base } };
  }
  const req = (id: string) => ({ requestId: id, sessionId: 's', promptIds: [1, 2], sampling: SAMPLING });

  test('vLLM: load_lora_adapter with the PEFT directory, requests name the adapter, the previous one is unloaded', async () => {
    const f = await fake('vllm');
    const m = new ServerManager([new VllmServer(f.url, { model: 'fake-model', weightSync: 'reload_weights' })], { healthIntervalMs: 0 });
    const u3 = await publishAdapter(3);
    f.posts.length = 0;
    await m.updatePolicy(u3);
    const dir = join(dirname(u3.adapter!.path), 'served', 'lora-v3');
    assert.deepEqual(f.posts.map((p) => [p.path, JSON.parse(p.body)]), [['/v1/load_lora_adapter', { lora_name: 'policy-v3', lora_path: dir }]]);
    // what vLLM reads: PEFT's two files, the tensors under PEFT's names, the same values
    assert.deepEqual(readdirSync(dir).sort(), ['adapter_config.json', 'adapter_model.safetensors']);
    const cfg = JSON.parse(readFileSync(join(dir, 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
    assert.deepEqual([cfg.peft_type, cfg.r, cfg.lora_alpha, cfg.target_modules], ['LORA', 2, 4, ['q_proj']]);
    const t = parseSafetensors(readFileSync(join(dir, 'adapter_model.safetensors'))).tensors;
    assert.deepEqual([...t.keys()].sort(), ['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight', 'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight']);
    assert.equal(t.get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')!.data[1], 1 / 16 + 3);
    f.bodies.length = 0;
    const out = await m.generate(req('1'));
    assert.deepEqual(out.policyVersions, [3, 3]);
    assert.equal(f.bodies[0]!['model'], 'policy-v3', 'the request names the adapter');
    // the next version: loaded, then the previous unloaded; its directory replaces the old one
    f.posts.length = 0;
    const u4 = { ...(await publishAdapter(4)) };
    await m.updatePolicy(u4);
    assert.deepEqual(f.posts.map((p) => [p.path, (JSON.parse(p.body) as { lora_name: string }).lora_name]), [['/v1/load_lora_adapter', 'policy-v4'], ['/v1/unload_lora_adapter', 'policy-v3']]);
    f.bodies.length = 0;
    await m.generate(req('2'));
    assert.equal(f.bodies[0]!['model'], 'policy-v4');
    await m.close();
  });

  test('vLLM without runtime LoRA updating (404) names the switches; the version stays where it was', async () => {
    const f = await fake('sglang'); // 404 on vLLM's paths
    const m = new ServerManager([new VllmServer(f.url, { model: 'fake-model', weightSync: 'reload_weights' })], { healthIntervalMs: 0 });
    await assert.rejects(m.updatePolicy(await publishAdapter(2)), (e) => isRlstreamError(e, 'BACKEND_UNAVAILABLE') && /--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True/.test(e.message));
    assert.equal(m.currentPolicyVersion(), 0);
    await m.close();
  });

  test('SGLang: load_lora_adapter, requests carry lora_path, the previous adapter unloaded; whole weights clear it', async () => {
    const f = await fake('sglang');
    const m = new ServerManager([new SglangServer(f.url, { weightSync: 'update_weights_from_disk' })], { healthIntervalMs: 0 });
    const u = await publishAdapter(7);
    f.posts.length = 0;
    await m.updatePolicy(u);
    assert.deepEqual(f.posts.map((p) => [p.path, JSON.parse(p.body)]), [['/load_lora_adapter', { lora_name: 'policy-v7', lora_path: join(dirname(u.adapter!.path), 'served', 'lora-v7') }]]);
    f.bodies.length = 0;
    assert.deepEqual((await m.generate(req('1'))).policyVersions, [7, 7, 7]);
    assert.equal(f.bodies[0]!['lora_path'], 'policy-v7');
    f.posts.length = 0;
    await m.updatePolicy(await publishAdapter(8));
    assert.deepEqual(f.posts.map((p) => p.path), ['/load_lora_adapter', '/unload_lora_adapter']);
    // a version of whole weights goes through update_weights_from_disk, and requests name no adapter after it
    const store = mkdtempSync(join(tmpdir(), 'rlstream-lora-sync-'));
    stores.push(store);
    const weightsPath = join(store, `${'ab'.repeat(32)}.safetensors`);
    writeFileSync(weightsPath, 'weights of version 9');
    await m.updatePolicy({ version: 9, weightsPath, configJson: MODEL_CONFIG });
    f.bodies.length = 0;
    await m.generate(req('2'));
    assert.equal(f.bodies[0]!['lora_path'], undefined);
    await m.close();
  });
});

// SGLang and vLLM clients and the server manager against FAKE inference servers: small node:http servers
// that answer with the documented request/response shapes (real SGLang and vLLM need GPUs and cannot run
// here). Covers request shapes, token/log-prob parsing, retries on 5xx, stickiness, and a server marked
// down then up by health checks.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { ServerManager } from '../../producers/backends/server-manager.ts';
import { SglangServer } from '../../producers/backends/sglang.ts';
import { VllmServer } from '../../producers/backends/vllm.ts';

const SAMPLING: SamplingParams = { temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 3, seed: 7, stop_token_ids: [2] };

interface Fake {
  url: string;
  bodies: Record<string, unknown>[];
  /** Status codes to answer the next generate calls with (then 200s). */
  failNext: number[];
  healthy: boolean;
  /** Delay generate answers (ms). */
  delayMs: number;
  server: Server;
}

async function fakeServer(kind: 'sglang' | 'vllm'): Promise<Fake> {
  const fake: Fake = { url: '', bodies: [], failNext: [], healthy: true, delayMs: 0, server: undefined as unknown as Server };
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const json = (code: number, body: unknown) => {
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.url === '/health') return json(fake.healthy ? 200 : 503, {});
    if (req.url === '/v1/models') return json(200, { object: 'list', data: [{ id: 'fake-model', object: 'model' }] });
    const body = JSON.parse(Buffer.concat(chunks).toString() || '{}') as Record<string, unknown>;
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

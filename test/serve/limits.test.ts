// The limits a shared `rlstream serve` endpoint needs, tried as an abuser would on 127.0.0.1 (bounded loops): bodies
// trickled a byte at a time and headers never finished are answered 408 and closed once the read time-out passes;
// one token holder cannot take every open trajectory nor every call slot (its fair share, while another token
// still gets in); big prompts are tokenized in the worker so /v1/models keeps answering while four 1 MiB prompts
// are read. The scripted backend is a TEST DOUBLE (it answers a fixed script, after a delay for "SLOW" prompts).
import { connect, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ScriptedBackend } from '../../producers/backends/scripted.ts';
import { sleep } from '../../core/retry.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { ServeJob } from '../../cli/run/serve-job.ts';
import { call, startServe } from './helpers.ts';

const TOKENIZER = ChatTokenizer.load(new URL('../../examples/calculator/tokenizer', import.meta.url).pathname);
const A = 'serve-limits-token-a-0123456789';
const B = 'serve-limits-token-b-0123456789';
const READ_TIMEOUT_MS = 1500;
const as = (token: string) => ({ authorization: `Bearer ${token}` });
const chat = (content: string) => ({ model: 'calculator', messages: [{ role: 'user', content }] });

/** A raw connection that sends `head` then trickles `drip` a byte every `everyMs`; resolves with what it read when the server closes it. */
function trickle(port: number, head: string, everyMs: number): { closed: Promise<{ data: string; afterMs: number }>; socket: Socket } {
  const socket = connect(port, '127.0.0.1');
  const t0 = Date.now();
  let data = '';
  let timer: NodeJS.Timeout | null = null;
  socket.on('connect', () => {
    socket.write(head);
    timer = setInterval(() => socket.write('x'), everyMs);
  });
  socket.on('data', (d) => (data += d.toString()));
  socket.on('error', () => {});
  const closed = new Promise<{ data: string; afterMs: number }>((resolve) =>
    socket.on('close', () => {
      if (timer) clearInterval(timer);
      resolve({ data, afterMs: Date.now() - t0 });
    }),
  );
  return { closed, socket };
}

describe('rlstream serve: limits under abuse', () => {
  let job: ServeJob;
  let stop: () => Promise<void>;
  let port: number;
  const scripted = new ScriptedBackend({
    tokenizer: TOKENIZER,
    script: async ({ promptText }) => {
      const text = promptText();
      if (text.includes('SLOW')) await sleep(800);
      if (text.includes('USE THE TOOL') && !text.includes('<tool_response>')) return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>';
      return 'The answer is 5.';
    },
  });

  before(async () => {
    ({ job, stop } = await startServe({
      wrapBackend: () => scripted,
      tokens: [
        { token: A, role: 'read', name: 'a' },
        { token: B, role: 'read', name: 'b' },
      ],
      // 8 sessions for 2 tokens: a fair share of 4 each (serve.max_sessions_per_token's default).
      limits: { maxSessions: 8, idleTimeoutMs: 600_000, maxCallsPerToken: 2 },
      bodyLimitBytes: 16 * 1024 * 1024,
      requestReadTimeoutMs: READ_TIMEOUT_MS,
    }));
    port = Number(new URL(job.url).port);
  });
  after(async () => stop());

  /** Runs `work` while GET /v1/models is polled every 50 ms: the worst answer time and the number of polls. */
  async function whilePollingModels<T>(work: () => Promise<T>): Promise<{ result: T; worst: number; polls: number }> {
    let worst = 0;
    let polls = 0;
    let done = false;
    const poller = (async () => {
      while (!done) {
        const t0 = performance.now();
        const r = await call(job, 'GET', '/v1/models', undefined, as(B));
        assert.equal(r.status, 200);
        worst = Math.max(worst, performance.now() - t0);
        polls++;
        await sleep(50);
      }
    })();
    try {
      return { result: await work(), worst, polls };
    } finally {
      done = true;
      await poller;
    }
  }

  it('closes trickled bodies and unfinished headers with 408 after the read time-out; other calls go on', async () => {
    const body = JSON.stringify(chat('hello'));
    const slowBodies = Array.from({ length: 40 }, () =>
      trickle(port, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${A}\r\nContent-Type: application/json\r\nContent-Length: ${body.length + 1000}\r\n\r\n${body.slice(0, 5)}`, 300),
    );
    const slowHeaders = Array.from({ length: 10 }, () => trickle(port, `GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: `, 300));
    // Meanwhile the endpoint answers.
    const models = await call(job, 'GET', '/v1/models', undefined, as(B));
    assert.equal(models.status, 200);
    const closed = await Promise.all([...slowBodies, ...slowHeaders].map((t) => t.closed));
    for (const [i, c] of closed.entries()) {
      // Closed after the time-out (not before), and well before the trickle would have finished (1000 bytes × 300 ms).
      assert.ok(c.afterMs >= READ_TIMEOUT_MS - 100 && c.afterMs < READ_TIMEOUT_MS + 8_000, `connection ${i} closed after ${c.afterMs} ms`);
      assert.match(c.data, /^HTTP\/1\.1 408 /, `connection ${i}: ${JSON.stringify(c.data.slice(0, 80))}`);
      assert.equal((JSON.parse(c.data.slice(c.data.indexOf('\r\n\r\n') + 4)) as { error: { code: string } }).error.code, 'SRV_ERR_READ_TIMEOUT');
    }
    assert.equal(job.service.openSessions, 0);
  });

  it("one token's fair share of open trajectories: a holder cannot take them all", async () => {
    const opened: string[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await call(job, 'POST', '/v1/chat/completions', chat(`question ${i}`), as(A));
      assert.equal(r.status, 200, r.text);
      opened.push((r.json['choices'] as { rlstream: { trajectory_id: string } }[])[0]!.rlstream.trajectory_id);
    }
    const flood = await Promise.all(Array.from({ length: 20 }, (_, i) => call(job, 'POST', '/v1/chat/completions', chat(`flood ${i}`), as(A))));
    for (const r of flood) {
      assert.equal(r.status, 429, r.text);
      assert.equal((r.json['error'] as { code: string }).code, 'SRV_ERR_FAIR_SHARE');
    }
    // The other holder still gets its share.
    const other = await call(job, 'POST', '/v1/chat/completions', chat('mine'), as(B));
    assert.equal(other.status, 200, other.text);
    assert.equal(job.service.openSessions, 5);
    // Completing one gives A its room back.
    assert.equal((await call(job, 'POST', `/v1/trajectories/${opened[0]}/complete`, {}, as(A))).status, 200);
    assert.equal((await call(job, 'POST', '/v1/chat/completions', chat('again'), as(A))).status, 200);
    for (const id of [...opened.slice(1)]) await call(job, 'POST', `/v1/trajectories/${id}/complete`, {}, as(A));
    await job.service.sweep(Date.now() + 700_000);
    assert.equal(job.service.openSessions, 0);
  });

  it("one token's calls in flight are bounded (429 beyond), another token's are not held up", async () => {
    const started = Date.now();
    const mine = Array.from({ length: 3 }, (_, i) => call(job, 'POST', '/v1/chat/completions', chat(`SLOW ${i}`), as(A)));
    await sleep(100);
    const theirs = await call(job, 'POST', '/v1/chat/completions', chat('SLOW other'), as(B));
    assert.equal(theirs.status, 200, theirs.text);
    const statuses = (await Promise.all(mine)).map((r) => [r.status, (r.json['error'] as { code?: string } | undefined)?.code ?? null]);
    assert.deepEqual(statuses.sort(), [[200, null], [200, null], [429, 'SRV_ERR_FAIR_SHARE']]);
    assert.ok(Date.now() - started < 20_000);
    await job.service.sweep(Date.now() + 700_000);
  });

  it('big prompts are tokenized off the event loop: /v1/models keeps answering while four 1 MiB prompts are read', async () => {
    const big = (k: number) => chat(`${k} ` + 'lorem ipsum dolor sit amet, consectetur adipiscing elit. '.repeat(18_500));
    const { result: answers, worst, polls } = await whilePollingModels(() => Promise.all([0, 1].map((k) => call(job, 'POST', '/v1/chat/completions', big(k), as(A))).concat([2, 3].map((k) => call(job, 'POST', '/v1/chat/completions', big(k), as(B))))));
    // Each is tokenized (in the worker) and refused for its length, before anything is generated.
    for (const r of answers) {
      assert.equal(r.status, 400, r.text.slice(0, 200));
      assert.equal((r.json['error'] as { code: string }).code, 'SRV_ERR_PROMPT_TOO_LONG');
    }
    assert.ok(polls >= 3, `only ${polls} polls`);
    assert.ok(worst < 2_500, `GET /v1/models took up to ${worst.toFixed(0)} ms while big prompts were tokenized`);
    console.log(`# /v1/models during four 1 MiB prompts: ${polls} polls, worst ${worst.toFixed(0)} ms`);
  });

  it('big tool results are tokenized off the event loop too: /v1/models keeps answering while four 256 KiB results are read', async () => {
    const tools = [{ type: 'function', function: { name: 'calculator', description: 'Exact arithmetic.', parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } } }];
    const opened: { token: string; body: Record<string, unknown>; id: string }[] = [];
    for (const [k, token] of [[0, A], [1, A], [2, B], [3, B]] as const) {
      const messages = [{ role: 'user', content: `USE THE TOOL ${k}` }];
      const r = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages, tools }, as(token));
      assert.equal(r.status, 200, r.text);
      const c = (r.json['choices'] as { message: Record<string, unknown> & { tool_calls: { id: string }[] }; rlstream: { trajectory_id: string } }[])[0]!;
      opened.push({ token, body: { model: 'calculator', tools, messages: [...messages, c.message, { role: 'tool', tool_call_id: c.message.tool_calls[0]!.id, content: `${k} ` + 'lorem ipsum dolor sit amet, consectetur adipiscing elit. '.repeat(4_600) }] }, id: c.rlstream.trajectory_id });
    }
    const { result: answers, worst, polls } = await whilePollingModels(() => Promise.all(opened.map((o) => call(job, 'POST', '/v1/chat/completions', o.body, as(o.token)))));
    // Each result was tokenized (in the worker) and found beyond the response budget: the trajectory continued
    // (no new one opened) and ended max_tokens, as a rollout's would.
    for (const [i, r] of answers.entries()) {
      assert.equal(r.status, 200, r.text.slice(0, 200));
      const ext = (r.json['choices'] as { rlstream: { trajectory_id: string; completed: string | null } }[])[0]!.rlstream;
      assert.deepEqual([ext.trajectory_id, ext.completed], [opened[i]!.id, 'max_tokens']);
    }
    assert.ok(polls >= 3, `only ${polls} polls`);
    assert.ok(worst < 2_500, `GET /v1/models took up to ${worst.toFixed(0)} ms while big tool results were tokenized`);
    console.log(`# /v1/models during four 256 KiB tool results: ${polls} polls, worst ${worst.toFixed(0)} ms`);
  });
});

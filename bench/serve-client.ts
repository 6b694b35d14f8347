// The client side of `npm run bench -- serve`, in its own process (forked with IPC) so that the endpoint's process
// CPU time counts the server's work only. On each message {round} it runs every session's two turns concurrently
// through the OpenAI request shape, each call with a seed of its own (the direct replay of the round reuses the
// request's sampling, so it generates the same tokens), and answers with each call's wall time and what it recorded.
// Requests go through node:http on kept-alive connections rather than fetch: the client shares the machine's cores
// with the endpoint and the engine, and fetch's streams cost about as much CPU per call as the endpoint itself.
import { Agent, request } from 'node:http';
import { problemRows } from '../examples/calculator/index.ts';
import { MEDIUM, take } from '../examples/calculator/task.ts';
import { CALCULATOR_TOOL } from '../examples/calculator/conversation.ts';

export interface ClientCall {
  session: number;
  turn: number;
  ms: number;
  trajectoryId: string;
  turnIndex: number;
  tokenIds: number[];
}

export interface ClientRound {
  calls: ClientCall[];
  /** This process's CPU time over the round (the client's own work: requests, JSON, the HTTP client). */
  cpuMs: number;
}

if (!process.send) {
  process.stderr.write('bench/serve-client.ts is the client process of `npm run bench -- serve`; run that\n');
  process.exit(2);
}
const url = process.env['BENCH_SERVE_URL']!;
const token = process.env['BENCH_SERVE_TOKEN']!;
const sessions = Number(process.env['BENCH_SERVE_SESSIONS']);
const maxTokens = Number(process.env['BENCH_SERVE_MAX_TOKENS']);
const followUp = JSON.parse(process.env['BENCH_SERVE_FOLLOW_UP']!) as unknown;
const rows = take(problemRows(7, 'train', MEDIUM), sessions);

/** Distinct per round, session and turn. */
const callSeed = (round: number, session: number, turn: number): number => (round + 2) * 1_000_003 + session * 16 + turn;

const agent = new Agent({ keepAlive: true, maxSockets: Infinity });

function post(path: string, body: unknown, headers: Record<string, string> = {}): Promise<Record<string, unknown>> {
  const payload = Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = request(url + path, { method: 'POST', agent, headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'content-length': payload.length, ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        try {
          const json = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
          if (res.statusCode !== 200) reject(new Error(`${path}: ${res.statusCode} ${JSON.stringify(json)}`));
          else resolve(json);
        } catch (err) {
          reject(err as Error);
        }
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(payload);
  });
}

async function round(r: number): Promise<ClientRound> {
  const calls: ClientCall[] = [];
  const cpu = process.cpuUsage();
  await Promise.all(
    rows.map(async (row, session) => {
      const messages: unknown[] = [...row.prompt];
      let trajectory: string | null = null;
      for (let turn = 0; turn < 2; turn++) {
        const body = { model: 'calculator', messages, tools: [CALCULATOR_TOOL], temperature: 1, max_tokens: maxTokens, seed: callSeed(r, session, turn) };
        const t0 = performance.now();
        const res = await post('/v1/chat/completions', body, trajectory ? { 'x-rlstream-trajectory': trajectory } : {});
        const ms = performance.now() - t0;
        const choice = (res['choices'] as { message: unknown; rlstream: { trajectory_id: string; turn_index: number; token_ids: number[]; completed: string | null } }[])[0]!;
        trajectory = choice.rlstream.trajectory_id;
        calls.push({ session, turn, ms, trajectoryId: trajectory, turnIndex: choice.rlstream.turn_index, tokenIds: choice.rlstream.token_ids });
        if (choice.rlstream.completed) return;
        messages.push(choice.message, followUp);
      }
      await post(`/v1/trajectories/${trajectory}/complete`, { reward: 0 });
    }),
  );
  const used = process.cpuUsage(cpu);
  return { calls, cpuMs: (used.user + used.system) / 1000 };
}

process.on('message', (m: { round: number } | 'exit') => {
  if (m === 'exit') process.exit(0);
  round(m.round).then(
    (r) => process.send!(r),
    (err: unknown) => {
      process.stderr.write(`bench serve client: ${String(err)}\n`);
      process.exit(1);
    },
  );
});
process.send('ready');

// llama.cpp's server for tests: the binary and model infra/llama-server.sh installs under .infra/llama.cpp/,
// started on a free port and stopped by the test. SmolLM2-135M-Instruct's tokenizer and chat template come
// out of the same GGUF file the server loads (core/weights/gguf-tokenizer.ts), so both sides agree.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { GgufFile } from '../../core/weights/gguf.ts';
import { ggufTokenizer } from '../../core/weights/gguf-tokenizer.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { REPO } from './helpers.ts';
import { tempDir } from '../../testkit/events.ts';

const INFRA = process.env['RLSTREAM_INFRA_DIR'] ?? join(REPO, '.infra');
const VERSION = process.env['LLAMA_CPP_PYTHON_VERSION'] ?? '0.3.36';
export const LLAMA_SERVER = join(INFRA, 'llama.cpp', VERSION, 'bin', 'llama-server');
export const SMOLLM2_GGUF = join(INFRA, 'llama.cpp', 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf');

/** Why the tests cannot run here, or null when they can. */
export function llamaServerMissing(): string | null {
  if (!existsSync(LLAMA_SERVER)) return `${LLAMA_SERVER} is not built (bash infra/setup.sh builds it)`;
  if (!existsSync(SMOLLM2_GGUF)) return `${SMOLLM2_GGUF} is missing (bash infra/setup.sh fetches it)`;
  return null;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export interface LlamaServer {
  url: string;
  process: ChildProcess;
  /** SIGKILL, as a crash would: no goodbye to clients. */
  kill(): void;
  stop(): Promise<void>;
}

/** Start a server with `slots` parallel sequences of `ctx` tokens each and wait for /health. */
export async function startLlamaServer(options: { slots?: number; ctx?: number } = {}): Promise<LlamaServer> {
  const slots = options.slots ?? 2;
  const port = await freePort();
  // --no-repack: llama.cpp's AMX weight repacking crashes (SIGSEGV in ggml_backend_amx_mul_mat) on VMs that
  // advertise AMX without enabling its tile state; plain kernels are as fast for a 135M model.
  const args = ['-m', SMOLLM2_GGUF, '--host', '127.0.0.1', '--port', String(port), '-c', String((options.ctx ?? 4096) * slots), '-np', String(slots), '-t', '1', '--no-repack'];
  const child = spawn(LLAMA_SERVER, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const url = `http://127.0.0.1:${port}`;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const deadline = Date.now() + 90_000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`llama-server exited (${child.exitCode ?? child.signalCode}): ${stderr}`);
    const ok = await fetch(`${url}/health`).then((r) => r.ok, () => false);
    if (ok) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`llama-server did not become healthy in 90 s: ${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  return {
    url,
    process: child,
    kill: () => child.kill('SIGKILL'),
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}

let tokenizer: ChatTokenizer | undefined;
let tokenizerDir: string | undefined;

/** A directory with SmolLM2's tokenizer.json and tokenizer_config.json (chat template), rebuilt from the GGUF the server runs. */
export function smolTokenizerDir(): string {
  if (tokenizerDir) return tokenizerDir;
  const files = ggufTokenizer(GgufFile.open(SMOLLM2_GGUF));
  const dir = tempDir('smollm2');
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(files.tokenizer));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(files.config));
  tokenizerDir = dir;
  return dir;
}

export function smolTokenizer(): ChatTokenizer {
  tokenizer ??= ChatTokenizer.load(smolTokenizerDir());
  return tokenizer;
}

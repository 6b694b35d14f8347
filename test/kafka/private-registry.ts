// A private Apicurio registry for tests that must start from an empty registry or restart it: started through
// infra/registry/run.sh (as infra/up.sh starts the shared one) on a free port with its own data directory, so
// the shared registry other tests use is never touched. Stop and start keep the data directory.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../../testkit/ports.ts';

const ROOT = resolve(import.meta.dirname, '../..');

export class PrivateRegistry {
  private child: ChildProcess | null = null;
  private output = '';
  readonly url: string;

  private constructor(
    readonly dataDir: string,
    private readonly port: number,
  ) {
    this.url = `http://127.0.0.1:${port}/apis/ccompat/v7`;
  }

  /** Whether infra/setup.sh has installed Apicurio (APICURIO_VERSION, default that of infra/env.sh). */
  static installed(): boolean {
    const version = process.env['APICURIO_VERSION'] ?? '2.6.13.Final';
    return existsSync(join(process.env['RLSTREAM_INFRA_DIR'] ?? join(ROOT, '.infra'), 'registry', version, '.complete'));
  }

  static async start(dataDir: string): Promise<PrivateRegistry> {
    const r = new PrivateRegistry(dataDir, await freePort());
    await r.resume();
    return r;
  }

  /** Start the process on the same port and data; resolves once GET /subjects answers. */
  async resume(timeoutMs = 90_000): Promise<void> {
    this.output = '';
    const child = spawn('bash', [join(ROOT, 'infra/registry/run.sh'), String(this.port), this.dataDir], { stdio: ['ignore', 'pipe', 'pipe'] });
    this.child = child;
    const keep = (d: Buffer) => (this.output = (this.output + d.toString()).slice(-8_000));
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    const end = Date.now() + timeoutMs;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null) throw new Error(`the private registry exited during start-up: ${this.output}`);
      const ok = await fetch(`${this.url}/subjects`).then((r) => r.ok, () => false);
      if (ok) return;
      if (Date.now() > end) throw new Error(`the private registry did not answer in ${timeoutMs / 1000} s: ${this.output}`);
      await sleep(300);
    }
  }

  /** Stop the process (SIGKILL: as a crash; SIGTERM: a clean stop) and wait for it to exit. */
  async halt(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const child = this.child;
    this.child = null;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill(signal);
    await exited;
  }
}

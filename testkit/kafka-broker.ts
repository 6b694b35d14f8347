// A private single-node Kafka broker (KRaft) for the fault tests: the jars infra/setup.sh installed, a fresh
// data directory and free ports, so a test can stop and restart "the cluster" and own every topic on it
// without touching the shared broker other tests and developers use. Stop/start keep the data directory.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { canConnect, freePorts } from './ports.ts';

const ROOT = resolve(import.meta.dirname, '..');

export class PrivateBroker {
  private child: ChildProcess | null = null;
  private output = '';
  readonly brokers: string;

  private constructor(
    private readonly dir: string,
    private readonly port: number,
    private readonly controllerPort: number,
  ) {
    this.brokers = `127.0.0.1:${port}`;
  }

  /** The jars of KAFKA_VERSION (default 4.3.1) under .infra, or null when infra/setup.sh has not installed them. */
  static libs(): string | null {
    const dir = join(process.env['RLSTREAM_INFRA_DIR'] ?? join(ROOT, '.infra'), 'kafka', process.env['KAFKA_VERSION'] ?? '4.3.1', 'libs');
    return existsSync(join(dir, '.complete')) ? dir : null;
  }

  /** Format a data directory under `dir` and start the broker; resolves once it accepts connections. */
  static async start(dir: string): Promise<PrivateBroker> {
    const [port, controllerPort] = await freePorts(2);
    const b = new PrivateBroker(dir, port!, controllerPort!);
    mkdirSync(join(dir, 'log'), { recursive: true });
    writeFileSync(join(dir, 'server.properties'), b.properties());
    // A cluster id is 16 random bytes in URL-safe base64; one starting with '-' would read as an option.
    const cluster = Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString('base64url').replace(/^-/, 'A');
    await b.java(['kafka.tools.StorageTool', 'format', '-t', cluster, '-c', join(dir, 'server.properties')], true);
    await b.resume();
    return b;
  }

  private properties(): string {
    return [
      'process.roles=broker,controller',
      'node.id=1',
      `controller.quorum.voters=1@127.0.0.1:${this.controllerPort}`,
      `listeners=PLAINTEXT://127.0.0.1:${this.port},CONTROLLER://127.0.0.1:${this.controllerPort}`,
      `advertised.listeners=PLAINTEXT://127.0.0.1:${this.port}`,
      'controller.listener.names=CONTROLLER',
      'inter.broker.listener.name=PLAINTEXT',
      'listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT',
      `log.dirs=${join(this.dir, 'log')}`,
      'num.partitions=1',
      'default.replication.factor=1',
      'min.insync.replicas=1',
      'offsets.topic.replication.factor=1',
      'offsets.topic.num.partitions=4',
      'transaction.state.log.replication.factor=1',
      'transaction.state.log.min.isr=1',
      'transaction.state.log.num.partitions=4',
      'group.initial.rebalance.delay.ms=0',
      'group.min.session.timeout.ms=1000',
      'auto.create.topics.enable=false',
      'num.network.threads=1',
      'num.io.threads=2',
      'num.recovery.threads.per.data.dir=1',
      'message.max.bytes=4194304',
      'replica.fetch.max.bytes=4194304',
      '',
    ].join('\n');
  }

  private java(args: string[], wait: boolean): Promise<void> {
    const libs = PrivateBroker.libs();
    if (!libs) throw new Error('Kafka jars are not installed: run infra/setup.sh');
    const child = spawn(
      'java',
      ['-Xms96m', '-Xmx384m', '-XX:+UseSerialGC', '-XX:TieredStopAtLevel=1', '-Djava.awt.headless=true', `-Dlog4j2.configurationFile=${join(ROOT, 'infra/kafka/log4j2.properties')}`, `-Dkafka.logs.dir=${this.dir}`, '-cp', `${libs}/*`, ...args],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const keep = (d: Buffer) => (this.output = (this.output + d.toString()).slice(-4000));
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    if (!wait) {
      this.child = child;
      return Promise.resolve();
    }
    return new Promise((res, rej) => child.on('exit', (code) => (code === 0 ? res() : rej(new Error(`kafka ${args[0]} exited ${code}: ${this.output}`)))));
  }

  /** Start (again) on the same ports and data; resolves when the listener accepts connections. */
  async resume(timeoutMs = 90_000): Promise<void> {
    if (this.child) return;
    await this.java(['kafka.Kafka', join(this.dir, 'server.properties')], false);
    const child = this.child!;
    let exited = false;
    child.once('exit', () => (exited = true));
    const end = Date.now() + timeoutMs;
    while (!(await canConnect(this.port))) {
      if (exited) throw new Error(`private Kafka broker exited during start-up: ${this.output}`);
      if (Date.now() > end) throw new Error(`private Kafka broker not listening after ${timeoutMs} ms: ${this.output}`);
      await sleep(250);
    }
  }

  /** Stop the broker: SIGTERM (a clean shutdown) or SIGKILL (a crash). */
  async halt(signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.child = null;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise<void>((res) => child.once('exit', () => res()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    await gone;
    clearTimeout(timer);
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }
}

// The tools of a run and their per-trajectory sessions. A session creates each tool's instance on first
// use (with the row's create_kwargs), validates arguments against the tool's JSON schema (ajv) before
// execute, enforces a timeout per call, classifies every outcome into a ToolCallStatus, and at the end
// collects calcReward and releases the instances. Nothing a tool or the model does can throw out of it.
import { Ajv, type ValidateFunction } from 'ajv';
import { describeError } from '../../core/errors.ts';
import type { ToolCallStatus } from '../../schemas/generated/types.ts';
import type { ToolsKwargs } from '../dataset/types.ts';
import type { ChatTool } from '../tokenizer/chat-tokenizer.ts';
import type { Tool } from './types.ts';

export interface ToolCallOutcome {
  status: ToolCallStatus;
  /** What the model reads (errors included, so it can correct itself). */
  text: string;
  reward: number;
  metrics: Record<string, number>;
  latencyMs: number;
}

export interface ToolSetOptions {
  /** Per-call timeout when the tool declares none (default 30 000 ms). */
  defaultTimeoutMs?: number;
}

interface Entry {
  tool: Tool;
  validate: ValidateFunction;
  timeoutMs: number;
}

export class ToolSet {
  private readonly entries = new Map<string, Entry>();
  private readonly ajv = new Ajv({ allErrors: true, strict: false });
  private readonly defaultTimeoutMs: number;

  constructor(options: ToolSetOptions = {}) {
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? 30_000;
  }

  /** Add a tool under its schema's name; `timeoutMs` overrides the default for this tool. */
  add(tool: Tool, options: { timeoutMs?: number } = {}): this {
    const name = tool.schema.function.name;
    const validate = this.ajv.compile(tool.schema.function.parameters ?? { type: 'object' });
    this.entries.set(name, { tool, validate, timeoutMs: options.timeoutMs ?? this.defaultTimeoutMs });
    return this;
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  names(): string[] {
    return [...this.entries.keys()];
  }

  /** Schemas of the tools offered (all, or those named), in the OpenAI function shape. */
  schemas(names?: readonly string[]): ChatTool[] {
    const list = names ? names.flatMap((n) => (this.entries.has(n) ? [this.entries.get(n)!.tool.schema] : [])) : [...this.entries.values()].map((e) => e.tool.schema);
    return list;
  }

  session(trajectoryId: string, toolsKwargs: ToolsKwargs = {}): ToolSession {
    return new ToolSession(this.entries, trajectoryId, toolsKwargs);
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.entries.values()].map((e) => e.tool.close?.()));
  }
}

export class ToolSession {
  private readonly created = new Map<string, Promise<void>>();
  private seq = 0;

  constructor(
    private readonly entries: ReadonlyMap<string, Entry>,
    readonly trajectoryId: string,
    private readonly toolsKwargs: ToolsKwargs,
  ) {}

  private instanceId(name: string): string {
    return `${this.trajectoryId}:${name}`;
  }

  /** Execute one call; `argumentsJson` is the model's text, parsed and validated here. */
  async call(name: string, argumentsJson: string, signal?: AbortSignal): Promise<ToolCallOutcome> {
    const t0 = performance.now();
    const done = (status: ToolCallStatus, text: string, reward = 0, metrics: Record<string, number> = {}): ToolCallOutcome => ({
      status,
      text,
      reward: Number.isFinite(reward) ? reward : 0,
      metrics,
      latencyMs: performance.now() - t0,
    });
    const entry = this.entries.get(name);
    if (!entry) return done('unknown_tool', `Error: unknown tool "${name}". Available tools: ${[...this.entries.keys()].join(', ') || 'none'}.`);
    let args: unknown;
    try {
      args = argumentsJson.trim() === '' ? {} : JSON.parse(argumentsJson);
    } catch (err) {
      return done('invalid_args', `Error: arguments of ${name} are not valid JSON (${(err as Error).message}).`);
    }
    if (!entry.tool.checksOwnArguments && !entry.validate(args)) {
      const why = (entry.validate.errors ?? []).map((e) => `${e.instancePath || '(arguments)'} ${e.message ?? 'is invalid'}`).join('; ');
      return done('invalid_args', `Error: invalid arguments for ${name}: ${why}.`);
    }
    this.seq++;
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(signal?.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), entry.timeoutMs);
    });
    try {
      let createP = this.created.get(name);
      if (!createP) {
        createP = Promise.resolve(entry.tool.create(this.instanceId(name), this.toolsKwargs[name]?.create_kwargs ?? {}));
        this.created.set(name, createP);
      }
      const run = (async () => {
        await createP;
        return entry.tool.execute(this.instanceId(name), args as Record<string, unknown>, { signal: ctl.signal, trajectoryId: this.trajectoryId });
      })();
      const res = await Promise.race([run, timeout]);
      if (res === 'timeout') {
        ctl.abort(new Error('tool call timed out'));
        run.catch(() => {});
        return done('timeout', `Error: ${name} timed out after ${entry.timeoutMs} ms.`);
      }
      return done(res.isError ? 'error' : 'ok', res.text, res.reward ?? 0, res.metrics ?? {});
    } catch (err) {
      return done('error', `Error: ${name} failed: ${describeError(err)}`);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    }
  }

  /** calcReward of every instance created, then release them all. Failures give reward 0. */
  async finish(): Promise<{ tool: string; reward: number }[]> {
    const out: { tool: string; reward: number }[] = [];
    for (const [name, createP] of this.created) {
      const entry = this.entries.get(name)!;
      try {
        await createP;
        if (entry.tool.calcReward) {
          const r = await entry.tool.calcReward(this.instanceId(name));
          out.push({ tool: name, reward: Number.isFinite(r) ? r : 0 });
        }
      } catch {
        out.push({ tool: name, reward: 0 });
      }
      try {
        await entry.tool.release(this.instanceId(name));
      } catch {
        // a failed release must not fail the trajectory
      }
    }
    this.created.clear();
    return out;
  }
}

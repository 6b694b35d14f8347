// One registry pattern for every plug-in kind (task, dataset loader, reward function, advantage estimator,
// agent loop, interaction, tool, LLM backend, event log, trace store; the policy loss joins the same way):
// built-ins register themselves under a name, a config names one, and user code is reached with
// `module: ./file.ts` + `export: name`, resolved relative to the config file. Every failure is a
// CONFIG_INVALID naming the config path and the fix: the known names (and the closest one), the missing
// module, the missing export (and the exports there are), or what shape the export should have had.
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { RlstreamError } from '../errors.ts';
import { didYouMean } from './suggest.ts';

/** The user-code form of a plug-in in a config file. */
export interface UserCodeRef {
  /** A module path, relative to the config file's directory (or absolute). */
  module: string;
  /** The export to take (default: `default`). */
  export?: string;
}

export interface RegistryShape<T> {
  /** What a value of this kind is, for errors ("a function (trajectory) => number", "an object with run()"). */
  description: string;
  /** Turns an export into a value of the kind, or returns null when it has the wrong shape. */
  accept(value: unknown): T | null;
}

export class Registry<T> {
  private readonly entries = new Map<string, T>();

  constructor(
    /** The kind, as users read it in errors: "LLM backend", "advantage estimator". */
    readonly kind: string,
    private readonly shape: RegistryShape<T>,
  ) {}

  /** Register a built-in or a user's plug-in under `name`. Registering the same value again is a no-op. */
  register(name: string, value: T): this {
    if (name === '') throw new RlstreamError('CONFIG_INVALID', `a ${this.kind} needs a non-empty name`);
    const accepted = this.shape.accept(value);
    if (accepted === null) throw new RlstreamError('CONFIG_INVALID', `${this.kind} "${name}" is not ${this.shape.description}`);
    const existing = this.entries.get(name);
    if (existing !== undefined && existing !== accepted) throw new RlstreamError('CONFIG_INVALID', `${this.kind} "${name}" is registered twice`);
    this.entries.set(name, accepted);
    return this;
  }

  /**
   * A registry of the same kind holding what this one holds now: a run adds its own plug-ins (from its config)
   * to its copy, so they never leak into the process-wide registry another run in the process reads.
   */
  copy(): Registry<T> {
    const r = new Registry<T>(this.kind, this.shape);
    for (const [name, value] of this.entries) r.entries.set(name, value);
    return r;
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  names(): string[] {
    return [...this.entries.keys()].sort();
  }

  /** The value registered under `name`, or CONFIG_INVALID at `path` listing the known names. */
  get(name: string, path: string = this.kind): T {
    const v = this.entries.get(name);
    if (v === undefined) throw new RlstreamError('CONFIG_INVALID', this.unknownMessage(name, path));
    return v;
  }

  /** The message for an unknown name (config compilers collect it instead of throwing). */
  unknownMessage(name: string, path: string = this.kind): string {
    return `${path}: unknown ${this.kind} "${name}"${didYouMean(name, this.entries.keys())} (known: ${this.names().join(', ') || 'none'})`;
  }

  /** Import user code (`module`, `export`) relative to `baseDir` and check its shape; not registered. */
  async load(ref: UserCodeRef, baseDir: string, path: string = this.kind): Promise<T> {
    const abs = isAbsolute(ref.module) ? ref.module : resolve(baseDir, ref.module);
    const exportName = ref.export ?? 'default';
    let mod: Record<string, unknown>;
    try {
      mod = esModuleOf((await import(pathToFileURL(abs).href)) as Record<string, unknown>);
    } catch (cause) {
      const missing = (cause as { code?: string }).code === 'ERR_MODULE_NOT_FOUND' && String((cause as Error).message).includes(abs);
      throw new RlstreamError('CONFIG_INVALID', missing ? `${path}.module: ${abs} does not exist (paths are relative to the config file)` : `${path}.module: ${abs} cannot be loaded: ${(cause as Error).message}`, { cause });
    }
    if (!(exportName in mod)) {
      const exported = Object.keys(mod);
      throw new RlstreamError('CONFIG_INVALID', `${path}.export: ${ref.module} has no export "${exportName}"${didYouMean(exportName, exported)} (exports: ${exported.join(', ') || 'none'})`);
    }
    const value = this.shape.accept(mod[exportName]);
    if (value === null) throw new RlstreamError('CONFIG_INVALID', `${path}.export: ${ref.module} export "${exportName}" is not ${this.shape.description}`);
    return value;
  }

  /** A plug-in named in a config: by `name` from the registry, or user code when `module` is given. */
  async resolve(spec: { name?: string | null; module?: string | null; export?: string | null }, baseDir: string, path: string = this.kind): Promise<T> {
    if (spec.module) return this.load({ module: spec.module, ...(spec.export ? { export: spec.export } : {}) }, baseDir, path);
    if (!spec.name) throw new RlstreamError('CONFIG_INVALID', `${path}: give a ${this.kind} name (known: ${this.names().join(', ')}) or module: ./file.ts`);
    return this.get(spec.name, `${path}.name`);
  }
}

/** Shape check for plug-ins that are plain functions. */
export function functionShape<F extends (...args: never[]) => unknown>(description: string): RegistryShape<F> {
  return { description, accept: (v) => (typeof v === 'function' ? (v as F) : null) };
}

/** Shape check for plug-ins that are objects with the given methods (a class export is constructed with no arguments). */
export function objectShape<T>(description: string, methods: string[], options: { construct?: boolean } = {}): RegistryShape<T> {
  const ok = (v: unknown): v is T => typeof v === 'object' && v !== null && methods.every((m) => typeof (v as Record<string, unknown>)[m] === 'function');
  return {
    description,
    accept: (v) => {
      if (ok(v)) return v;
      if (options.construct && typeof v === 'function') {
        try {
          const inst: unknown = new (v as new () => unknown)();
          if (ok(inst)) return inst;
        } catch {
          return null;
        }
      }
      return null;
    },
  };
}

/**
 * The module's own exports. A .ts file outside a package of type "module" is CommonJS to Node: tsx compiles its
 * `export`s to a CommonJS exports object marked __esModule, and Node's import puts that whole object under
 * `default` (its named exports cannot be seen statically), so the exports are read from there.
 */
function esModuleOf(mod: Record<string, unknown>): Record<string, unknown> {
  const d = mod['default'];
  return d !== null && typeof d === 'object' && (d as { __esModule?: unknown }).__esModule === true ? (d as Record<string, unknown>) : mod;
}

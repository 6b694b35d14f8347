// LLM backends by name, the `backend:` section of a run config: `name` picks one, its other keys are the
// backend's own options (a TypeBox object, validated at start-up with the rest of the config). Built-ins:
// `builtin` (the in-process policy), `sglang`, `vllm` and `openai` (any OpenAI-compatible completions server,
// llama.cpp's included): inference servers behind the server manager's routing, retries and health checks.
// Registering another is one call: `registerBackend(name, plugin)`.
import { Type, type Static, type TObject } from '@sinclair/typebox';
import { objectShape, Registry } from '../../core/config/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import type { RolloutInterrupt } from '../policy/native-engine.ts';
import type { ChatTokenizer } from '../tokenizer/chat-tokenizer.ts';
import type { DeviceKind } from '../../native/index.ts';
import type { LlmBackend } from './types.ts';

/** What every backend may use from the run: the model's files, how rollouts take policy updates, and a logger. */
export interface BackendEnv {
  /** The model's config.json text and the warm-start weights (version 0). */
  configJson: string;
  initWeights: string;
  tokenizerDir: string;
  /** model.chat_template (absolute); absent or null: the tokenizer directory's own. */
  chatTemplate?: string | null;
  /** Directory of the config file, for relative paths in options. */
  baseDir: string;
  /** rollout.interrupt: how a policy update reaches generations under way (one of the plug-in's `interrupts`). */
  interrupt: RolloutInterrupt;
  /**
   * Where a trainer in this same process runs (the main job's), which hands each version's weights to the backend
   * (LlmBackend.stageWeights), and whether it trains LoRA adapters (then only they travel); absent where the backend
   * has a process of its own (a rollout worker, serve, eval).
   */
  colocatedTrainer?: { device: DeviceKind; adapters: boolean };
  logger: Logger;
}

export interface BackendPlugin<S extends TObject = TObject> {
  /** The backend's keys in the `backend:` section besides `name`, with defaults and descriptions. */
  options: S;
  /**
   * The rollout.interrupt modes it can honour (default: only 'next_turn', what a server that takes each request
   * on its current weights does); a run config naming another fails at start-up.
   */
  interrupts?: readonly RolloutInterrupt[];
  create(options: Static<S>, env: BackendEnv): Promise<LlmBackend>;
}

export const backends = new Registry<BackendPlugin>('LLM backend', objectShape('a backend plug-in ({ options: TypeBox object, create(options, env) })', ['create']));

export function registerBackend<S extends TObject>(name: string, plugin: BackendPlugin<S>): void {
  backends.register(name, plugin);
}

const BuiltinOptions = Type.Object(
  {
    max_batch: Type.Integer({ minimum: 1, default: 64, description: 'Most sequences decoded together.' }),
    threads: Type.Integer({ minimum: 1, default: 1, description: 'onnxruntime intra-op threads per engine.' }),
    workers: Type.Integer({ minimum: 1, default: 1, description: 'Engines in worker threads sharing the running batch (workers × threads up to the core count).' }),
    kv_cache_bytes: Type.Integer({ minimum: 0, default: 256 * 1024 * 1024, description: 'device cpu: bytes of KV cache for idle sessions kept between their turns, beyond the max_batch running ones, in whole slots of max_len tokens.' }),
    device: Type.Union([Type.Literal('cpu'), Type.Literal('cuda')], {
      default: 'cpu',
      description:
        "Where the policy runs: 'cpu' (onnxruntime-node) or 'cuda' (the native core's model on the GPU, a KV cache of up to max_batch slots of max_len tokens sized by gpu_memory_utilization, new versions written into it in place; rollout.interrupt next_turn or next_token; needs the addon built with RLSTREAM_CUDA=1).",
    }),
    max_len: Type.Optional(Type.Integer({ minimum: 1, description: "Tokens a KV-cache slot holds (a trajectory's whole context: a turn ends with finish length where it is full); default min(4096, max_position_embeddings)." })),
    devices: Type.Optional(
      Type.Array(Type.Integer({ minimum: 0 }), {
        minItems: 1,
        uniqueItems: true,
        description:
          "device cuda: rollout engines on GPUs of their own, one process per listed GPU index (CUDA's numbering), routed by least load with sticky sessions; in the main job with trainer.device cuda each new version is broadcast from the trainer's GPU to them over NCCL (with trainer.lora the adapters only), else read from its file. None of them may be a trainer GPU. Unset: one engine in the run's process on its GPU (docs/scaling.md).",
      }),
    ),
    gpu_memory_utilization: Type.Number({
      exclusiveMinimum: 0,
      maximum: 1,
      default: 0.5,
      description:
        "device cuda: the share of the GPU's memory the policy may hold, as vLLM's gpu_memory_utilization: its weights, a step's activations, in the main job with trainer.device cuda the copy of the trainer's newest weights it is handed, and the KV cache, which gets the rest of the share (never more than is free once the weights are loaded, at most max_batch slots of max_len tokens). A trainer on the same GPU needs what is left.",
    }),
  },
  { additionalProperties: false },
);

registerBackend('builtin', {
  options: BuiltinOptions,
  interrupts: ['next_turn', 'finish', 'next_token'],
  async create(o, env) {
    if (o.devices !== undefined) {
      const [{ checkEngineDevices }, { EngineProcesses }] = await Promise.all([import('../../native/gpus.ts'), import('../policy/engine-processes.ts')]);
      checkEngineDevices(o.devices, o.device);
      return EngineProcesses.start({
        devices: o.devices,
        device: 'cuda',
        source: { configJson: env.configJson, weightsPath: env.initWeights, version: 0 },
        maxBatch: o.max_batch,
        ...(o.max_len !== undefined ? { maxLen: o.max_len } : {}),
        gpuMemoryUtilization: o.gpu_memory_utilization,
        interrupt: env.interrupt,
        weightsGroup: env.colocatedTrainer?.device === 'cuda' ? 'cuda' : null,
        adapters: env.colocatedTrainer?.adapters === true,
        logger: env.logger.child({ role: 'policy' }),
      });
    }
    if (o.device === 'cuda') {
      const [{ cudaAvailable }, { NativePolicyBackend }] = await Promise.all([import('../../native/addon.ts'), import('../policy/native-backend.ts')]);
      if (!cudaAvailable())
        throw new RlstreamError('CONFIG_INVALID', 'backend.device: cuda needs the native addon built with RLSTREAM_CUDA=1 (RLSTREAM_CUDA=1 npm run build:native where nvcc is) and a GPU; or set backend.device: cpu');
      // A trainer with adapters publishes them as a small file and stages nothing: the engine keeps no room for a
      // copy of its weights (at 7B that copy is 28 GiB of the card).
      const stages = env.colocatedTrainer?.device === 'cuda' && !env.colocatedTrainer.adapters;
      return NativePolicyBackend.create(
        { configJson: env.configJson, weightsPath: env.initWeights, version: 0 },
        { device: 'cuda', maxBatch: o.max_batch, ...(o.max_len !== undefined ? { maxLen: o.max_len } : {}), gpuMemoryUtilization: o.gpu_memory_utilization, interrupt: env.interrupt, stagesTrainerWeights: stages, logger: env.logger.child({ role: 'policy' }) },
      );
    }
    const { BuiltinPolicyBackend } = await import('../policy/backend.ts');
    return BuiltinPolicyBackend.create(
      { configJson: env.configJson, weightsPath: env.initWeights, version: 0 },
      { maxBatch: o.max_batch, threads: o.threads, workers: o.workers, interrupt: env.interrupt, kvCacheBytes: o.kv_cache_bytes, ...(o.max_len !== undefined ? { maxLen: o.max_len } : {}), logger: env.logger.child({ role: 'policy' }) },
    );
  },
});

/** The server manager's options, shared by every backend made of inference servers. */
const managerOptions = {
  urls: Type.Array(Type.String({ pattern: '^https?://' }), { minItems: 1, description: 'Base URLs of the inference servers (http://host:port).' }),
  max_concurrency_per_server: Type.Integer({ minimum: 1, default: 256, description: 'Requests in flight per server before calls queue.' }),
  max_retries: Type.Integer({ minimum: 0, default: 3, description: 'Retries of a retriable failure (5xx, connection error) after the first attempt.' }),
  failures_to_mark_down: Type.Integer({ minimum: 1, default: 3, description: 'Consecutive failures that mark a server down (its sessions move elsewhere).' }),
  health_interval_ms: Type.Integer({ minimum: 0, default: 10_000, description: 'Health checks every this many ms (0: off).' }),
  request_timeout_ms: Type.Integer({ minimum: 1, default: 600_000, description: 'Per-request timeout.' }),
};

function manager(o: { max_concurrency_per_server: number; max_retries: number; failures_to_mark_down: number; health_interval_ms: number }, name: string, env: BackendEnv) {
  return { name, maxConcurrencyPerServer: o.max_concurrency_per_server, maxRetries: o.max_retries, failuresToMarkDown: o.failures_to_mark_down, healthIntervalMs: o.health_interval_ms, logger: env.logger.child({ role: 'backend' }) };
}

registerBackend('sglang', {
  options: Type.Object(
    {
      ...managerOptions,
      weight_sync: Type.Union([Type.Literal('none'), Type.Literal('update_weights_from_disk')], { default: 'none', description: "How new policy versions reach the servers: not at all, or SGLang's /update_weights_from_disk." }),
    },
    { additionalProperties: false },
  ),
  async create(o, env) {
    const [{ SglangServer }, { ServerManager }] = await Promise.all([import('./sglang.ts'), import('./server-manager.ts')]);
    return new ServerManager(o.urls.map((u) => new SglangServer(u, { requestTimeoutMs: o.request_timeout_ms, weightSync: o.weight_sync })), manager(o, 'sglang', env));
  },
});

registerBackend('vllm', {
  options: Type.Object(
    {
      ...managerOptions,
      model: Type.Optional(Type.String({ minLength: 1, description: 'The served model name (default: the first id of GET /v1/models).' })),
      weight_sync: Type.Union([Type.Literal('none'), Type.Literal('reload_weights')], {
        default: 'none',
        description: "How new policy versions reach the servers: not at all, or vLLM's in-place reload_weights through /collective_rpc (the server needs VLLM_SERVER_DEV_MODE=1).",
      }),
    },
    { additionalProperties: false },
  ),
  async create(o, env) {
    const [{ VllmServer }, { ServerManager }] = await Promise.all([import('./vllm.ts'), import('./server-manager.ts')]);
    if (o.weight_sync === 'none') env.logger.warn('backend vllm: weight_sync is none, the servers keep their own weights; training is off-policy, bounded by trainer.staleness_bound', { urls: o.urls });
    return new ServerManager(o.urls.map((u) => new VllmServer(u, { requestTimeoutMs: o.request_timeout_ms, weightSync: o.weight_sync, ...(o.model ? { model: o.model } : {}) })), manager(o, 'vllm', env));
  },
});

registerBackend('openai', {
  options: Type.Object(
    {
      ...managerOptions,
      model: Type.Optional(Type.String({ minLength: 1, description: 'The served model name (default: the first id of GET /v1/models).' })),
      api_key_env: Type.Optional(Type.String({ minLength: 1, description: 'Environment variable holding the API key sent as a bearer token (the key itself never goes in a config file).' })),
      extra_body: Type.Record(Type.String(), Type.Unknown(), { default: {}, description: "Extra request fields for the server at hand (e.g. vLLM's skip_special_tokens: false, SGLang's no_stop_trim)." }),
      health_path: Type.String({ pattern: '^/', default: '/health', description: 'Health endpoint (vLLM, SGLang and llama.cpp serve /health).' }),
    },
    { additionalProperties: false },
  ),
  async create(o, env) {
    const [{ OpenAiServer }, { ServerManager }, { ChatTokenizer }] = await Promise.all([import('./openai.ts'), import('./server-manager.ts'), import('../tokenizer/chat-tokenizer.ts')]);
    let apiKey: string | undefined;
    if (o.api_key_env !== undefined) {
      apiKey = process.env[o.api_key_env];
      if (!apiKey) throw new RlstreamError('CONFIG_INVALID', `backend.api_key_env: the environment variable ${o.api_key_env} is not set`);
    }
    let tokenizer: ChatTokenizer | undefined;
    const lazyTokenizer = env.tokenizerDir ? () => (tokenizer ??= ChatTokenizer.load(env.tokenizerDir, env.chatTemplate)) : undefined;
    // The generic API has no way to load weights: the servers keep serving what they started with.
    env.logger.warn('backend openai: the inference servers keep their own weights (no weight sync); training is off-policy, bounded by trainer.staleness_bound', { urls: o.urls });
    const servers = o.urls.map(
      (u) =>
        new OpenAiServer(u, {
          requestTimeoutMs: o.request_timeout_ms,
          healthPath: o.health_path,
          extraBody: o.extra_body,
          ...(o.model ? { model: o.model } : {}),
          ...(apiKey ? { apiKey } : {}),
          ...(lazyTokenizer ? { tokenizer: lazyTokenizer } : {}),
        }),
    );
    return new ServerManager(servers, manager(o, 'openai', env));
  },
});

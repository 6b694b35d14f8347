// The schema of every section of a run config, snake_case as written in YAML, each key with its type, range,
// default and meaning (docs/configuration.md is generated from these). Sections whose keys depend on a
// plug-in (log, registry, traces, backend, task) have a fixed part here and the plug-in's own options,
// looked up by its name when the config is compiled (cli/config/run-config.ts).
import { Type, type TObject, type TProperties } from '@sinclair/typebox';
import { intOrNull, oneOf, stringOrNull } from '../../core/config/validate.ts';
import { DEFAULT_KAFKA_CLIENT, KAFKA_CLIENT_LOG_LEVELS, KAFKA_CLIENTS, RDKAFKA_DEBUG_CONTEXTS } from '../../core/log/kafka/options.ts';
import { estimators } from '../../consumers/advantage/estimators.ts';

const obj = <P extends TProperties>(properties: P, description: string) => Type.Object(properties, { additionalProperties: false, default: {}, description });

const positiveInt = (dflt: number, description: string) => Type.Integer({ minimum: 1, default: dflt, description });
const nonNegative = (dflt: number, description: string) => Type.Number({ minimum: 0, default: dflt, description });

export const RunSection = obj(
  {
    id: Type.String({ pattern: '^[A-Za-z0-9._-]+$', default: 'run', description: 'Name of the run: letters, digits, ".", "_" and "-". The main job appends the seed and the start time.' }),
    data_dir: Type.String({ minLength: 1, default: '.rlstream/run', description: 'Everything a run writes (embedded log, checkpoints, weights, chDB traces, plots), relative to the config file.' }),
    seed: Type.Integer({ default: 1, description: 'Seed of the task streams, SFT and sampling.' }),
  },
  'The run: its name, where it writes, its seed.',
);

// ---- plug-in sections: `kind` (or `name`) picks the plug-in, the rest are its options ----------------

/**
 * Retention of the record topics (rollout.events, rewarded, advantaged), the bulk of a run's log. The small
 * topics (policy.versions, train.steps, control, dead.letter) keep everything: a restart reads its last step
 * and version back from them.
 */
export const TOPIC_RETENTION_DEFAULTS = { bytes: 512 * 1024 * 1024, ms: null } as const;

const topicRetention = {
  retention_bytes: intOrNull({ minimum: 1, default: TOPIC_RETENTION_DEFAULTS.bytes, description: 'Per partition of rollout.events, rewarded and advantaged: the oldest whole segments beyond this many bytes are deleted, read or not (as Kafka does); null: no limit. Applied when the run creates the topic.' }),
  retention_ms: intOrNull({ minimum: 1, default: TOPIC_RETENTION_DEFAULTS.ms, description: 'Per partition of the same topics: segments whose newest record is older than this are deleted; null: no limit.' }),
};

export const LOG_KINDS: Record<string, TObject> = {
  embedded: obj({ dir: stringOrNull({ default: null, description: 'Directory of the embedded log (default <run.data_dir>/log).' }), ...topicRetention }, 'The file-backed log in this process.'),
  kafka: obj(
    {
      brokers: Type.Unsafe<string | string[]>({ type: ['string', 'array'], items: { type: 'string', pattern: '^[^:\\s]+:\\d+$' }, minItems: 1, minLength: 1, description: 'host:port of the brokers: a list, or a comma-separated string (e.g. "${KAFKA_BROKERS}").' }),
      client: oneOf(KAFKA_CLIENTS, {
        default: DEFAULT_KAFKA_CLIENT,
        description: 'Client library: kafkajs (pure JavaScript) or librdkafka (@confluentinc/kafka-javascript; `bash infra/setup.sh --kafka-native` builds it). Which to choose and why: docs/kafka.md.',
      }),
      client_id: Type.String({ minLength: 1, default: 'rlstream', description: 'Kafka client id.' }),
      client_log_level: oneOf(KAFKA_CLIENT_LOG_LEVELS, { default: 'warn', description: "The Kafka library's own log lines at this level and above, in the role's log." }),
      client_debug: stringOrNull({
        default: null,
        description: `log.client librdkafka: its debug contexts, comma-separated (e.g. "eos,broker,cgrp" for transactions, connections and the consumer group), in the role's log at debug level (RLSTREAM_LOG_LEVEL=debug shows them); one of ${RDKAFKA_DEBUG_CONTEXTS.join(', ')}. 'conf' and 'all' would log secrets and are refused.`,
      }),
      ssl: Type.Boolean({ default: false, description: 'Connect with TLS.' }),
      sasl: Type.Optional(
        Type.Object(
          {
            mechanism: Type.String({ minLength: 1, description: 'SASL mechanism (plain, scram-sha-256, scram-sha-512).' }),
            username: Type.String({ minLength: 1, description: 'SASL user.' }),
            password: Type.String({ minLength: 1, description: 'SASL password; write "${VAR}" to keep it out of the file.' }),
          },
          { additionalProperties: false, description: 'SASL authentication (absent: none).' },
        ),
      ),
      ...topicRetention,
    },
    'Apache Kafka (the distributed shape).',
  ),
};

export const REGISTRY_KINDS: Record<string, TObject> = {
  embedded: obj({}, 'Schemas kept in the event log itself.'),
  http: obj({ url: Type.String({ pattern: '^https?://', description: 'Confluent-compatible schema registry URL.' }) }, 'An HTTP schema registry (Apicurio, Confluent).'),
};

const traceBatch = {
  batch_rows: Type.Optional(Type.Integer({ minimum: 1, description: "Rows per insert (default: the store's preferred batch)." })),
  batch_bytes: Type.Optional(Type.Integer({ minimum: 1, description: "Bytes per insert (default: the store's preferred batch)." })),
};

const ttlDays = (description: string) => ({ ttl_days: intOrNull({ minimum: 1, default: null, description }) });

export const TRACE_KINDS: Record<string, TObject> = {
  chdb: obj({ dir: stringOrNull({ default: null, description: 'Directory of the chDB store (default <run.data_dir>/chdb).' }), ...traceBatch, ...ttlDays('Trace rows older than this many days (by their event time) are deleted at merges; null: kept.') }, 'Embedded ClickHouse (chDB) in this process.'),
  clickhouse: obj(
    {
      url: Type.String({ pattern: '^https?://', description: 'ClickHouse server HTTP URL.' }),
      username: Type.String({ default: '', description: "User (default: the URL's user, else the server's default user)." }),
      password: Type.String({ default: '', description: 'Password; write "${VAR}" to keep it out of the file.' }),
      reader_username: Type.String({ default: '', description: "User untrusted SQL (the admin's SQL route, named queries) runs as: SELECT on the trace database only, read-only profile (docs/sql-security.md). Default: username." }),
      reader_password: Type.String({ default: '', description: 'Password of reader_username; write "${VAR}" to keep it out of the file.' }),
      database: Type.String({ minLength: 1, default: 'rlstream', description: 'Database of the trace tables.' }),
      ...traceBatch,
      ...ttlDays('Must stay null: the supported ClickHouse server (18.16) has no table TTL (added in 19.6); drop old monthly partitions with ALTER TABLE … DROP PARTITION instead.'),
    },
    'A ClickHouse server.',
  ),
  none: obj({}, 'No traces.'),
};

// ---- fixed sections ----------------------------------------------------------------------------------

export const AdminSection = obj(
  { port: Type.Integer({ minimum: 0, maximum: 65535, default: 0, description: 'Port of the admin server beside the main job (0: any free port; a busy port falls back to any).' }) },
  'The admin server (API, dashboard) the main job starts.',
);

export const ServeSection = obj(
  {
    enabled: Type.Boolean({ default: false, description: 'Main job: serve the run\'s backend as the OpenAI-compatible endpoint (docs/serve.md) beside its own rollouts; what outside agents complete through it is rewarded and trained on with the rest.' }),
    host: Type.String({ minLength: 1, default: '127.0.0.1', description: 'Address the endpoint listens on (`rlstream serve --host` overrides).' }),
    port: Type.Integer({ minimum: 0, maximum: 65535, default: 0, description: 'Port of the endpoint (0: any free port; the URL is printed and written to <run dir>/serve-url). `rlstream serve` listens on --port, else this port when not 0, else 8000.' }),
    model: stringOrNull({ default: null, description: 'The model id clients name (default: run.id as configured).' }),
    max_sessions: positiveInt(1024, 'Trajectories open at once; a call that would open one more gets 429.'),
    idle_timeout_ms: positiveInt(600_000, 'A trajectory without a call for this long is completed as aborted.'),
    body_limit_bytes: Type.Integer({ minimum: 1024, default: 4 * 1024 * 1024, description: 'Largest request body (413 above).' }),
    request_read_timeout_ms: positiveInt(30_000, 'A request whose headers and body are not all received within this is answered 408 and its connection closed (a trickled body holds no connection longer).'),
    max_prompt_tokens: intOrNull({ minimum: 1, default: null, description: "Longest prompt in tokens; a longer one gets 400 naming the limit before anything is generated (null: what the model's context leaves to the response budget, max_position_embeddings - rollout.response_length)." }),
    max_sessions_per_token: intOrNull({ minimum: 1, default: null, description: 'Trajectories one bearer token may hold open at once; a call beyond gets 429 (null: its fair share, max_sessions divided by the number of tokens, rounded up).' }),
    max_calls_per_token: positiveInt(256, 'Calls one bearer token may have in flight at once; a call beyond gets 429.'),
    data_source: stringOrNull({ default: null, description: "data_source recorded when a call names none (the reward consumer scores by it; default: the data_source of the task's one reward function, else the task's dataset name)." }),
  },
  'The OpenAI-compatible endpoint that records every call as trajectories: its settings for `rlstream serve` (flags override them) and the main job\'s serve role.',
);

export const ModelSection = obj(
  {
    config: stringOrNull({ default: null, description: "The model's config.json (relative to the config file)." }),
    tokenizer: stringOrNull({ default: null, description: 'Tokenizer directory (tokenizer.json, chat template).' }),
    chat_template: stringOrNull({ default: null, description: "A Jinja chat template file used instead of the tokenizer directory's own (verl's custom_chat_template, vLLM's --chat-template): e.g. a tool-call format for a model whose template has none." }),
    init: stringOrNull({ default: null, description: 'Warm start: a checkpoint directory (as `rlstream sft` writes) or a .safetensors file; trained by SFT when missing.' }),
    base: stringOrNull({ default: null, description: "Pretrained weights: a Hugging Face model directory (config.json, sharded safetensors with model.safetensors.index.json, tokenizer files, generation_config.json; docs/models.md), a .safetensors file or a checkpoint directory. A model directory is all a config needs: model.config, model.tokenizer and model.init default to it, and its generation_config.json gives the stop tokens and sampling defaults. Where model.init is set and does not exist, the SFT warm start begins from it; null: from random weights." }),
  },
  'The policy model (built-in backend and trainer).',
);

export const TaskCommon = {
  name: Type.String({ minLength: 1, default: 'files', description: 'The task, by registered name (calculator; files: rows from dataset.train / dataset.heldout).' }),
  module: stringOrNull({ default: null, description: "A task of one's own: module path (relative to the config file) exporting a Task plug-in." }),
  export: stringOrNull({ default: null, description: 'The export of `module` (default: default).' }),
  heldout_problems: positiveInt(200, 'Held-out rows evaluated before and after RL.'),
  train_rows: intOrNull({ minimum: 1, default: null, description: 'Train on the first N rows only (a finite run); null: the whole stream.' }),
};

export const DatasetSection = obj(
  {
    train: stringOrNull({ default: null, description: 'Training rows: a .jsonl or .parquet file in verl\'s row shape (relative to the config file).' }),
    heldout: stringOrNull({ default: null, description: 'Held-out rows, same format.' }),
    loader: stringOrNull({ default: null, description: 'Dataset loader by name (jsonl, parquet); default: by the file extension.' }),
  },
  'Dataset files, for tasks that read them (the files task).',
);

export const SftStageCommon = {
  problems: positiveInt(3000, 'Demonstrations generated for the stage.'),
  steps: Type.Integer({ minimum: 0, default: 300, description: 'Optimizer steps of the stage.' }),
  batch_tokens: positiveInt(2048, 'Tokens per optimizer step.'),
  micro_batch_tokens: positiveInt(2048, 'Tokens per forward/backward pass.'),
  learning_rate: Type.Number({ exclusiveMinimum: 0, default: 2e-3, description: 'Peak learning rate (linear warm-up, then cosine).' }),
  warmup_steps: Type.Integer({ minimum: 0, default: 20, description: 'Warm-up steps.' }),
  weight_decay: nonNegative(0, 'AdamW weight decay.'),
  grad_clip: Type.Number({ exclusiveMinimum: 0, default: 1, description: 'Gradient norm clip.' }),
  seed: intOrNull({ default: null, description: 'Seed of the stage (default: run.seed + the stage index).' }),
};

export const InteractionSection = obj(
  { config: stringOrNull({ default: null, description: "Interaction YAML in verl's shape (`interaction: [{name, class_name, config}]`, e.g. verl's gsm8k_interaction_config.yaml), relative to the config file: the run's interactions are then the file's (rows pick one by extra_info.interaction_kwargs.name), plus rollout.interactions. Default: the built-in gsm8k." }) },
  'The interactions (user simulators) of multi-turn rows.',
);

export const ToolsSection = obj(
  { config: stringOrNull({ default: null, description: "Tool-config YAML (verl's shape), relative to the config file; default: the task's own tools." }) },
  'The tools offered to the agent loop.',
);

export const RewardSection = obj(
  {
    name: stringOrNull({ default: null, description: "One registered reward function for every row (default: by each row's data_source)." }),
    module: stringOrNull({ default: null, description: 'Or user code: module path (relative to the config file) of a reward function (data_source, solution, ground_truth, extra_info) => number | {score, correct?}.' }),
    export: stringOrNull({ default: null, description: 'The export of `module` (default: default).' }),
    shaping: obj(
      {
        tool_success_bonus: nonNegative(0, 'Added once per successful tool call.'),
        invalid_call_penalty: nonNegative(0, 'Subtracted once per invalid or failed tool call.'),
        max_turns_penalty: nonNegative(0, 'Subtracted when the trajectory ended at the turn limit.'),
        overlong_buffer_len: Type.Integer({ minimum: 0, default: 0, description: "DAPO soft overlong punishment: the last N response tokens before rollout.response_length cost up to overlong_penalty_factor, linearly (component shaping.overlong; 0: off). Must be below response_length." }),
        overlong_penalty_factor: nonNegative(1, 'The overlong penalty at the length limit.'),
        mask_truncated: Type.Boolean({ default: false, description: 'DAPO overlong filtering: a trajectory cut at the token limit is kept out of the loss (RewardInfo.exclude_from_loss).' }),
      },
      'Shaping terms, each recorded as a named reward component.',
    ),
  },
  'The reward role.',
);

export const AdvantageSection = obj(
  {
    estimator: Type.String({ minLength: 1, default: 'grpo', description: `Advantage estimator by registered name (${estimators.names().join(', ')}); its options are the section of the same name below.` }),
    // Each registered estimator's own section (advantage.<name>), as trainer.<loss> for the policy losses.
    ...Object.fromEntries(estimators.names().map((n) => [n, estimators.get(n).options])),
    group_timeout_ms: positiveInt(60_000, 'A group still incomplete this long after its first member was written is closed: measured on record timestamps, by a newer record of its partition, or, once the partition is read to its end, by the consumer\'s wall clock counted from when it read the first member (docs/events.md, Groups).'),
    partial_groups: oneOf(['emit', 'drop'] as const, { default: 'emit', description: 'What a closed incomplete group does: emit the members present, or drop them.' }),
    dynamic_sampling: Type.Boolean({ default: false, description: "Drop groups whose rewards are all equal (DAPO's dynamic sampling)." }),
  },
  'The advantage role.',
);

export const ExportSection = obj(
  {
    every_versions: intOrNull({ minimum: 1, default: null, description: 'Write every N-th policy version the trainer publishes (N, 2N, …) as a Hugging Face model directory, as `rlstream export` writes one: config.json, safetensors shards with their index, tokenizer files, generation_config.json (null: never). The trainer writes it after the version is committed, before its next step; a directory that exists is never overwritten (logged and left).' }),
    dir: stringOrNull({ default: null, description: 'Where the versions go, one directory v<N> each (default <run dir>/export).' }),
    dtype: oneOf(['f32', 'bf16'] as const, { default: 'f32', description: "f32 (the trainer's weights exactly) or bf16 (half the size, rounded to nearest even)." }),
    max_shard_size: Type.Number({ minimum: 1, default: 5e9, description: "Largest shard in bytes (transformers' max_shard_size)." }),
  },
  'Policy versions written as Hugging Face model directories during a run (docs/models.md).',
);

export const EvalSection = obj(
  {
    every_steps: positiveInt(10, 'Main job: evaluate the held-out rows every this many training steps.'),
    problems: intOrNull({ minimum: 1, default: null, description: 'Held-out rows per evaluation during RL: the first this many of the task.heldout_problems, a set of its own name; null: all of them, the same problems as before and after RL.' }),
    success_threshold: Type.Number({ default: 1, description: "A held-out problem counts as solved when the task's own check says so; without one, when the reward function's correct flag says so; without that, when its reward is at least this (partial credit below it is not a solve)." }),
    every_versions: intOrNull({ minimum: 1, default: null, description: '`rlstream worker rollout`: evaluate every k-th policy version it serves (null: never).' }),
  },
  'Held-out evaluation during a run.',
);

// The producers' public surface: rollout workers that turn dataset rows into trajectories and publish
// them as events. Import from here; the files behind it may move.
//
// Typical wiring (one process, embedded log):
//
//   const tokenizer = ChatTokenizer.load(dir);                     // tokenizer.json + tokenizer_config.json
//   const tools = await loadToolConfig('tools.yaml');              // or new ToolSet().add(new CalculatorTool())
//   const backend = new ServerManager([new SglangServer(url)]);    // or the built-in policy, or ScriptedBackend in tests
//   const worker = new RolloutWorker(
//     { runId, log, serde, backend, tokenizer, tools, interactions: new InteractionRegistry().add(new Gsm8kInteraction()) },
//     { n: 8, concurrency: 64, staleness_bound: 1, groups_per_step: 4, max_assistant_turns: 5, response_length: 1024 },
//   );
//   await worker.run(readRows('rows.jsonl'));   // or any (async) iterable of rows, or (epoch) => iterable
//   const heldout = await worker.evaluate(testRows);               // greedy, split 'heldout', returns Trajectory[]
//   await worker.stop();                                            // { abort: true } ends in-flight ones as 'aborted'
//
// Datasets (dataset/): DatasetRow is verl's row shape {data_source, agent_name, prompt, reward_model:
//   {ground_truth, style}, extra_info: {split, index, tools_kwargs, interaction_kwargs}}. readRows(path)
//   reads .jsonl / .parquet; any Iterable or AsyncIterable of rows is a RowSource (procedural tasks).
//   Group ids: deriveId(runId, 'group', position, epoch); trajectory ids: deriveId(groupId, 'trajectory', k).
//   gsm8kRow() / `rlstream preprocess gsm8k` build tool-agent rows from raw GSM8K.
// Tokenizer (tokenizer/): ChatTokenizer.load(dir) → encode, decode, render(messages, {tools,
//   addGenerationPrompt, templateKwargs}), apply (render+encode), eosTokenId, specialTokens, isSpecial.
//   DeltaTokenizer: deltaIds(newMessages) = render([{}, ...new]) minus render([{}]) (verl), and
//   check(mode, running, messages, tools) against full re-tokenization ('strict' | 'ignore_strippable' | 'off').
//   Speed (results identical to the uncached paths, tested): encode() reuses the ids of pieces between
//   added tokens (segments.ts); a message shape (all but contents) seen twice whose rendering is fixed
//   text around the contents on probe contents is filled in instead of re-rendered (DeltaTokenizerOptions
//   .shapes); check() always renders with the template. The worker checks every
//   rollout.tokenization_check_every-th trajectory (default 8).
// Agent loops (agent/): AgentLoop {name, usesTools?, run(ctx) → Termination}; AgentRegistry.withBuiltins()
//   holds single_turn and tool_agent; register(loop) or load(name, 'path.ts[:export]') adds user loops.
//   Loops append turns only through ctx.recorder (TrajectoryRecorder), which emits TurnCompleted /
//   ToolCallCompleted and assembles the Trajectory; generateTurn / appendObservation (agent/steps.ts) are
//   the building blocks. ToolParser (hermes by default; registerToolParser) finds <tool_call>{json}</tool_call>.
//   Interaction {name, start?, respond(instanceId, messages, kwargs) → {terminate, content, reward}, finish?};
//   a row opts in with extra_info.interaction_kwargs.name; Gsm8kInteraction is built in.
// Tools (tools/): Tool {schema (OpenAI function), create(instanceId, createKwargs), execute(instanceId, args,
//   {signal}) → {text, reward?, metrics?, isError?}, calcReward?, release, close?}. ToolSet.add(tool, {timeoutMs})
//   validates arguments (ajv) and classifies outcomes ok | error | timeout | invalid_args | unknown_tool.
//   toolSetFromYaml / loadToolConfig read verl-style YAML (class_name: calculator | mcp | ./module.ts).
//   CalculatorTool / calculate(): exact rational arithmetic over a jsep AST, never eval.
//   McpConnection.connect({transport: 'stdio' | 'http', ...}) exposes an MCP server's tools.
// Backends (backends/): LlmBackend (types.ts). SglangServer (/generate), VllmServer (/v1/completions) are
//   InferenceServers; ServerManager(servers, options) is the LlmBackend over them (least in-flight, sticky
//   sessions, retries with backoff, caps, health checks). ScriptedBackend is a test double.
// Worker (worker.ts): RolloutWorker(deps, RolloutOptions) — options in options.ts (snake_case, as in the
//   config file's `rollout:` section; compileRolloutOptions gives field-named errors). Publishes to
//   TOPICS.rolloutEvents keyed by group_id; follows TOPICS.policyVersions (verifyPolicyVersion: sha256, then
//   backend.updatePolicy) and TOPICS.control; snapshot() gives metrics; onPolicyVersion / onControl / pause /
//   resume / setStalenessBound drive it directly.

export { RolloutWorker, type RolloutWorkerDeps, type EvaluateOptions, type WorkerSnapshot } from './worker.ts';
export { compileRolloutOptions, type RolloutOptions, type CompiledRolloutOptions } from './options.ts';
export { verifyPolicyVersion, sha256File, weightsPath } from './policy-sync.ts';
export { EventPublisher } from './publisher.ts';

export { validateRow, iterate, type DatasetRow, type RowSource, type ToolsKwargs } from './dataset/types.ts';
export { readRows, readJsonlRows, readParquetRows } from './dataset/files.ts';
export { gsm8kRow, extractGsm8kAnswer, GSM8K_DATA_SOURCE, GSM8K_SYSTEM_PROMPT } from './dataset/gsm8k.ts';

export { ChatTokenizer, type ChatMessage, type ChatTool, type RenderOptions } from './tokenizer/chat-tokenizer.ts';
export { DeltaTokenizer, compareTokens, type DeltaTokenizerOptions, type TokenizationCheckMode, type TokenizationCheck } from './tokenizer/delta.ts';

export { AgentRegistry } from './agent/registry.ts';
export { singleTurnLoop, toolAgentLoop, toEventMessages } from './agent/loops.ts';
export { generateTurn, appendObservation, type GeneratedTurn } from './agent/steps.ts';
export { TrajectoryRecorder, type TrajectoryMeta, type EventSink } from './agent/recorder.ts';
export { hermesToolParser, registerToolParser, toolParser, type ToolParser, type ToolParseResult, type ParsedToolCall } from './agent/tool-parser.ts';
export { Gsm8kInteraction, InteractionRegistry, extractHashAnswer, sameNumber, type Interaction, type InteractionReply } from './agent/interaction.ts';
export type { AgentLoop, AgentContext, AgentLimits } from './agent/types.ts';

export { ToolSet, ToolSession, type ToolCallOutcome } from './tools/tool-set.ts';
export { StatefulTool, type Tool, type ToolResult, type ToolCallContext } from './tools/types.ts';
export { CalculatorTool, calculate, CALCULATOR_SCHEMA } from './tools/calculator.ts';
export { toolSetFromYaml, loadToolConfig, BUILTIN_TOOLS } from './tools/config.ts';
export { McpConnection, McpTool, type McpServerConfig } from './tools/mcp.ts';

export { ServerManager, type ServerManagerOptions, type ServerStats } from './backends/server-manager.ts';
export { SglangServer, type SglangServerOptions } from './backends/sglang.ts';
export { VllmServer, type VllmServerOptions } from './backends/vllm.ts';
export { ScriptedBackend, type ScriptedBackendOptions, type ScriptTurn, type ScriptAnswer } from './backends/scripted.ts';
export type { InferenceServer, ServerOutput } from './backends/http.ts';
export type { LlmBackend, GenerateRequest, GenerateResult, PolicyUpdate, FinishReason } from './backends/types.ts';

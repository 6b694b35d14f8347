// The tool contract (verl's BaseTool lifecycle): create an instance per trajectory with the row's
// create_kwargs, execute calls against it, calcReward at the end, release. Implementations never see
// invalid arguments (the ToolSet validates them against the JSON schema first) and never time out
// silently (the ToolSet enforces the per-call timeout and aborts the signal).
import type { ChatTool } from '../tokenizer/chat-tokenizer.ts';

export interface ToolResult {
  /** What the model reads as the tool response. */
  text: string;
  /** Step reward for this call (verl's tool reward); 0 when absent. */
  reward?: number;
  metrics?: Record<string, number>;
  /** The call failed in a way the model should see (status error); the text explains it. */
  isError?: boolean;
}

export interface ToolCallContext {
  signal: AbortSignal;
  trajectoryId: string;
}

export interface Tool {
  /** OpenAI function shape; `function.parameters` is the JSON schema arguments are validated against. */
  readonly schema: ChatTool;
  /** A new instance for one trajectory. */
  create(instanceId: string, createKwargs: Record<string, unknown>): Promise<void> | void;
  execute(instanceId: string, args: Record<string, unknown>, ctx: ToolCallContext): Promise<ToolResult> | ToolResult;
  /** The instance's final reward (e.g. the score of its last answer); optional. */
  calcReward?(instanceId: string): Promise<number> | number;
  release(instanceId: string): Promise<void> | void;
  /**
   * The tool takes any JSON value the model wrote and handles it itself (verl's tools get the parsed arguments
   * unchecked); the session then skips the JSON-schema check. Default false.
   */
  readonly checksOwnArguments?: boolean;
  /** Close connections (MCP clients) when the tool set is closed. */
  close?(): Promise<void>;
}

/** Base for tools that keep one small state object per instance. */
export abstract class StatefulTool<S> implements Tool {
  protected readonly instances = new Map<string, S>();
  abstract readonly schema: ChatTool;
  protected abstract initialState(createKwargs: Record<string, unknown>): S;
  abstract execute(instanceId: string, args: Record<string, unknown>, ctx: ToolCallContext): Promise<ToolResult> | ToolResult;

  create(instanceId: string, createKwargs: Record<string, unknown>): void {
    this.instances.set(instanceId, this.initialState(createKwargs));
  }

  release(instanceId: string): void {
    this.instances.delete(instanceId);
  }

  protected state(instanceId: string): S | undefined {
    return this.instances.get(instanceId);
  }
}

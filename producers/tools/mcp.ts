// Tools served by an MCP server (Model Context Protocol), over stdio (a spawned process) or streamable
// HTTP. One client connection per server is shared by all trajectories; each listed tool becomes a Tool
// whose schema is the server's inputSchema. MCP tools are stateless here: create/release are no-ops.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { RlstreamError } from '../../core/errors.ts';
import type { ChatTool } from '../tokenizer/chat-tokenizer.ts';
import type { Tool, ToolCallContext, ToolResult } from './types.ts';

export type McpServerConfig =
  | { transport: 'stdio'; command: string; args?: string[]; env?: Record<string, string>; cwd?: string }
  | { transport: 'http'; url: string; headers?: Record<string, string> };

export interface McpConnectOptions {
  /** Only these tools (default: all the server lists). */
  include?: readonly string[];
  clientName?: string;
}

export class McpConnection {
  private constructor(
    readonly client: Client,
    readonly tools: McpTool[],
  ) {}

  static async connect(server: McpServerConfig, options: McpConnectOptions = {}): Promise<McpConnection> {
    const client = new Client({ name: options.clientName ?? 'rlstream-rollout', version: '0.1.0' });
    const transport =
      server.transport === 'stdio'
        ? new StdioClientTransport({ command: server.command, args: server.args ?? [], env: server.env ? { ...(process.env as Record<string, string>), ...server.env } : undefined, cwd: server.cwd, stderr: 'ignore' })
        : new StreamableHTTPClientTransport(new URL(server.url), server.headers ? { requestInit: { headers: server.headers } } : undefined);
    try {
      await client.connect(transport);
    } catch (cause) {
      const where = server.transport === 'stdio' ? `${server.command} ${(server.args ?? []).join(' ')}` : server.url;
      throw new RlstreamError('TOOL_UNKNOWN', `cannot connect to MCP server ${where}: ${(cause as Error).message}`, { cause });
    }
    const listed = await client.listTools();
    const conn = new McpConnection(client, []);
    for (const t of listed.tools) {
      if (options.include && !options.include.includes(t.name)) continue;
      conn.tools.push(new McpTool(conn, { type: 'function', function: { name: t.name, description: t.description ?? '', parameters: t.inputSchema as Record<string, unknown> } }));
    }
    return conn;
  }

  async close(): Promise<void> {
    await this.client.close();
  }
}

export class McpTool implements Tool {
  constructor(
    private readonly conn: McpConnection,
    readonly schema: ChatTool,
  ) {}

  create(): void {}

  release(): void {}

  async execute(_instanceId: string, args: Record<string, unknown>, ctx: ToolCallContext): Promise<ToolResult> {
    const res = await this.conn.client.callTool({ name: this.schema.function.name, arguments: args }, undefined, { signal: ctx.signal });
    const content = (res.content ?? []) as { type: string; text?: string }[];
    const text = content.map((c) => (c.type === 'text' ? (c.text ?? '') : `[${c.type}]`)).join('\n');
    return { text, isError: res.isError === true };
  }

  /** The connection is shared: the ToolSet closes it once through the first tool of the server. */
  async close(): Promise<void> {
    if (this.conn.tools[0] === this) await this.conn.close();
  }
}

// `rlstream tokenize --tokenizer <dir> [--generation-prompt]`: reads JSONL {messages, tools} on stdin and
// writes each line back with "text" (the rendered chat template) and "ids" (its token ids) added; a bad line
// is reported on stderr with its number, the others are written, and the exit code is then 1.
import type { Command } from 'commander';
import { describeError, RlstreamError } from '../../core/errors.ts';
import { BadLines, readJsonl } from '../../core/jsonl.ts';
import { ChatTokenizer, type ChatMessage, type ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';

export function register(program: Command): void {
  program
    .command('tokenize')
    .description('render {messages, tools} JSONL lines from stdin with a chat template and tokenize them')
    .requiredOption('--tokenizer <dir>', 'directory with tokenizer.json and tokenizer_config.json')
    .option('--generation-prompt', 'end with the assistant generation prompt', false)
    .action(async (opts: { tokenizer: string; generationPrompt: boolean }) => {
      const tok = ChatTokenizer.load(opts.tokenizer);
      const bad = new BadLines('tokenize');
      for await (const item of readJsonl(process.stdin)) {
        bad.seen(item.line);
        if (item.error !== undefined) {
          bad.report(item.line, item.error);
          continue;
        }
        try {
          const obj = item.value;
          if (!Array.isArray(obj['messages'])) throw new RlstreamError('INPUT_INVALID', '"messages" must be an array');
          const messages = obj['messages'] as ChatMessage[];
          messages.forEach((m, i) => {
            if (m === null || typeof m !== 'object' || typeof m.role !== 'string') throw new RlstreamError('INPUT_INVALID', `messages[${i}].role must be a string`);
            if (m.content === null || m.content === undefined) m.content = '';
            if (typeof m.content !== 'string') throw new RlstreamError('INPUT_INVALID', `messages[${i}].content must be a string`);
          });
          const tools = obj['tools'];
          if (tools !== undefined && tools !== null && !Array.isArray(tools)) throw new RlstreamError('INPUT_INVALID', '"tools" must be an array');
          const text = tok.render(messages, { tools: (tools as ChatTool[] | undefined) ?? null, addGenerationPrompt: opts.generationPrompt });
          process.stdout.write(JSON.stringify({ ...obj, text, ids: tok.encode(text) }) + '\n');
        } catch (err) {
          bad.report(item.line, describeError(err));
        }
      }
      bad.finish();
    });
}

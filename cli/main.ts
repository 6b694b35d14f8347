// The `rlstream` command. Each subcommand lives in cli/commands/<name>.ts and exports
// `register(program)`; they are discovered here so adding a command touches no shared file.
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Command } from 'commander';
import { describeError } from '../core/errors.ts';

export interface CommandModule {
  register(program: Command): void;
}

// Output piped into a reader that stops early (`| head`) is not an error of the command: end quietly.
process.stdout.on('error', (err: NodeJS.ErrnoException) => {
  if (err.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  throw err;
});

const program = new Command('rlstream')
  .description('Event-sourced streaming system for asynchronous, agentic RL of language models')
  .showHelpAfterError();

const dir = join(dirname(fileURLToPath(import.meta.url)), 'commands');
for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts')).sort()) {
  const mod = (await import(pathToFileURL(join(dir, file)).href)) as Partial<CommandModule>;
  mod.register?.(program);
}

try {
  await program.parseAsync(process.argv);
} catch (err) {
  console.error(`rlstream: ${describeError(err)}`);
  process.exitCode = process.exitCode || 1;
}

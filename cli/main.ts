// The `rlstream` command. Each subcommand lives in cli/commands/<name>.ts and exports
// `register(program)`; they are discovered here so adding a command touches no shared file.
import './secrets-first.ts';
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Command } from 'commander';
import { describeError } from '../core/errors.ts';
import { exitNow, stuckCalls } from '../core/stuck-calls.ts';

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

// Each file registers the command of its name. A process started for one command (a role a supervisor restarts,
// a test's child) loads that file alone: all of them bring in every role's libraries, seconds of start-up. Help
// for the whole program, and a name no file has (commander then suggests one), load every file.
const dir = join(dirname(fileURLToPath(import.meta.url)), 'commands');
const files = readdirSync(dir).filter((f) => f.endsWith('.ts')).sort();
const named = files.find((f) => f === `${process.argv[2] ?? ''}.ts`);
for (const file of named ? [named] : files) {
  const mod = (await import(pathToFileURL(join(dir, file)).href)) as Partial<CommandModule>;
  mod.register?.(program);
}

try {
  await program.parseAsync(process.argv);
} catch (err) {
  console.error(`rlstream: ${describeError(err)}`);
  process.exitCode = process.exitCode || 1;
}
// A call given up on still holds a thread that the normal end of the process would wait for (core/stuck-calls.ts).
if (stuckCalls().length > 0) exitNow(Number(process.exitCode ?? 0));

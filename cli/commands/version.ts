// `rlstream version`: prints the package version and the event contract's schemas.
import type { Command } from 'commander';
import { readFileSync } from 'node:fs';
import { EVENT_NAMES } from '../../schemas/index.ts';

export function register(program: Command): void {
  program
    .command('version')
    .description('print the rlstream version and the events of its contract')
    .action(() => {
      const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
      console.log(JSON.stringify({ version: pkg.version, events: EVENT_NAMES }));
    });
}

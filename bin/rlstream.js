#!/usr/bin/env node
// Entry point of the `rlstream` command: runs the TypeScript CLI through tsx's loader, so sources and
// the command can never drift apart (there is no stale build to forget).
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join } from 'node:path';
import { register } from 'tsx/esm/api';
import { register as registerCjs } from 'tsx/cjs/api';

// Both hooks, as `node --import tsx` sets them: a user's .ts module outside a package of type "module" (a task
// directory of one's own) is CommonJS to Node, and with the ESM hooks alone its import fails (ERR_REQUIRE_CYCLE_MODULE).
register();
registerCjs();
const root = dirname(dirname(fileURLToPath(import.meta.url)));
await import(pathToFileURL(join(root, 'cli', 'main.ts')).href);

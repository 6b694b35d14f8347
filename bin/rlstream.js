#!/usr/bin/env node
// Entry point of the `rlstream` command: runs the TypeScript CLI through tsx's loader, so sources and
// the command can never drift apart (there is no stale build to forget).
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join } from 'node:path';
import { register } from 'tsx/esm/api';

register();
const root = dirname(dirname(fileURLToPath(import.meta.url)));
await import(pathToFileURL(join(root, 'cli', 'main.ts')).href);

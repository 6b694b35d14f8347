// Benchmark dispatcher: `npm run bench -- <name>` (default: pipeline) imports bench/<name>.ts, runs its exported main(), prints
// what it prints, and writes the report main() returns to bench/out/<name>.json.
import { mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
// No name: the whole-pipeline report.
const name = process.argv[2] ?? 'pipeline';
if (!name || !/^[a-z0-9_-]+$/i.test(name) || name === 'main' || !existsSync(join(here, `${name}.ts`))) {
  console.error(`usage: npm run bench -- <name>   (a file bench/<name>.ts exporting main())`);
  process.exit(2);
}
const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as { main?: (args: string[]) => Promise<unknown> };
if (typeof mod.main !== 'function') {
  console.error(`bench/${name}.ts does not export main()`);
  process.exit(2);
}
const report = await mod.main(process.argv.slice(3));
mkdirSync(join(here, 'out'), { recursive: true });
const out = join(here, 'out', `${name}.json`);
writeFileSync(out, JSON.stringify({ name, at: new Date().toISOString(), host: { cpus: (await import('node:os')).cpus().length, node: process.version }, report }, null, 2) + '\n');
console.log(`report: ${out}`);

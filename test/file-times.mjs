// A node:test reporter for test/run.sh: after the usual report, each file's test time, slowest first, and the
// failed tests again. CI prints only the end of its log, and this is what says where the time went. JavaScript:
// node loads reporters before the --import hooks that would load TypeScript.
import process from 'node:process';

/** @param {AsyncIterable<import('node:test/reporters').TestEvent>} source */
export default async function* fileTimes(source) {
  /** @type {Map<string, number>} */
  const perFile = new Map();
  /** @type {string[]} */
  const failed = [];
  for await (const ev of source) {
    if ((ev.type !== 'test:pass' && ev.type !== 'test:fail') || ev.data.nesting !== 0) continue;
    const file = ev.data.file ?? '(unknown file)';
    perFile.set(file, (perFile.get(file) ?? 0) + (ev.data.details.duration_ms ?? 0));
    if (ev.type === 'test:fail') failed.push(`${file}: ${ev.data.name}`);
  }
  const rows = [...perFile].sort((a, b) => b[1] - a[1]);
  yield `# seconds per file (${rows.length} files)\n`;
  for (const [file, ms] of rows) yield `# ${(ms / 1000).toFixed(1).padStart(7)} ${file.replace(`${process.cwd()}/`, '')}\n`;
  yield failed.length === 0 ? '# no test failed\n' : `# failed:\n${failed.map((f) => `#   ${f}\n`).join('')}`;
}

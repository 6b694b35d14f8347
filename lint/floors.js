// The floors of the house and what each may import: an allow-list, checked by the ESLint rule `rlstream/floors`
// on every import ESLint itself parsed (static imports, `export … from`, `import()` of a literal path). Roles
// meet only at the event contract (schemas/), so no role imports another; what two roles share lives below both
// (core/tasks/, core/auth/). `npx eslint .` (part of `npm test`) fails on a violation; test/repo/floors.test.ts
// checks the rule and, independently, the import graph as TypeScript parses it.
import { dirname, join, normalize, relative, sep } from 'node:path';

const BASE = ['schemas', 'core', 'native'];
const ROLES = ['consumers/advantage', 'consumers/reward', 'consumers/replay', 'consumers/traces', 'consumers/trainer'];

/** By floor: the floors (or single files) it may import besides itself. A floor not listed here is refused. */
export const FLOORS = {
  schemas: [],
  // The lowest layer loads the native codecs (checksums, trace blocks), never the model.
  core: ['schemas', 'native/codecs.ts'],
  native: ['schemas', 'core'],
  'consumers/advantage': BASE,
  'consumers/reward': BASE,
  'consumers/trainer': BASE,
  'consumers/traces': BASE,
  // Replay re-runs the reward, advantage and trace stages over a recorded log: it composes them.
  'consumers/replay': [...BASE, 'consumers/reward', 'consumers/advantage', 'consumers/traces'],
  producers: BASE,
  // The admin server runs replay jobs.
  admin: [...BASE, 'consumers/replay'],
  // A task plug-in registers its reward functions and tools.
  examples: [...BASE, 'consumers/reward', 'producers'],
  cli: [...BASE, ...ROLES, 'producers', 'admin', 'examples'],
  testkit: [...BASE, ...ROLES, 'producers', 'admin', 'examples', 'cli'],
  bench: [...BASE, ...ROLES, 'producers', 'admin', 'examples', 'cli', 'testkit'],
};

/** Top-level folders whose every file belongs to a floor (the others, test/ and infra/ among them, are not checked). */
const CHECKED = new Set(Object.keys(FLOORS).map((f) => f.split('/')[0]));

/** The floor of a repository-relative path ('consumers/reward/x.ts' → 'consumers/reward'); null outside CHECKED. */
export function floorOf(path) {
  const parts = path.split('/');
  if (!CHECKED.has(parts[0])) return null;
  return parts[0] === 'consumers' ? parts.slice(0, 2).join('/') : parts[0];
}

/**
 * Why `from` (repository-relative) may not import `spec`, or null when it may. Package and node: imports are not
 * the floors' business; a relative path is resolved against the importing file first.
 */
export function violation(from, spec) {
  const source = floorOf(from);
  if (source === null) return null;
  if (!(source in FLOORS)) return `${source} is no floor of lint/floors.js: add it there with what it may import`;
  if (!spec.startsWith('.') && !spec.startsWith('/')) return null;
  const target = normalize(join(dirname(from), spec)).split(sep).join('/');
  if (target.startsWith('../')) return `imports ${spec}, outside the repository`;
  const floor = floorOf(target) ?? target.split('/')[0];
  if (floor === source) return null;
  const allowed = FLOORS[source];
  if (allowed.includes(floor) || allowed.includes(target)) return null;
  return `${source} may not import ${target}: ${source} imports only ${allowed.length ? allowed.join(', ') : 'itself'} (lint/floors.js)`;
}

/** The ESLint plugin: one rule, `floors`. */
export const plugin = {
  rules: {
    floors: {
      meta: { type: 'problem', docs: { description: 'Each floor imports only the floors below it that lint/floors.js allows' }, schema: [] },
      create(context) {
        const from = relative(context.cwd, context.filename).split(sep).join('/');
        const check = (node) => {
          const s = node.source;
          if (!s) return;
          const spec = s.type === 'Literal' && typeof s.value === 'string' ? s.value : s.type === 'TemplateLiteral' && s.expressions.length === 0 ? s.quasis[0].value.cooked : null;
          if (spec === null) return;
          const why = violation(from, spec);
          if (why) context.report({ node: s, message: why });
        };
        return { ImportDeclaration: check, ExportNamedDeclaration: check, ExportAllDeclaration: check, ImportExpression: check };
      },
    },
  },
};

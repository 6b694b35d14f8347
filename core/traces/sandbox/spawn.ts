// How the SQL sandbox process is started. Always: an empty environment, no inherited descriptors but the
// message channel (fd 3), process limits (prlimit: data segment, file size, 1024 descriptors, no core files).
// Then, by what this machine has:
// - 'bwrap' (bubblewrap installed): new user, mount, PID, IPC, UTS and (for chDB) network namespaces; the file
//   system it sees is /usr and the libraries read-only, node_modules and this directory read-only, an empty
//   /tmp, its own /proc and /dev, and its scratch directory, the one place it can write. Run as `nobody` when
//   this process is root. Nothing of the parent (tokens, admin-url, run directories, /proc/<pid>/environ of
//   other processes) exists in its world.
// - 'uid' (no bubblewrap, running as root): the process runs as `nobody` with the whole file system in view,
//   so it reads what every user may read and writes where every user may (/tmp, /dev/shm), but not a 0600
//   file of root's (tokens, admin-url) and not /proc/<pid>/environ of root's processes.
// - without either the sandbox refuses to start: the process would be the admin's own user.
import { spawnSync, type SpawnOptions } from 'node:child_process';
import { existsSync, realpathSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RlstreamError } from '../../errors.ts';

export type Isolation = 'bwrap' | 'uid';

/** The unprivileged user of the sandbox when this process is root (Debian's nobody/nogroup). */
export const SANDBOX_USER = { uid: 65534, gid: 65534 };

export interface SandboxLimits {
  /** RLIMIT_DATA of the process, bytes: the engine's heap and every private writable mapping. */
  dataBytes: number;
  /** RLIMIT_FSIZE: the largest file it may write, bytes. */
  fileBytes: number;
}

export interface SandboxCommand {
  isolation: Isolation;
  command: string;
  args: string[];
  options: SpawnOptions;
  /** The user the process runs as, when it is not this process's. */
  owner: { uid: number; gid: number } | null;
}

const HERE = dirname(fileURLToPath(import.meta.url));

function which(name: string): string | null {
  const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  const path = r.status === 0 ? r.stdout.trim() : '';
  return path === '' ? null : path;
}

/** The node_modules directory this code resolves packages from (the nearest one above this directory). */
function nodeModules(): string {
  for (let d = HERE; ; d = dirname(d)) {
    const nm = join(d, 'node_modules');
    if (existsSync(join(nm, 'chdb'))) return nm;
    if (dirname(d) === d) throw new RlstreamError('TRACE_STORE', `no node_modules with chdb above ${HERE}`);
  }
}

let cachedBwrap: string | null | undefined;
/** bubblewrap's path, or null; RLSTREAM_SQL_SANDBOX=uid forces the weaker mode (tests of it). */
function bwrap(): string | null {
  if (cachedBwrap === undefined) cachedBwrap = process.env['RLSTREAM_SQL_SANDBOX'] === 'uid' ? null : which('bwrap');
  return cachedBwrap;
}

/** Which isolation this machine gives, or why it gives none. */
export function sandboxIsolation(): Isolation | string {
  if (bwrap()) return 'bwrap';
  if (process.getuid?.() === 0) return 'uid';
  return 'untrusted SQL runs only in a sandbox: install bubblewrap (Debian: apt-get install bubblewrap), or run as root (the sandbox then drops to nobody)';
}

export function sandboxCommand(scratch: string, limits: SandboxLimits, network: boolean): SandboxCommand {
  const isolation = sandboxIsolation();
  if (isolation !== 'bwrap' && isolation !== 'uid') throw new RlstreamError('TRACE_STORE', isolation);
  const root = process.getuid?.() === 0;
  const owner = root ? SANDBOX_USER : null;
  const entry = join(HERE, 'worker.mjs');
  const node = realpathSync(process.execPath);
  const prlimit = [`--data=${limits.dataBytes}`, `--fsize=${limits.fileBytes}`, '--nofile=1024', '--core=0', '--'];
  const options: SpawnOptions = { env: {}, cwd: scratch, stdio: ['ignore', 'pipe', 'pipe', 'pipe'], ...(owner ?? {}) };
  if (isolation === 'uid') return { isolation, command: 'prlimit', args: [...prlimit, node, entry], options, owner };
  const nm = nodeModules();
  const args = [
    '--unshare-all',
    ...(network ? ['--share-net', '--ro-bind-try', '/etc/resolv.conf', '/etc/resolv.conf', '--ro-bind-try', '/etc/hosts', '/etc/hosts'] : []),
    '--die-with-parent',
    '--new-session',
    '--clearenv',
    '--ro-bind', '/usr', '/usr',
    ...['/lib', '/lib64', '/lib32', '/bin', '/sbin', '/etc/localtime'].flatMap((p) => ['--ro-bind-try', p, p]),
    '--proc', '/proc',
    '--dev', '/dev',
    '--tmpfs', '/tmp',
    ...(node.startsWith('/usr/') ? [] : ['--ro-bind', dirname(node), dirname(node)]),
    '--ro-bind', realpathSync(nm), resolve(nm),
    '--ro-bind', HERE, HERE,
    '--bind', scratch, scratch,
    '--chdir', scratch,
    '--',
    node,
    entry,
  ];
  return { isolation, command: 'prlimit', args: [...prlimit, bwrap()!, ...args], options, owner };
}

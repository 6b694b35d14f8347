// Where a benchmark's CPU time went, from Linux's /proc: this process's threads grouped by role (the main
// thread, chDB's insert and merge threads, Node's other threads), a ClickHouse server and a Kafka broker running
// on this machine, and the time the hypervisor took from this VM (steal). Node's other threads are V8's (garbage collection)
// and libuv's pool, where chDB's asynchronous queries run: the names do not tell those apart. Process-wide CPU alone could not say whether the
// client or the engine is the cost, nor that a VM's 2 cores are not 2 whole cores. Empty where /proc is absent.
import { readdirSync, readFileSync } from 'node:fs';
import { cpus } from 'node:os';

const TICKS = 100; // USER_HZ: /proc counts CPU time in 1/100 s on Linux

export type CpuRole = 'main thread' | 'engine inserts' | 'engine merges' | 'engine other' | 'node threads' | 'server process' | 'broker process';

export interface CpuSample {
  /** Seconds of CPU by role since boot (thread totals; threads that ended before the sample are not counted). */
  byRole: Map<CpuRole, number>;
  /** Seconds the hypervisor ran something else while this VM wanted its CPUs, all CPUs summed. */
  steal: number;
}

// chDB's threads carry ClickHouse's names; Node's (V8 platform workers, libuv's pool) carry the program's.
function roleOf(tid: string, comm: string): CpuRole {
  if (tid === String(process.pid)) return 'main thread';
  if (/^(QueryPipelineEx|ThreadPool|QueryPullPipeEx|QueryPushPipeEx)/.test(comm)) return 'engine inserts';
  if (/^MergeMutate/.test(comm)) return 'engine merges';
  if (/^(node|libuv|V8 )/.test(comm)) return 'node threads';
  return 'engine other';
}

function ticksOf(statLine: string): number {
  // Fields after the parenthesised name: utime and stime are the 12th and 13th.
  const f = statLine.slice(statLine.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);
}

/** Services of this machine by role: a process counts when its command line matches. */
const SERVICES: [CpuRole, RegExp][] = [
  ['server process', /^clickhouse-serv/],
  ['broker process', /\bkafka\.Kafka\b/], // the broker's JVM: its main class is on the command line
];

/** CPU ticks of each service role's processes; a role with no process running is absent. */
function serviceTicks(): Map<CpuRole, number> {
  const ticks = new Map<CpuRole, number>();
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const comm = readFileSync(`/proc/${pid}/comm`, 'utf8');
      // A JVM's comm is 'java': its main class is read from the command line (NUL-separated arguments).
      const name = comm.startsWith('java') ? readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ') : comm;
      const role = SERVICES.find(([, re]) => re.test(name))?.[0];
      if (role) ticks.set(role, (ticks.get(role) ?? 0) + ticksOf(readFileSync(`/proc/${pid}/stat`, 'utf8')));
    } catch {
      // the process ended while we looked
    }
  }
  return ticks;
}

export function sampleCpu(): CpuSample | null {
  try {
    const byRole = new Map<CpuRole, number>();
    for (const tid of readdirSync('/proc/self/task')) {
      try {
        const comm = readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim();
        const role = roleOf(tid, comm);
        byRole.set(role, (byRole.get(role) ?? 0) + ticksOf(readFileSync(`/proc/self/task/${tid}/stat`, 'utf8')) / TICKS);
      } catch {
        // the thread ended while we looked
      }
    }
    for (const [role, ticks] of serviceTicks()) byRole.set(role, ticks / TICKS);
    const cpu = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/);
    return { byRole, steal: Number(cpu[8] ?? 0) / TICKS };
  } catch {
    return null;
  }
}

export interface CpuReport {
  /** CPU-µs per row by role, over the stretch. */
  microsPerRow: Partial<Record<CpuRole, number>>;
  /** CPU-µs per row of every role together. */
  totalMicrosPerRow: number;
  /** Seconds of steal over the stretch. */
  stealSeconds: number;
  /** Rows/s this machine's cores could take at that cost, if every core did nothing else and none were stolen. */
  coresCap: number;
}

export function cpuReport(before: CpuSample | null, after: CpuSample | null, rows: number): CpuReport | null {
  if (!before || !after || rows <= 0) return null;
  const microsPerRow: Partial<Record<CpuRole, number>> = {};
  let total = 0;
  for (const [role, s] of after.byRole) {
    const us = ((s - (before.byRole.get(role) ?? 0)) * 1e6) / rows;
    if (us <= 0) continue;
    microsPerRow[role] = Math.round(us * 100) / 100;
    total += us;
  }
  return {
    microsPerRow,
    totalMicrosPerRow: Math.round(total * 100) / 100,
    stealSeconds: Math.round((after.steal - before.steal) * 10) / 10,
    coresCap: total > 0 ? Math.round((cpus().length * 1e6) / total) : 0,
  };
}

export function describeCpu(r: CpuReport | null): string {
  if (!r) return 'CPU by role: not available here (no /proc)';
  const parts = Object.entries(r.microsPerRow)
    .sort((a, b) => b[1] - a[1])
    .map(([role, us]) => `${role} ${us}`);
  return `CPU-µs a row: ${parts.join(', ')} = ${r.totalMicrosPerRow} in all, so at most ~${r.coresCap} rows/s on this machine's cores; steal ${r.stealSeconds} s`;
}

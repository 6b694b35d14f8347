// Native calls that never returned, and a process exit that does not wait for them. A client library's blocking
// call runs on a thread of libuv's pool, and Node's exit joins those threads: a process whose call never returns
// (librdkafka was seen to hang in a transactional call across a broker restart) never ends after process.exit.
// A role in that state has stopped working without exiting, so its supervisor neither restarts it nor sees a
// crash. Calls given up on are recorded here; exitNow ends such a process without the join.

const stuck = new Map<number, string>();
let next = 0;

/** Records a call given up on while it still holds a thread; the returned function forgets it (it came back late). */
export function markStuck(what: string): () => void {
  const id = next++;
  stuck.set(id, what);
  return () => void stuck.delete(id);
}

/** The calls given up on that have not come back. */
export function stuckCalls(): string[] {
  return [...stuck.values()];
}

/**
 * Ends the process with `code`, or, while a call given up on still holds a thread, with SIGKILL: a normal exit
 * would wait for that thread forever. The reason goes to stderr first.
 */
export function exitNow(code: number): never {
  const calls = stuckCalls();
  if (calls.length > 0) {
    process.stderr.write(
      `rlstream: ending with SIGKILL instead of exit code ${code}: ${calls.length} native call(s) never returned (${calls.slice(0, 3).join('; ')}), and a normal exit would wait for them forever\n`,
    );
    process.kill(process.pid, 'SIGKILL');
  }
  return process.exit(code);
}

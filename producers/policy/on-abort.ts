// Abort handling for one request of the built-in policy. The rollout worker passes one stop signal to every
// call for the whole run, so a listener must leave the signal when its request settles, or they pile up.

/** Run `onAbort` when `signal` aborts (at once if it already has), until `settled` settles. */
export function onAbortUntilSettled(signal: AbortSignal | undefined, onAbort: () => void, settled: Promise<unknown>): void {
  if (!signal) return;
  if (signal.aborted) return onAbort();
  signal.addEventListener('abort', onAbort, { once: true });
  const detach = () => signal.removeEventListener('abort', onAbort);
  settled.then(detach, detach);
}

// Progress of the main job on the terminal: cli-progress bars on a TTY, one plain line per update
// (rate-limited) otherwise, so logs of CI runs stay readable.
import cliProgress from 'cli-progress';

export interface Bar {
  update(value: number, total: number, note: string): void;
  done(): void;
}

/** ANSI: show the cursor again. */
const SHOW_CURSOR = '\x1B[?25h';
const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

export class Progress {
  private readonly multi: cliProgress.MultiBar | null;
  private readonly lastLine = new Map<string, number>();
  private readonly onSignal = (signal: NodeJS.Signals) => {
    this.stop();
    // Then the signal's own effect: the default (exit) when nobody else handles it.
    if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
  };
  private readonly onExit = () => void this.realWrite(SHOW_CURSOR);
  private readonly realWrite: (text: string) => boolean;
  private readonly stderrWrite = process.stderr.write;

  constructor(interactive: boolean) {
    const stderr = process.stderr;
    const write = stderr.write;
    this.realWrite = (text) => write.call(stderr, text);
    // The bars redraw over the lines they last drew: anything else written to stderr meanwhile (the admin's
    // URL, a warning) would be drawn over and lost. While the bars are up, such writes go above them
    // (MultiBar.log), and the bars write through a view of stderr that keeps the real write.
    const barStream = Object.create(stderr, { write: { value: (chunk: string) => write.call(stderr, chunk) } }) as NodeJS.WriteStream;
    this.multi = interactive
      ? new cliProgress.MultiBar(
          { format: '{name} [{bar}] {value}/{total} {note}', hideCursor: true, clearOnComplete: false, stream: barStream, barsize: 30 },
          cliProgress.Presets.shades_classic,
        )
      : null;
    // The bars hide the cursor; a Ctrl-C (or any end but stop()) would leave the user's terminal without one.
    if (this.multi) {
      const multi = this.multi;
      let pending = '';
      stderr.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
        pending += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
        const end = pending.lastIndexOf('\n');
        if (end >= 0) {
          multi.log(pending.slice(0, end + 1));
          pending = pending.slice(end + 1);
        }
        const done = rest.find((r) => typeof r === 'function') as (() => void) | undefined;
        done?.();
        return true;
      }) as typeof stderr.write;
      for (const s of SIGNALS) process.once(s, this.onSignal);
      process.once('exit', this.onExit);
    }
  }

  bar(name: string, total: number): Bar {
    const label = name.padEnd(6);
    if (this.multi) {
      const b = this.multi.create(Math.max(1, total), 0, { name: label, note: '' });
      return { update: (v, t, note) => (b.setTotal(Math.max(1, t)), b.update(v, { note })), done: () => b.stop() };
    }
    return {
      update: (v, t, note) => {
        const now = Date.now();
        if (v < t && now - (this.lastLine.get(name) ?? 0) < 2000) return;
        this.lastLine.set(name, now);
        process.stderr.write(`${label} ${v}/${t} ${note}\n`);
      },
      done: () => {},
    };
  }

  stop(): void {
    if (!this.multi) return;
    for (const s of SIGNALS) process.removeListener(s, this.onSignal);
    process.removeListener('exit', this.onExit);
    // Lines written since the last redraw wait in the bars' log buffer: draw once more so they are not lost.
    this.multi.update();
    this.multi.stop();
    process.stderr.write = this.stderrWrite;
    process.stderr.write(SHOW_CURSOR);
  }
}

// Progress of the main job on the terminal: cli-progress bars on a TTY, one plain line per update
// (rate-limited) otherwise, so logs of CI runs stay readable.
import cliProgress from 'cli-progress';

export interface Bar {
  update(value: number, total: number, note: string): void;
  done(): void;
}

export class Progress {
  private readonly multi: cliProgress.MultiBar | null;
  private readonly lastLine = new Map<string, number>();

  constructor(interactive: boolean) {
    this.multi = interactive
      ? new cliProgress.MultiBar(
          { format: '{name} [{bar}] {value}/{total} {note}', hideCursor: true, clearOnComplete: false, stream: process.stderr, barsize: 30 },
          cliProgress.Presets.shades_classic,
        )
      : null;
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
    this.multi?.stop();
  }
}

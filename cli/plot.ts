// A dependency-free SVG line chart: one panel per series, sharing the x axis (training step). Used by the
// main job to write its learning curves; the dashboard draws its own live charts.

/** One line of a panel: its points, how it is drawn, and its name in the panel's legend. */
export interface Line {
  label?: string;
  points: { x: number; y: number }[];
  color?: string;
  /** Faint and thin: the raw values under their moving average. */
  faint?: boolean;
  /** A dot on each point (default: when there are at most 60). */
  markers?: boolean;
  /** Points only, no connecting path (values of different kinds that a line would join). */
  noPath?: boolean;
}

export interface Series {
  name: string;
  /** A single line; or `lines` for several. */
  points?: { x: number; y: number }[];
  lines?: Line[];
  /** Draw `points` faint with their trailing moving average over this many points on top. */
  smooth?: number;
  /** Fixed y range; derived from the data when absent. */
  yMin?: number;
  yMax?: number;
}

const BLUE = '#1f77b4';

/** Trailing moving average over `window` points (fewer at the start). */
export function movingAverage(points: readonly { x: number; y: number }[], window: number): { x: number; y: number }[] {
  const out: { x: number; y: number }[] = [];
  let sum = 0;
  points.forEach((p, i) => {
    sum += p.y;
    if (i >= window) sum -= points[i - window]!.y;
    out.push({ x: p.x, y: sum / Math.min(i + 1, window) });
  });
  return out;
}

function linesOf(s: Series): Line[] {
  if (s.lines) return s.lines;
  const points = s.points ?? [];
  if (!s.smooth || s.smooth < 2) return [{ points }];
  return [
    { label: 'per step', points, faint: true, markers: false },
    { label: `moving average (${s.smooth} steps)`, points: movingAverage(points, s.smooth), markers: false },
  ];
}

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);
}

function fmt(v: number): string {
  if (Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0)) return v.toExponential(1);
  return Number(v.toFixed(2)).toString();
}

export function lineChartsSvg(title: string, xLabel: string, series: Series[], options: { width?: number; panelHeight?: number } = {}): string {
  const width = options.width ?? 720;
  const ph = options.panelHeight ?? 150;
  const left = 60;
  const right = 20;
  const top = 40;
  const gap = 40;
  const height = top + series.length * (ph + gap) + 20;
  const all = series.flatMap((s) => linesOf(s).flatMap((l) => l.points.map((p) => p.x)));
  const xMin = all.length ? Math.min(...all) : 0;
  const xMax = all.length ? Math.max(...all, xMin + 1) : 1;
  const sx = (x: number) => left + ((x - xMin) / (xMax - xMin)) * (width - left - right);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" font-size="15">${esc(title)}</text>`,
  ];
  series.forEach((s, i) => {
    const y0 = top + i * (ph + gap);
    const lines = linesOf(s);
    const ys = lines.flatMap((l) => l.points.map((p) => p.y));
    let yMin = s.yMin ?? (ys.length ? Math.min(...ys) : 0);
    let yMax = s.yMax ?? (ys.length ? Math.max(...ys) : 1);
    if (yMax - yMin < 1e-9) [yMin, yMax] = [yMin - 0.5, yMax + 0.5];
    const sy = (y: number) => y0 + ph - ((y - yMin) / (yMax - yMin)) * ph;
    out.push(`<rect x="${left}" y="${y0}" width="${width - left - right}" height="${ph}" fill="none" stroke="#ccc"/>`);
    out.push(`<text x="${left}" y="${y0 - 6}" font-size="12" font-weight="bold">${esc(s.name)}</text>`);
    for (const t of [0, 0.5, 1]) {
      const v = yMin + t * (yMax - yMin);
      out.push(`<text x="${left - 6}" y="${sy(v) + 4}" text-anchor="end" fill="#555">${fmt(v)}</text>`);
      out.push(`<line x1="${left}" x2="${width - right}" y1="${sy(v)}" y2="${sy(v)}" stroke="#eee"/>`);
    }
    for (const l of lines) {
      if (l.points.length === 0) continue;
      const color = l.color ?? BLUE;
      const attrs = l.faint ? `stroke="${color}" stroke-opacity="0.35" stroke-width="1"` : `stroke="${color}" stroke-width="1.8"`;
      if (!l.noPath) {
        const d = l.points.map((p, k) => `${k === 0 ? 'M' : 'L'}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(' ');
        out.push(`<path d="${d}" fill="none" ${attrs}/>`);
      }
      const markers = l.markers ?? l.points.length <= 60;
      for (const p of markers ? l.points : []) out.push(`<circle cx="${sx(p.x).toFixed(1)}" cy="${sy(p.y).toFixed(1)}" r="${l.noPath ? 3.5 : 2.2}" fill="${color}"${l.faint ? ' fill-opacity="0.35"' : ''}/>`);
    }
    // The legend, right-aligned above the panel, when the panel has named lines.
    const named = lines.filter((l) => l.label);
    let lx = width - right;
    for (const l of [...named].reverse()) {
      const text = esc(l.label!);
      out.push(`<text x="${lx}" y="${y0 - 6}" text-anchor="end" fill="#333" class="legend">${text}</text>`);
      // Sans-serif at 11 px runs about 6 px a character: the swatch goes left of the text.
      lx -= l.label!.length * 6 + 4;
      out.push(`<rect x="${lx - 8}" y="${y0 - 14}" width="8" height="8" fill="${l.color ?? BLUE}"${l.faint ? ' fill-opacity="0.35"' : ''}/>`);
      lx -= 18;
    }
    if (i === series.length - 1) {
      for (const t of [0, 0.5, 1]) {
        const x = xMin + t * (xMax - xMin);
        out.push(`<text x="${sx(x)}" y="${y0 + ph + 14}" text-anchor="middle" fill="#555">${fmt(x)}</text>`);
      }
      out.push(`<text x="${width / 2}" y="${y0 + ph + 30}" text-anchor="middle">${esc(xLabel)}</text>`);
    }
  });
  out.push('</svg>');
  return out.join('\n');
}

// Plain-SVG charts for the dashboard: a line chart (one <path> per series, a dot on each series' last point)
// and a bar chart. No library: the charts are small and this keeps the page self-contained.
/* global document, window */
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';
// Charts draw in their SVG's own viewBox units, so a wide chart gets a wider box, not a taller picture.
let W = 320;
let H = 160;
const PAD = { left: 40, right: 8, top: 8, bottom: 20 };

function el(name, attrs, text) {
  const e = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(v) {
  if (!Number.isFinite(v)) return '';
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 100000)) return v.toExponential(1);
  if (a >= 100) return v.toFixed(0);
  return Number(v.toPrecision(3)).toString();
}

function fmtX(v, isTime) {
  if (!isTime) return fmt(v);
  const d = new Date(v);
  return d.toTimeString().slice(0, 8);
}

function clear(svg) {
  const box = svg.viewBox && svg.viewBox.baseVal;
  W = box && box.width ? box.width : 320;
  H = box && box.height ? box.height : 160;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
}

/** A legend in the top-right corner: [{ name, color }], one swatch and name per line. */
function drawLegend(svg, entries) {
  entries.forEach((e, i) => {
    const y = PAD.top + 8 + 11 * i;
    svg.appendChild(el('rect', { class: 'swatch', x: W - PAD.right - 8, y: y - 7, width: 8, height: 8, fill: e.color }));
    svg.appendChild(el('text', { class: 'tick legend-entry', x: W - PAD.right - 12, y, 'text-anchor': 'end' }, e.name));
  });
}

/**
 * series: [{ name, color, points: [[x, y], ...] }] (null y values are skipped); options: { xIsTime, off, markers,
 * empty }: `off` is a reason the quantity is not measured (e.g. "KL off"), shown instead of a flat line of zeros;
 * `markers` puts a dot on every point (sparse measurements), not only the last; `empty` is the text with no data.
 */
function drawLineChart(svg, series, options) {
  clear(svg);
  const opts = options || {};
  const all = series.flatMap((s) => s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1])));
  svg.appendChild(el('line', { class: 'axis', x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }));
  svg.appendChild(el('line', { class: 'axis', x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }));
  if (opts.off) {
    svg.appendChild(el('text', { class: 'empty off', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, opts.off));
    svg.dataset.points = '0';
    svg.dataset.off = opts.off;
    return;
  }
  delete svg.dataset.off;
  if (all.length === 0) {
    svg.appendChild(el('text', { class: 'empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, opts.empty || 'no data yet'));
    svg.dataset.points = '0';
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0]));
  let x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => p[1]));
  let y1 = Math.max(...all.map((p) => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  for (const [v, y] of [[y1, PAD.top + 8], [y0, H - PAD.bottom]]) svg.appendChild(el('text', { class: 'tick', x: PAD.left - 4, y, 'text-anchor': 'end' }, fmt(v)));
  svg.appendChild(el('text', { class: 'tick', x: PAD.left, y: H - 4, 'text-anchor': 'start' }, fmtX(x0, opts.xIsTime)));
  svg.appendChild(el('text', { class: 'tick', x: W - PAD.right, y: H - 4, 'text-anchor': 'end' }, fmtX(x1, opts.xIsTime)));
  let count = 0;
  series.forEach((s) => {
    const pts = s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
    if (pts.length === 0) return;
    count += pts.length;
    const d = pts.map((p, k) => `${k === 0 ? 'M' : 'L'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ');
    svg.appendChild(el('path', { class: 'series', d, stroke: s.color, 'data-series': s.name, 'data-points': pts.length }));
    for (const p of opts.markers ? pts : [pts[pts.length - 1]]) {
      svg.appendChild(el('circle', { class: 'point', cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 2.5, fill: s.color, 'data-x': p[0], 'data-y': p[1] }));
    }
  });
  if (series.length > 1) drawLegend(svg, series);
  svg.dataset.points = String(count);
}

/**
 * bars: [{ label, value, high, color }]: value drawn solid (lag) in the bar's colour, high drawn faint behind it
 * (partition size); options: { legend: [{ name, color }], yLabel, empty }. Labels are short (a partition number):
 * what the colours mean goes in the legend, not into every label.
 */
function drawBarChart(svg, bars, options) {
  clear(svg);
  const opts = options || {};
  svg.appendChild(el('line', { class: 'axis', x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }));
  if (bars.length === 0) {
    svg.appendChild(el('text', { class: 'empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, opts.empty || 'no rollout partitions yet'));
    svg.dataset.bars = '0';
    return;
  }
  const max = Math.max(1, ...bars.map((b) => Math.max(b.value || 0, b.high || 0)));
  const legendWidth = opts.legend && opts.legend.length ? 120 : 0;
  const slot = (W - PAD.left - PAD.right - legendWidth) / bars.length;
  const bw = Math.max(2, slot * 0.6);
  const sy = (v) => ((H - PAD.top - PAD.bottom) * v) / max;
  svg.appendChild(el('text', { class: 'tick', x: PAD.left - 4, y: PAD.top + 8, 'text-anchor': 'end' }, fmt(max)));
  svg.appendChild(el('text', { class: 'tick', x: PAD.left - 4, y: H - PAD.bottom, 'text-anchor': 'end' }, '0'));
  if (opts.yLabel) svg.appendChild(el('text', { class: 'tick', x: 10, y: H / 2, 'text-anchor': 'middle', transform: `rotate(-90 10 ${H / 2})` }, opts.yLabel));
  bars.forEach((b, i) => {
    const x = PAD.left + i * slot + (slot - bw) / 2;
    if (b.high) svg.appendChild(el('rect', { class: 'bar high', x, y: H - PAD.bottom - sy(b.high), width: bw, height: sy(b.high) }));
    const v = b.value || 0;
    const rect = el('rect', { class: 'bar', x, y: H - PAD.bottom - sy(v), width: bw, height: Math.max(0, sy(v)), 'data-partition': b.label, ...(b.color ? { fill: b.color } : {}) });
    rect.appendChild(el('title', {}, b.title || `${b.label}: ${v}`));
    svg.appendChild(rect);
  });
  // Consecutive bars with the same label (one partition, several readers) share one label, centred under them.
  for (let i = 0; i < bars.length; ) {
    let j = i;
    while (j + 1 < bars.length && bars[j + 1].label === bars[i].label) j++;
    const mid = PAD.left + ((i + j + 1) / 2) * slot;
    svg.appendChild(el('text', { class: 'tick bar-label', x: mid, y: H - 6, 'text-anchor': 'middle' }, bars[i].label));
    i = j + 1;
  }
  if (opts.legend && opts.legend.length) drawLegend(svg, opts.legend);
  svg.dataset.bars = String(bars.length);
}

window.rlCharts = { drawLineChart, drawBarChart };

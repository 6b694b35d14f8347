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

/**
 * series: [{ name, color, points: [[x, y], ...] }] (null y values are skipped); options: { xIsTime }.
 */
function drawLineChart(svg, series, options) {
  clear(svg);
  const opts = options || {};
  const all = series.flatMap((s) => s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1])));
  svg.appendChild(el('line', { class: 'axis', x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }));
  svg.appendChild(el('line', { class: 'axis', x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }));
  if (all.length === 0) {
    svg.appendChild(el('text', { class: 'empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no data yet'));
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
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
    if (pts.length === 0) return;
    count += pts.length;
    const d = pts.map((p, k) => `${k === 0 ? 'M' : 'L'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ');
    svg.appendChild(el('path', { class: 'series', d, stroke: s.color, 'data-series': s.name, 'data-points': pts.length }));
    const last = pts[pts.length - 1];
    svg.appendChild(el('circle', { class: 'point', cx: sx(last[0]).toFixed(1), cy: sy(last[1]).toFixed(1), r: 2.5, fill: s.color }));
    if (series.length > 1) svg.appendChild(el('text', { class: 'tick', x: W - PAD.right, y: PAD.top + 8 + 10 * i, 'text-anchor': 'end', fill: s.color }, s.name));
  });
  svg.dataset.points = String(count);
}

/** bars: [{ label, value, high }]: value drawn solid (lag), high drawn faint behind it (partition size). */
function drawBarChart(svg, bars) {
  clear(svg);
  svg.appendChild(el('line', { class: 'axis', x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }));
  if (bars.length === 0) {
    svg.appendChild(el('text', { class: 'empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no rollout partitions yet'));
    svg.dataset.bars = '0';
    return;
  }
  const max = Math.max(1, ...bars.map((b) => Math.max(b.value || 0, b.high || 0)));
  const slot = (W - PAD.left - PAD.right) / bars.length;
  const bw = Math.max(2, slot * 0.6);
  const sy = (v) => ((H - PAD.top - PAD.bottom) * v) / max;
  svg.appendChild(el('text', { class: 'tick', x: PAD.left - 4, y: PAD.top + 8, 'text-anchor': 'end' }, fmt(max)));
  bars.forEach((b, i) => {
    const x = PAD.left + i * slot + (slot - bw) / 2;
    if (b.high) svg.appendChild(el('rect', { class: 'bar high', x, y: H - PAD.bottom - sy(b.high), width: bw, height: sy(b.high) }));
    const v = b.value || 0;
    svg.appendChild(el('rect', { class: 'bar', x, y: H - PAD.bottom - sy(v), width: bw, height: Math.max(0, sy(v)), 'data-partition': b.label }));
    svg.appendChild(el('text', { class: 'tick', x: x + bw / 2, y: H - 6, 'text-anchor': 'middle' }, b.label));
  });
  svg.dataset.bars = String(bars.length);
}

window.rlCharts = { drawLineChart, drawBarChart };

// The dashboard's behaviour: token handling (URL fragment or prompt → sessionStorage), polling the admin API
// every 1.5 s for the selected run, drawing the charts, the tool-call table and the trajectory viewer.
// Everything user- or model-written is inserted with textContent, never as HTML.
/* global window, document, location, history, sessionStorage, fetch, URL, URLSearchParams, setInterval, clearInterval, setTimeout */
'use strict';

const POLL_MS = 1500;
const TOKEN_KEY = 'rlstream.adminToken';
const COLORS = ['#2563eb', '#dc2626', '#059669', '#d97706', '#7c3aed'];
const MAX_TOKENS_SHOWN = 4000;

const state = { runId: null, steps: [], evaluations: [], lastStep: undefined, timer: null, polling: false, config: null };
const $ = (id) => document.getElementById(id);

function takeTokenFromFragment() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
  // Keep the token out of the address bar and the history.
  history.replaceState(null, '', location.pathname + location.search);
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

async function api(path, options) {
  const o = options || {};
  const headers = { authorization: `Bearer ${token()}` };
  if (o.body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(path, { method: o.method || 'GET', headers, body: o.body === undefined ? undefined : JSON.stringify(o.body) });
  let body = null;
  try { body = await res.json(); } catch { body = null; }
  if (res.status === 401) { showLogin('token rejected'); throw new ApiError(res.status, body); }
  if (!res.ok) throw new ApiError(res.status, body);
  return body;
}

function showLogin(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  stopPolling();
  $('main').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message || '';
}

function message(text) {
  $('message').textContent = text || '';
}

// ---- charts ----

function seriesOf(field, pick) {
  const xIsTime = $('x-axis').value === 'time';
  return state.steps.map((s) => [xIsTime ? s.time_ms : s.step, pick ? pick(s) : s[field]]).filter((p) => p[1] !== null && p[1] !== undefined);
}

/**
 * Held-out accuracy (share solved), one line per problem set, a dot on every evaluation: each is drawn at the step
 * that produced its version (or when it ran, on the time axis) and nowhere else — nothing is carried between them.
 */
function heldoutSeries(xIsTime) {
  const sets = [...new Set(state.evaluations.map((e) => e.problem_set))];
  return sets.map((set, i) => ({
    name: set,
    color: COLORS[(2 + i) % COLORS.length],
    points: state.evaluations
      .filter((e) => e.problem_set === set && e.accuracy !== null && (xIsTime || e.step !== null))
      .map((e) => [xIsTime ? e.time_ms : e.step, e.accuracy])
      .sort((a, b) => a[0] - b[0]),
  }));
}

/** The run's result in words: its final evaluation, else the latest one, each with its version and problem set. */
function showHeldout() {
  const evals = state.evaluations;
  const final = [...evals].reverse().find((e) => e.phase === 'final');
  const shown = final || evals[evals.length - 1];
  if (!shown) {
    $('heldout-result').textContent = 'no evaluation yet';
    return;
  }
  const at = `v${shown.policy_version}` + (shown.step === null ? '' : ` (step ${shown.step})`);
  const acc = shown.accuracy === null ? '—' : `${(shown.accuracy * 100).toFixed(1)}%`;
  const reward = shown.mean_reward === null ? '—' : shown.mean_reward.toFixed(3);
  $('heldout-result').textContent = `${final ? 'final' : 'latest'}: ${at} · ${shown.solved}/${shown.n} solved = ${acc} · mean reward ${reward} · ${shown.problem_set}`;
}

function drawCharts(lag, lagNote) {
  const xIsTime = $('x-axis').value === 'time';
  const line = (id, series) => window.rlCharts.drawLineChart($(id), series, { xIsTime });
  line('chart-reward', [{ name: 'reward', color: COLORS[0], points: seriesOf('reward_mean') }]);
  window.rlCharts.drawLineChart($('chart-heldout'), heldoutSeries(xIsTime), { xIsTime, markers: true, empty: 'no evaluation yet' });
  showHeldout();
  const kl = seriesOf('kl');
  window.rlCharts.drawLineChart($('chart-kl'), [{ name: 'kl', color: COLORS[1], points: kl }], { xIsTime, off: klOff(kl) });
  line('chart-entropy', [{ name: 'entropy', color: COLORS[4], points: seriesOf('entropy') }]);
  line('chart-staleness', [
    { name: 'mean', color: COLORS[3], points: seriesOf('staleness_mean') },
    { name: 'max', color: COLORS[1], points: seriesOf('staleness_max') },
  ]);
  line('chart-throughput', [{ name: 'tokens/s', color: COLORS[0], points: seriesOf('tokens_per_s') }]);
  if (lag) drawLag(lag, lagNote);
}

/**
 * "KL off" when the trainer keeps no reference model (trainer.kl_coef 0, the default): its KL is then 0 by
 * definition, and a flat line at 0 reads as a measurement. Without the run's config, all-zero values say so.
 */
function klOff(points) {
  const trainer = state.config && state.config.trainer;
  if (trainer) return Number(trainer.kl_coef || 0) > 0 ? null : 'KL off (trainer.kl_coef is 0: no reference model)';
  return points.length > 0 && points.every((p) => p[1] === 0) ? 'KL off (every step reports 0)' : null;
}

/** The consumer group's role: `<run id>.reward` → reward. */
function roleOf(groupId) {
  return groupId.slice(groupId.lastIndexOf('.') + 1) || groupId;
}

/**
 * Lag per partition of rollout.events, one colour per reading role (reward, traces, …) named in the legend;
 * each bar is labelled with its partition only. Without a reader there is no lag: the server's note says why.
 */
function drawLag(lag, note) {
  const roles = [...new Set(lag.filter((l) => l.groupId).map((l) => roleOf(l.groupId)))];
  const color = (l) => (l.groupId ? COLORS[roles.indexOf(roleOf(l.groupId)) % COLORS.length] : COLORS[0]);
  const sorted = [...lag].sort((a, b) => a.partition - b.partition || roles.indexOf(a.groupId && roleOf(a.groupId)) - roles.indexOf(b.groupId && roleOf(b.groupId)));
  const bars = sorted.map((l) => ({
    label: `p${l.partition}`,
    value: l.lag === null ? l.high : l.lag,
    high: l.lag === null ? 0 : l.high,
    color: color(l),
    title: l.groupId ? `${roleOf(l.groupId)} · partition ${l.partition}: ${l.lag} behind of ${l.high}` : `partition ${l.partition}: ${l.high} records`,
  }));
  const legend = roles.length ? roles.map((r, i) => ({ name: `${r} lag`, color: COLORS[i % COLORS.length] })) : [{ name: 'records', color: COLORS[0] }];
  window.rlCharts.drawBarChart($('chart-lag'), bars, { legend, yLabel: roles.length ? 'behind' : 'records', empty: note || undefined });
}

// ---- tool calls ----

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

async function refreshToolCalls() {
  const body = $('toolcalls').querySelector('tbody');
  try {
    const { toolCalls } = await api(`/api/tool-calls?runId=${encodeURIComponent(state.runId)}&limit=25`);
    $('toolcalls-meta').textContent = `${toolCalls.length} most recent`;
    body.replaceChildren();
    for (const c of toolCalls) {
      const tr = document.createElement('tr');
      cell(tr, new Date(c.time).toTimeString().slice(0, 8));
      cell(tr, c.toolName);
      cell(tr, c.status, `status-${c.status}`);
      cell(tr, `${c.latencyMs.toFixed(1)} ms`);
      cell(tr, c.argumentsJson, 'clip').title = c.argumentsJson;
      cell(tr, c.resultText, 'clip').title = c.resultText;
      const td = cell(tr, '');
      const a = document.createElement('a');
      a.textContent = c.trajectoryId.slice(0, 12);
      a.dataset.trajectory = c.trajectoryId;
      a.className = 'open-trajectory';
      a.addEventListener('click', () => openTrajectory(c.trajectoryId));
      td.appendChild(a);
      body.appendChild(tr);
    }
  } catch (err) {
    $('toolcalls-meta').textContent = err.code === 'ADM_ERR_UNAVAILABLE' ? 'no trace store in this process' : `unavailable: ${err.message}`;
  }
}

// ---- trajectory viewer ----

function div(cls, text) {
  const d = document.createElement('div');
  if (cls) d.className = cls;
  if (text !== undefined) d.textContent = text;
  return d;
}

/** A token's text in a chip: newlines and tabs as symbols, an all-space token as middle dots. */
function visible(text) {
  const t = String(text).replace(/\n/g, '↵').replace(/\t/g, '⇥');
  return t.trim() === '' ? '·'.repeat(Math.max(1, t.length)) : t;
}

/** Whether the trainer learned from the trajectory: a held-out one never, others when a step names them. */
function trainingText(t) {
  if (t.training && t.training.outcome === 'trained') return `trained at step ${t.training.step}`;
  if (t.training && t.training.outcome === 'dropped') return `not trained: dropped as too stale at step ${t.training.step}`;
  if (t.split && t.split !== 'train') return `not trained: ${t.split} split (evaluation only)`;
  return 'not trained (yet): no train step names it';
}

function renderTrajectory(t) {
  const root = $('trajectory');
  root.replaceChildren();
  const head = div('turn-head', `run ${t.runId} · group ${t.groupId.slice(0, 12)} · ${t.agentName} · ${t.dataSource}` +
    ` · reward ${t.reward === null ? '—' : t.reward}${t.correct === null ? '' : t.correct ? ' (correct)' : ' (wrong)'}` +
    ` · termination ${t.termination || '—'}`);
  root.appendChild(head);
  const training = div('turn-head training', trainingText(t));
  training.id = 'trajectory-training';
  root.appendChild(training);
  const prompt = div('turn prompt');
  prompt.appendChild(div('turn-head', `prompt · ${t.promptTokenIds.length} tokens`));
  prompt.appendChild(div('turn-text', t.promptText));
  root.appendChild(prompt);
  for (const turn of t.turns) {
    const box = div(`turn ${turn.role}`);
    const inLoss = turn.responseMask.reduce((a, m) => a + m, 0);
    // Mask 1 marks the tokens a step would train on; whether one did is the trajectory's line above.
    box.appendChild(div('turn-head', `turn ${turn.index} · ${turn.role} · ${turn.tokenIds.length} tokens (${inLoss} in the loss mask)` + (turn.policyVersion >= 0 ? ` · policy v${turn.policyVersion}` : '')));
    box.appendChild(div('turn-text', turn.text));
    const toks = div(turn.tokenTexts ? 'tokens' : 'tokens ids');
    const n = Math.min(turn.tokenIds.length, MAX_TOKENS_SHOWN);
    for (let i = 0; i < n; i++) {
      const span = document.createElement('span');
      const m = turn.responseMask[i] ? 1 : 0;
      span.className = `tok m${m}`;
      // The token's text where the server could decode it (whitespace made visible), its id otherwise.
      span.textContent = turn.tokenTexts ? visible(turn.tokenTexts[i]) : String(turn.tokenIds[i]);
      const lp = turn.logprobs[i];
      span.title = `id ${turn.tokenIds[i]} · mask ${m}` + (lp === undefined || lp === null ? '' : ` · logprob ${lp.toFixed(3)}`);
      toks.appendChild(span);
    }
    if (turn.tokenIds.length > n) toks.appendChild(div('meta', `… ${turn.tokenIds.length - n} more`));
    box.appendChild(toks);
    // Tool calls made in this turn, each with its result inline.
    for (const c of t.toolCalls.filter((c) => c.turnIndex === turn.index)) {
      const r = div('tool-result');
      r.dataset.call = c.callId;
      r.appendChild(div('', `⚙ ${c.toolName} · ${c.status} · ${c.latencyMs.toFixed(1)} ms`));
      const args = document.createElement('pre');
      args.textContent = `args: ${c.argumentsJson}`;
      const res = document.createElement('pre');
      res.textContent = `→ ${c.resultText}`;
      r.appendChild(args);
      r.appendChild(res);
      box.appendChild(r);
    }
    root.appendChild(box);
  }
}

async function openTrajectory(id) {
  try {
    const t = await api(`/api/trajectories/${encodeURIComponent(id)}`);
    $('trajectory-id').textContent = id;
    $('trajectory-panel').hidden = false;
    renderTrajectory(t);
    $('trajectory-panel').scrollIntoView({ block: 'nearest' });
  } catch (err) {
    message(`trajectory ${id}: ${err.message}`);
  }
}

// ---- run status and polling ----

/** What a status says to a person: a run that ended by itself is finished. */
const STATUS_LABELS = { completed: 'finished' };

function showRun(run) {
  const badge = $('run-status');
  badge.textContent = STATUS_LABELS[run.status] || run.status;
  badge.className = `badge ${run.status}`;
  $('run-meta').textContent = `step ${run.lastStep === null ? '—' : run.lastStep} · policy v${run.lastPolicyVersion === null ? '—' : run.lastPolicyVersion}` +
    (run.stalenessBound === null ? '' : ` · staleness ≤ ${run.stalenessBound}`);
}

async function poll() {
  if (state.polling || !state.runId) return;
  state.polling = true;
  try {
    const q = state.lastStep === undefined ? '' : `&after=${state.lastStep}`;
    const live = await api(`/api/runs/${encodeURIComponent(state.runId)}/live?limit=5000${q}`);
    showRun(live.run);
    if (live.steps.length) {
      state.steps.push(...live.steps);
      state.lastStep = live.steps[live.steps.length - 1].step;
    }
    state.evaluations = live.evaluations || [];
    drawCharts(live.rolloutLag, live.rolloutLagNote);
    await refreshToolCalls();
    $('live-indicator').classList.toggle('on');
    message('');
  } catch (err) {
    if (err.status !== 401) message(`polling: ${err.message}`);
  } finally {
    state.polling = false;
  }
}

function stopPolling() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

function selectRun(id) {
  state.runId = id;
  state.steps = [];
  state.evaluations = [];
  state.lastStep = undefined;
  state.config = null;
  // The run's config says what is off (KL without a reference model); a run known only from its events has none.
  api(`/api/runs/${encodeURIComponent(id)}/config`)
    .then((r) => { if (state.runId === id && r.config && Object.keys(r.config).length) state.config = r.config; })
    .catch(() => {});
  const url = new URL(location.href);
  url.searchParams.set('run', id);
  history.replaceState(null, '', url.pathname + url.search);
  stopPolling();
  void poll();
  state.timer = setInterval(poll, POLL_MS);
}

async function control(command) {
  try {
    await api(`/api/runs/${encodeURIComponent(state.runId)}/control/${command}`, { method: 'POST', body: { reason: 'dashboard' } });
    message(`${command} sent`);
  } catch (err) {
    message(err.status === 403 ? `${command} needs a control token` : `${command}: ${err.message}`);
  }
}

async function start() {
  $('login').hidden = true;
  $('main').hidden = false;
  let runs;
  try {
    ({ runs } = await api('/api/runs'));
  } catch (err) {
    if (err.status !== 401) message(`cannot list runs: ${err.message}`);
    return;
  }
  const sel = $('run-select');
  sel.replaceChildren();
  for (const r of runs) {
    const o = document.createElement('option');
    o.value = r.id;
    o.textContent = r.id;
    sel.appendChild(o);
  }
  const wanted = new URLSearchParams(location.search).get('run');
  const id = runs.some((r) => r.id === wanted) ? wanted : runs[0] && runs[0].id;
  if (!id) {
    message('no runs yet; waiting for one');
    setTimeout(start, POLL_MS);
    return;
  }
  sel.value = id;
  selectRun(id);
}

function init() {
  takeTokenFromFragment();
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = $('token-input').value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    $('token-input').value = '';
    void start();
  });
  $('run-select').addEventListener('change', (e) => selectRun(e.target.value));
  $('x-axis').addEventListener('change', () => drawCharts(null));
  $('btn-pause').addEventListener('click', () => control('pause'));
  $('btn-resume').addEventListener('click', () => control('resume'));
  $('trajectory-close').addEventListener('click', () => { $('trajectory-panel').hidden = true; });
  if (token()) void start();
  else showLogin('');
}

init();

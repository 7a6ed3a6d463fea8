// tunelab ui: the page's behaviour. Every figure shown comes from the JSON API (ui/server.py); nothing is computed
// here beyond unit conversion for display.
"use strict";

const $ = (sel) => document.querySelector(sel);
const GiB = 2 ** 30;
const COLORS = ["#2f6fdd", "#e8793a", "#17a589", "#b3261e", "#8e44ad", "#7f8c8d", "#c29d0b", "#34495e"];
let selectedRun = null;
let selectedBench = null;

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const text = await response.text();
  let value;
  try { value = JSON.parse(text); } catch { value = { error: text }; }
  if (!response.ok) throw new Error(value.error || text);
  return value;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function duration(s) {
  if (s == null) return "";
  if (s < 90) return `${s.toFixed(1)} s`;
  if (s < 5400) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(2)} h`;
}
const gib = (b) => (b == null ? "" : `${(b / GiB).toFixed(2)} GiB`);
const num = (x, d = 0) => (x == null ? "" : Number(x).toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d }));

function showTab(name) {
  for (const p of document.querySelectorAll(".panel")) p.hidden = p.id !== name;
  for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t.dataset.tab === name);
  if (name === "runs" || name === "try" || name === "start") refreshRuns();
}

// ---- Plan ----
async function loadChoices() {
  const c = await api("/api/choices");
  for (const m of c.models) $("#models").append(el("option", { value: m }));
  for (const m of c.methods) $("#plan-method").append(el("option", { value: m }, m));
  for (const o of c.objectives) $("#plan-objective").append(el("option", { value: o }, o));
  for (const g of c.gpus) {
    const box = el("input", { type: "checkbox", name: "gpu", value: g });
    if (g === c.default_gpu) box.checked = true;
    $("#plan-gpus").append(el("label", {}, box, g));
  }
  for (const name of c.configs) $("#start-config").append(el("option", { value: name }, name));
  $("#runs-dir").textContent = c.runs_dir;
}

function planForm() {
  const f = $("#plan-form");
  const form = {};
  for (const key of ["model", "method", "objective", "seq_len", "micro_batch", "data_path", "examples", "mean_tokens", "price_per_hour"]) {
    form[key] = f.elements[key].value;
  }
  if (form.data_path) { form.examples = ""; }
  form.packing = f.elements.packing.checked;
  form.grad_ckpt = f.elements.grad_ckpt.checked;
  form.gpu = [...f.querySelectorAll("input[name=gpu]:checked")].map((b) => b.value);
  return form;
}

async function submitPlan(event) {
  event.preventDefault();
  $("#plan-error").textContent = "";
  $("#plan-submit").disabled = true;
  try {
    const out = await api("/api/plan", planForm());
    showPlan(out);
  } catch (e) {
    $("#plan-error").textContent = e.message;
  } finally {
    $("#plan-submit").disabled = false;
  }
}

function cheapest(record) {
  const costs = Object.values(record.cost_usd || {});
  return costs.length ? Math.min(...costs) : null;
}

function cell(key, value, text) {
  return el("td", { "data-key": key, "data-value": value == null ? "" : String(value) }, text);
}

function gpuTable(r) {
  const rows = [
    ["time", "time_s", r.time_s, duration(r.time_s)],
    ["training", "train_s", r.train_s, duration(r.train_s)],
    ["tokens/s fed", "tokens_per_s", r.tokens_per_s, num(r.tokens_per_s)],
    ["optimizer steps", "optimizer_steps", r.optimizer_steps, num(r.optimizer_steps)],
    ["peak memory", "peak_memory_bytes", r.peak_memory_bytes, `${gib(r.peak_memory_bytes)} of ${gib(r.memory_capacity_bytes)}`],
    ["fits", "fits", r.fits, r.fits ? "fits" : "does not fit"],
    ["largest micro-batch", "max_micro_batch", r.max_micro_batch, String(r.max_micro_batch)],
  ];
  for (const [provider, usd] of Object.entries(r.cost_usd || {})) rows.push([`cost (${provider})`, `cost_usd.${provider}`, usd, `$${num(usd, 2)}`]);
  const step = r.step_s || {};
  const total = Object.values(step).reduce((a, b) => a + b, 0);
  for (const [part, s] of Object.entries(step)) {
    rows.push([`step: ${part.replace(/_s$/, "")}`, `step_s.${part}`, s, `${num(s * 1e3, 1)} ms (${Math.round((100 * s) / total)}%)`]);
  }
  const body = el("tbody");
  for (const [label, key, value, text] of rows) {
    const td = cell(key, value, text);
    if (key === "fits") td.className = r.fits ? "fits" : "nofit";
    body.append(el("tr", {}, el("th", {}, label), td));
  }
  return el("div", { class: "gpu-table", "data-gpu": r.gpu }, el("h3", {}, `${r.gpu_name} (${r.gpu})`), el("table", {}, body));
}

function barChart(target, labels, values, color, unit) {
  target.replaceChildren();
  const xs = labels.map((_, i) => i);
  const opts = {
    width: 420, height: 220, legend: { show: false }, cursor: { show: false },
    scales: { x: { time: false, range: [-0.6, labels.length - 0.4] }, y: { range: (u, lo, hi) => [0, hi * 1.15 || 1] } },
    axes: [
      { splits: () => xs, values: (u, splits) => splits.map((i) => labels[i] ?? "") },
      { values: (u, splits) => splits.map((v) => `${v}${unit}`), size: 60 },
    ],
    series: [{}, { stroke: color, fill: color + "cc", paths: uPlot.paths.bars({ size: [0.6, 80] }), points: { show: false } }],
  };
  return new uPlot(opts, [xs, values], target);
}

function memoryChart(target, records) {
  target.replaceChildren();
  const parts = Object.keys(records[0].memory_breakdown);
  const widest = Math.max(...records.map((r) => Math.max(r.memory_capacity_bytes, r.peak_memory_bytes)));
  const scale = 520 / widest;
  for (const r of records) {
    const track = el("div", { class: "track" });
    let left = 0;
    parts.forEach((part, i) => {
      const w = r.memory_breakdown[part] * scale;
      track.append(el("div", { class: "seg", style: `left:${left}px;width:${w}px;background:${COLORS[i % COLORS.length]}`, title: `${part}: ${gib(r.memory_breakdown[part])}` }));
      left += w;
    });
    track.append(el("div", { class: "cap", style: `left:${r.memory_capacity_bytes * scale}px`, title: `capacity ${gib(r.memory_capacity_bytes)}` }));
    target.append(el("div", { class: "membar" }, el("span", { class: "name" }, r.gpu), track,
      el("span", { class: r.fits ? "fits" : "nofit" }, `${gib(r.peak_memory_bytes)} / ${gib(r.memory_capacity_bytes)}`)));
  }
  const legend = el("div", { class: "legend" });
  parts.forEach((p, i) => legend.append(el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), p.replace(/_/g, " "))));
  legend.append(el("span", {}, el("i", { style: "background:#1d2330;width:2px" }), "capacity"));
  target.append(legend);
}

function showPlan(out) {
  const records = out.records;
  $("#plan-command").textContent = out.command;
  $("#plan-out").hidden = false;
  const labels = records.map((r) => r.gpu);
  barChart($("#chart-time"), labels, records.map((r) => r.time_s / 3600), COLORS[0], " h");
  barChart($("#chart-cost"), labels, records.map((r) => cheapest(r)), COLORS[1], " $");
  memoryChart($("#chart-memory"), records);
  $("#plan-tables").replaceChildren(el("div", { class: "gpu-tables" }, ...records.map(gpuTable)));
}

// ---- Runs ----
async function refreshRuns() {
  let data;
  try { data = await api("/api/runs"); } catch (e) { return; }
  const body = $("#runs-table tbody");
  body.replaceChildren();
  for (const r of data.runs) {
    body.append(el("tr", { class: "clickable", "data-run": r.name, onclick: () => selectRun(r.name) },
      el("td", {}, r.name), el("td", { class: `status-${r.status}` }, r.status),
      el("td", {}, r.step == null ? "" : `${r.step}${r.total_steps ? " / " + r.total_steps : ""}`),
      el("td", {}, r.loss == null ? "" : r.loss.toFixed(4)), el("td", {}, r.adapter ? "yes" : "")));
  }
  const chosen = $("#try-run").value;
  $("#try-run").replaceChildren(...data.runs.filter((r) => r.adapter).map((r) => el("option", { value: r.name }, r.name)));
  if (chosen) $("#try-run").value = chosen;
  $("#bench-list").replaceChildren(...data.bench.map((b) => el("li", {}, el("a", { href: "#", "data-db": b, onclick: (e) => { e.preventDefault(); selectBench(b); } }, b))));
  showJobs(data.jobs);
}

async function selectRun(name) {
  selectedRun = name;
  await refreshRun();
}

let lossPlot = null;
async function refreshRun() {
  if (!selectedRun) return;
  let d;
  try { d = await api(`/api/run?name=${encodeURIComponent(selectedRun)}`); } catch (e) { return; }
  $("#run-detail").hidden = false;
  $("#run-name").textContent = d.name;
  const status = $("#run-status");
  status.textContent = d.status;
  status.className = `status-${d.status}`;
  $("#run-step").textContent = d.step == null ? "" : `${d.step}${d.total_steps ? " / " + d.total_steps : ""}`;
  $("#run-step").dataset.step = d.step ?? "";
  $("#run-tps").textContent = num(d.tokens_nonpad_per_s);
  $("#run-mem").textContent = gib(d.peak_memory_bytes);
  $("#run-eta").textContent = d.status === "running" ? duration(d.eta_s) : "";
  $("#run-config").textContent = d.config;
  const comp = $("#run-comparison tbody");
  // Labels, units and values as figures.py writes them (the demo's table and docs/metrics.md read it too).
  comp.replaceChildren(...d.comparison.map((row) => el("tr", { "data-figure": row.figure }, el("td", {}, row.label),
    el("td", {}, row.measured_text), el("td", {}, row.predicted_text))));
  lossChart(d);
}

function lossChart(d) {
  const steps = [...new Set([...d.loss.map((p) => p[0]), ...d.eval_loss.map((p) => p[0])])].sort((a, b) => a - b);
  const train = new Map(d.loss), evals = new Map(d.eval_loss);
  const data = [steps, steps.map((s) => train.get(s) ?? null), steps.map((s) => evals.get(s) ?? null)];
  const target = $("#chart-loss");
  if (lossPlot && lossPlot.runName === d.name) { lossPlot.setData(data); return; }
  target.replaceChildren();
  lossPlot = new uPlot({
    width: 640, height: 260, scales: { x: { time: false } },
    series: [{ label: "step" }, { label: "loss", stroke: COLORS[0], spanGaps: true }, { label: "eval loss", stroke: COLORS[1], spanGaps: true, points: { size: 6 } }],
  }, data, target);
  lossPlot.runName = d.name;
}

function benchCell(column, value) {
  if (value == null) return "";
  if (column.startsWith("mfu")) return num(value, 3);
  if (column.endsWith("_per_s")) return num(value, 0);
  if (column.endsWith("_bytes")) return gib(value);
  return String(value);
}

async function selectBench(name) {
  selectedBench = name;
  const { rows } = await api(`/api/bench?name=${encodeURIComponent(name)}`);
  $("#bench-detail").hidden = false;
  const cols = rows.length ? Object.keys(rows[0]) : [];
  $("#bench-table thead").replaceChildren(el("tr", {}, ...cols.map((c) => el("th", {}, c.replace(/_/g, " ")))));
  $("#bench-table tbody").replaceChildren(...rows.map((r) => el("tr", {}, ...cols.map((c) => el("td", {}, benchCell(c, r[c]))))));
  const xs = rows.map((_, i) => i);
  const target = $("#chart-bench");
  target.replaceChildren();
  new uPlot({
    width: 640, height: 260, scales: { x: { time: false }, mfu: { range: [0, 1] } },
    axes: [{ values: (u, s) => s.map((i) => (rows[i] ? rows[i].label || `#${rows[i].id}` : "")) }, { label: "tokens/s" }, { side: 1, scale: "mfu", label: "MFU", grid: { show: false } }],
    series: [{ label: "point" }, { label: "tokens/s", stroke: COLORS[0], points: { size: 8 } }, { label: "MFU", scale: "mfu", stroke: COLORS[1], points: { size: 8 } }],
  }, [xs, rows.map((r) => r.tokens_nonpad_per_s), rows.map((r) => r.mfu_useful ?? r.mfu)], target);
}

// ---- Try it ----
async function submitTry(event) {
  event.preventDefault();
  const f = $("#try-form");
  $("#try-error").textContent = "";
  $("#try-tuned").textContent = "…";
  $("#try-base").textContent = f.elements.base.checked ? "…" : "";
  $("#try-submit").disabled = true;
  try {
    const out = await api("/api/generate", {
      run: f.elements.run.value, prompt: f.elements.prompt.value, max_new_tokens: Number(f.elements.max_new_tokens.value),
      temperature: Number(f.elements.temperature.value), base: f.elements.base.checked,
    });
    $("#try-tuned").textContent = out.tuned;
    $("#try-base").textContent = out.base ?? "";
  } catch (e) {
    $("#try-error").textContent = e.message;
    $("#try-tuned").textContent = "";
    $("#try-base").textContent = "";
  } finally {
    $("#try-submit").disabled = false;
  }
}

// ---- Start a run ----
async function submitStart(event) {
  event.preventDefault();
  $("#start-error").textContent = "";
  try {
    await api("/api/start", { config: $("#start-config").value, overrides: $("#start-overrides").value.split("\n") });
    await refreshRuns();
  } catch (e) {
    $("#start-error").textContent = e.message;
  }
}

function showJobs(jobs) {
  $("#jobs").replaceChildren(...jobs.slice().reverse().map((j) => el("div", { class: "job", "data-job": j.id },
    el("code", {}, j.command), el("div", {}, j.running ? "running " : `ended, exit status ${j.exit_status} `,
      j.running ? el("button", { onclick: () => api("/api/stop", { id: j.id }).then(refreshRuns) }, "Stop (Ctrl-C)") : "",
      " ", el("a", { href: "#", onclick: (e) => { e.preventDefault(); showTab("runs"); selectRun(j.run); } }, j.run)),
    el("pre", {}, j.output))));
}

document.addEventListener("DOMContentLoaded", async () => {
  for (const t of document.querySelectorAll(".tab")) t.addEventListener("click", () => showTab(t.dataset.tab));
  $("#plan-form").addEventListener("submit", submitPlan);
  $("#try-form").addEventListener("submit", submitTry);
  $("#start-form").addEventListener("submit", submitStart);
  showTab("plan");
  await loadChoices();
  // A running run's page follows its metrics.jsonl: one request a second while the Runs or Start tab is shown.
  setInterval(() => {
    if (!$("#runs").hidden || !$("#start").hidden) { refreshRuns(); refreshRun(); }
  }, 1000);
});
